"""Server-sent events for ``stream: true``: real incremental chunks from the backend's ``stream()``.

Chunks go out as the backend samples tokens. The step(s) are stored when every choice has
finished and *before* the closing chunks (``finish_reason`` and ``swarm: {step_id, ...}``), the
optional usage chunk (``choices: []``) and ``data: [DONE]``: a client that saw the end of the
stream has an acknowledged step.

With tools, text from a tool-call marker (``<tool_call>``) on is held back, and so is trailing
whitespace, because the backend parses tool calls out of the text only at the end: the streamed
content then equals the final content and the calls arrive as one ``tool_calls`` delta. An
error after the first chunk is sent as an SSE ``{"error": ...}`` event (the status is already
200). This module does not retry or buffer whole responses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from swarm.errors import SwarmError
from swarm.gateway.calls import CallPlan, finalize, store
from swarm.gateway.openai_format import (
    chat_chunk,
    chat_logprobs,
    completion_chunk,
    completion_logprobs,
    usage,
)
from swarm.gateway.state import GatewayState
from swarm.policy.base import Generation, TokenDelta
from swarm.web.errors import ApiError, error_body, from_swarm_error

__all__ = ["open_stream", "chat_events", "chat_chunks", "completion_events", "Holdback"]

log = logging.getLogger("swarm.gateway")


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


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
    except (SwarmError, ApiError):
        raise
    except Exception as exc:
        raise ApiError(502, f"the inference backend failed: {type(exc).__name__}: {exc}",
                       type="backend_error", code="backend_error") from exc
    return first, it


async def _items(first: Any, it: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in it:
        yield item


def _error_event(exc: BaseException) -> bytes:
    if isinstance(exc, ApiError):
        return _sse(error_body(exc.message, exc.type, exc.param, exc.code))
    if isinstance(exc, SwarmError):
        e = from_swarm_error(exc)
        return _sse(error_body(e.message, e.type, e.param, e.code))
    log.exception("stream failed", exc_info=exc)
    return _sse(error_body(f"stream failed: {type(exc).__name__}", "server_error"))


def _swarm(steps: list, i: int) -> dict[str, Any]:
    s = steps[i]
    return {"step_id": s.step_id, "policy_version": s.policy_version, "prefix_consistent": s.prefix_consistent}


async def _close(it: AsyncIterator[Any]) -> None:
    """Close the backend's stream (stops sampling for a client that went away)."""
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # the backend's cleanup must not mask the response
            log.debug("backend stream close failed", exc_info=True)


async def chat_events(state: GatewayState, plan: CallPlan, first: Any, it: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """The chat stream as SSE bytes: :func:`chat_chunks`, then ``[DONE]``; a failure is an in-band error event."""
    chunks = chat_chunks(state, plan, first, it)
    try:
        async for chunk in chunks:
            yield _sse(chunk)
        yield b"data: [DONE]\n\n"
    except Exception as exc:  # headers are out: report in-band
        yield _error_event(exc)
    finally:
        await chunks.aclose()


async def chat_chunks(state: GatewayState, plan: CallPlan, first: Any, it: AsyncIterator[Any]) -> AsyncIterator[dict]:
    """Chat completion chunks (dicts) as the backend samples; the steps are stored before the closing chunks.

    Raises on failure (the caller reports it in its protocol's shape); other protocols translate these chunks.
    """
    cid, created, model, n = plan.cid, plan.created, plan.policy, plan.request.sampling.n
    own = getattr(state.backend, "tool_call_markers", None)  # the policy's tool parser (model.tool_parser)
    markers = (state.settings.tool_call_markers + (tuple(own(plan.policy)) if own else ())) if plan.request.tools else ()
    holds = [Holdback(markers) for _ in range(n)]
    gens: list[Generation] = []
    try:
        for i in range(n):
            yield chat_chunk(cid, created, model, [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
        async for item in _items(first, it):
            if isinstance(item, TokenDelta):
                text = holds[item.index].push(item.text) if 0 <= item.index < n else ""
                lp = (chat_logprobs(state.backend, model, item.token_ids, item.logprobs, item.top_logprobs,
                                    item.logprobs_content) if plan.want_logprobs else None)
                if text or lp:
                    yield chat_chunk(cid, created, model, [
                        {"index": item.index, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}])
            elif isinstance(item, Generation):
                gens.append(item)
        if len(gens) != n:
            raise ApiError(502, f"the backend finished {len(gens)} of {n} samples", type="backend_error")
        gens = finalize(gens, plan.tool_calls)
        steps = await store(state, plan, gens)
        for i, (g, s) in enumerate(zip(gens, steps, strict=True)):
            content = g.text or ""
            sent = holds[i].sent
            rest = content[len(sent):] if content.startswith(sent) else ""
            if rest:
                yield chat_chunk(cid, created, model, [
                    {"index": i, "delta": {"content": rest}, "logprobs": None, "finish_reason": None}])
            if s.tool_calls:
                calls = [{"index": k, **c} for k, c in enumerate(s.tool_calls)]
                yield chat_chunk(cid, created, model, [
                    {"index": i, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}])
            finish = "tool_calls" if s.tool_calls else (g.finish_reason if g.finish_reason == "length" else "stop")
            yield chat_chunk(cid, created, model, [
                {"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}], swarm=_swarm(steps, i))
        if plan.include_usage:
            yield chat_chunk(cid, created, model, [],
                             usage=usage(len(gens[0].prompt_ids), sum(len(g.response_ids) for g in gens)))
    finally:
        await _close(it)


async def completion_events(state: GatewayState, plan: CallPlan, first: Any,
                            it: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    cid, created, model, n = plan.cid, plan.created, plan.policy, plan.request.sampling.n
    gens: list[Generation] = []
    sent = [""] * n
    try:
        async for item in _items(first, it):
            if isinstance(item, TokenDelta):
                lp = (completion_logprobs(state.backend, model, item.token_ids, item.logprobs,
                                          tops=item.top_logprobs) if plan.want_logprobs else None)
                if 0 <= item.index < n:
                    sent[item.index] += item.text
                if item.text or lp:
                    yield _sse(completion_chunk(cid, created, model, [
                        {"index": item.index, "text": item.text, "logprobs": lp, "finish_reason": None}]))
            elif isinstance(item, Generation):
                gens.append(item)
        if len(gens) != n:
            raise ApiError(502, f"the backend finished {len(gens)} of {n} samples", type="backend_error")
        steps = await store(state, plan, gens)
        for i, g in enumerate(gens):
            rest = g.text[len(sent[i]):] if g.text.startswith(sent[i]) else ""
            yield _sse(completion_chunk(cid, created, model, [
                {"index": i, "text": rest, "logprobs": None,
                 "finish_reason": "length" if g.finish_reason == "length" else "stop"}], swarm=_swarm(steps, i)))
        if plan.include_usage:
            yield _sse(completion_chunk(cid, created, model, [],
                                        usage=usage(len(gens[0].prompt_ids), sum(len(g.response_ids) for g in gens))))
        yield b"data: [DONE]\n\n"
    except Exception as exc:  # headers are out: report in-band
        yield _error_event(exc)
    finally:
        await _close(it)
