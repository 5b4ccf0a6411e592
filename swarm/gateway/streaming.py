"""Server-sent events for ``stream: true``: real incremental chunks from the backend's ``stream()``.

Chunks go out as the backend samples tokens. The step(s) are stored when every choice has
finished and *before* the closing chunks (``finish_reason`` and ``swarm: {step_id, ...}``), the
optional usage chunk (``choices: []``) and ``data: [DONE]``: a client that saw the end of the
stream has an acknowledged step.

With tools, text from a tool-call marker (``<tool_call>``) on is held back, and so is trailing
whitespace, because the backend parses tool calls out of the text only at the end: the streamed
content then equals the final content and the calls arrive as one ``tool_calls`` delta. An
error after the first chunk is sent as an SSE ``{"error": ...}`` event (the status is already
200). :func:`sampled` is the one scaffold of every stream (``/v1/chat/completions``, ``/v1/completions``
and, through :mod:`swarm.gateway.bridge`, ``/v1/responses`` and ``/v1/messages``): collect the backend's
items, check one generation per choice, finalize, store; :func:`open_stream` opens and :func:`close` closes
the backend's stream. This module does not retry or buffer whole responses.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from swarm.errors import SwarmError
from swarm.gateway.calls import CallPlan, finalize, store
from swarm.gateway.openai_format import chat_chunk, chat_logprobs, completion_chunk, completion_logprobs, usage
from swarm.gateway.state import GatewayState
from swarm.policy.base import Generation, TokenDelta
from swarm.records import Step
from swarm.web.errors import ApiError, error_body, from_swarm_error

__all__ = ["SSE_HEADERS", "EventStream", "sse_response", "as_api_error", "swarm_fields", "open_stream", "sampled", "close",
           "events", "chat_chunks", "choice_end", "completion_chunks", "Holdback"]

log = logging.getLogger("swarm.gateway")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class EventStream(StreamingResponse):
    """Starlette's streaming response, its client watched by one plain asyncio task.

    Starlette runs the body and a disconnect listener as two tasks of an anyio task group per response (the profile's
    "thread hops" row of a streamed call, docs/gateway.md "Writes on the event loop"); here the body runs in the
    request's own task and the listener, a plain task, cancels it when the client goes. A gone client still stops the
    stream, and with it the backend's sampling, at once: also while text is held back and nothing is being sent.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.background is not None:
            return await super().__call__(scope, receive, send)
        me = asyncio.current_task()
        assert me is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            try:
                while (await receive())["type"] != "http.disconnect":
                    pass
            except Exception:  # noqa: BLE001 - the stream goes on, unwatched
                log.warning("watching a streamed response's client failed", exc_info=True)
                return
            if not me.cancelling():  # a cancellation already under way (the server's shutdown) goes on as it is
                gone = True
                me.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone or me.uncancel():  # the server's own cancellation (shutdown), alone or beside ours, goes on
                raise
        finally:
            watcher.cancel()


def sse_response(events: AsyncIterator[bytes] | Iterator[bytes]) -> StreamingResponse:
    """``events`` as a ``text/event-stream`` response that no cache or proxy holds back."""
    return EventStream(events, media_type="text/event-stream", headers=SSE_HEADERS)


def as_api_error(exc: BaseException) -> ApiError:
    """Any failure as an :class:`ApiError` (an unexpected one is logged and becomes a 500)."""
    if isinstance(exc, SwarmError):
        return from_swarm_error(exc)
    log.error("call failed", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}", type="server_error")


def swarm_fields(s: Step, **extra: Any) -> dict[str, Any]:
    """The ``swarm`` object of a response or closing chunk: which step recorded the choice."""
    return {"step_id": s.step_id, "policy_version": s.policy_version, "prefix_consistent": s.prefix_consistent, **extra}


class Holdback:
    """Streams text but keeps back what may still become a tool call or be stripped at the end."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self.markers = markers
        self.buf = ""
        self.sent = ""

    def push(self, text: str) -> str:
        self.buf += text
        safe = self.buf
        for m in self.markers:
            at = safe.find(m)
            if at >= 0:
                safe = safe[:at]
        for m in self.markers:  # a suffix that may grow into a marker
            for k in range(min(len(m) - 1, len(safe)), 0, -1):
                if safe.endswith(m[:k]):
                    safe = safe[:-k]
                    break
        safe = safe.rstrip()
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        out, self.sent = safe[len(self.sent):], safe
        return out


async def open_stream(state: GatewayState, plan: CallPlan) -> tuple[Any, AsyncIterator[Any]]:
    """Start the backend stream and wait for its first item, so early failures are proper 4xx/5xx."""
    it = state.backend.stream(plan.request).__aiter__()
    try:
        first = await it.__anext__()
    except StopAsyncIteration:
        raise ApiError(502, "the inference backend returned no completion", type="backend_error") from None
    except SwarmError:
        raise
    except Exception as exc:  # a backend's own failure of any kind is a 502 to the client, never a 500
        raise ApiError(502, f"the inference backend failed: {type(exc).__name__}: {exc}",
                       type="backend_error", code="backend_error") from exc
    return first, it


async def _items(first: Any, it: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in it:
        yield item


async def sampled(state: GatewayState, plan: CallPlan, first: Any,
                  it: AsyncIterator[Any]) -> AsyncIterator[TokenDelta | tuple[list[Generation], list[Step]]]:
    """The backend's token deltas as they come, then ``(generations, steps)`` once every choice is stored.

    The generations are finalized (:func:`~swarm.gateway.calls.finalize`) and stored before the last item, so
    whatever the caller sends after it is acknowledged; the caller closes ``it`` (:func:`close`).
    """
    gens: list[Generation] = []
    async for item in _items(first, it):
        if isinstance(item, TokenDelta):
            yield item
        elif isinstance(item, Generation):
            gens.append(item)
    if len(gens) != plan.request.sampling.n:
        raise ApiError(502, f"the backend finished {len(gens)} of {plan.request.sampling.n} samples",
                       type="backend_error")
    gens = finalize(gens, plan.tool_calls)
    yield gens, await store(state, plan, gens)


async def close(it: AsyncIterator[Any]) -> None:
    """Close the backend's stream (stops sampling for a client that went away)."""
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # the backend's cleanup must not mask the response
            log.debug("backend stream close failed", exc_info=True)


async def events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """OpenAI chunks as SSE bytes, then ``[DONE]``; a failure is an in-band error event (headers are out)."""
    try:
        async for chunk in chunks:
            yield _sse(chunk)
        yield b"data: [DONE]\n\n"
    except Exception as exc:  # headers are out: report in-band
        e = as_api_error(exc)
        yield _sse(error_body(e.message, e.type, e.param, e.code))
    finally:
        await close(chunks)


def choice_end(cid: str, created: int, model: str, i: int, text: str, logprobs: dict[str, Any] | None,
               g: Generation, s: Step, **swarm: Any) -> Iterator[dict[str, Any]]:
    """The closing chunks of choice ``i``: content not streamed yet, its tool calls, its finish with ``swarm``."""
    if text or logprobs:
        yield chat_chunk(cid, created, model, [{"index": i, "delta": {"content": text}, "logprobs": logprobs,
                                                "finish_reason": None}])
    if s.tool_calls:
        calls = [{"index": k, **c} for k, c in enumerate(s.tool_calls)]
        yield chat_chunk(cid, created, model, [{"index": i, "delta": {"tool_calls": calls}, "logprobs": None,
                                                "finish_reason": None}])
    finish = "tool_calls" if s.tool_calls else ("length" if g.finish_reason == "length" else "stop")
    yield chat_chunk(cid, created, model, [{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}],
                     swarm=swarm_fields(s, **swarm))


async def chat_chunks(state: GatewayState, plan: CallPlan, first: Any, it: AsyncIterator[Any]) -> AsyncIterator[dict]:
    """Chat completion chunks (dicts) as the backend samples; the steps are stored before the closing chunks.

    Raises on failure (the caller reports it in its protocol's shape); other protocols translate these chunks.
    """
    cid, created, model, n = plan.cid, plan.created, plan.policy, plan.request.sampling.n
    own = getattr(state.backend, "tool_call_markers", None)  # the policy's tool parser (model.tool_parser)
    markers = (state.settings.tool_call_markers + (tuple(own(plan.policy)) if own else ())) if plan.request.tools else ()
    holds = [Holdback(markers) for _ in range(n)]
    try:
        for i in range(n):
            yield chat_chunk(cid, created, model, [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        async for item in sampled(state, plan, first, it):
            if isinstance(item, TokenDelta):
                text = holds[item.index].push(item.text) if 0 <= item.index < n else ""
                lp = (chat_logprobs(state.backend, model, item.token_ids, item.logprobs, item.top_logprobs,
                                    item.logprobs_content) if plan.want_logprobs else None)
                if text or lp:
                    yield chat_chunk(cid, created, model, [
                        {"index": item.index, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}])
                continue
            gens, steps = item
            for i, (g, s) in enumerate(zip(gens, steps, strict=True)):
                content, sent = g.text or "", holds[i].sent
                for chunk in choice_end(cid, created, model, i, content[len(sent):] if content.startswith(sent)
                                        else "", None, g, s):
                    yield chunk
            if plan.include_usage:
                yield chat_chunk(cid, created, model, [], usage=usage(gens))
    finally:
        await close(it)


async def completion_chunks(state: GatewayState, plan: CallPlan, first: Any,
                            it: AsyncIterator[Any]) -> AsyncIterator[dict]:
    """Text completion chunks (dicts) as the backend samples; the steps are stored before the closing chunks."""
    cid, created, model, n = plan.cid, plan.created, plan.policy, plan.request.sampling.n
    sent = [""] * n
    try:
        async for item in sampled(state, plan, first, it):
            if isinstance(item, TokenDelta):
                lp = (completion_logprobs(state.backend, model, item.token_ids, item.logprobs,
                                          tops=item.top_logprobs) if plan.want_logprobs else None)
                if 0 <= item.index < n:
                    sent[item.index] += item.text
                if item.text or lp:
                    yield completion_chunk(cid, created, model, [
                        {"index": item.index, "text": item.text, "logprobs": lp, "finish_reason": None}])
                continue
            gens, steps = item
            for i, (g, s) in enumerate(zip(gens, steps, strict=True)):
                yield completion_chunk(cid, created, model, [
                    {"index": i, "text": g.text[len(sent[i]):] if g.text.startswith(sent[i]) else "", "logprobs": None,
                     "finish_reason": "length" if g.finish_reason == "length" else "stop"}], swarm=swarm_fields(s))
            if plan.include_usage:
                yield completion_chunk(cid, created, model, [], usage=usage(gens))
    finally:
        await close(it)
