"""Other client protocols over the one chat-completions path: run a translated call, get chat chunks back.

A protocol module (:mod:`swarm.gateway.responses_api`, :mod:`swarm.gateway.messages_api`) turns its
request into a :class:`~swarm.gateway.schemas.ChatCompletionRequest`; :func:`run_chat` prepares,
generates and stores it exactly as ``/v1/chat/completions`` does (episode key, prefix-consistent
prompt ids, constraints, group commit, ``Idempotency-Key`` replay) and hands back OpenAI chat
completion *chunks* (dicts). A non-streamed call is cut into the same chunks, so each protocol has
one :class:`Translator` for its JSON body and its event stream alike.

It does not parse or format any protocol's own shapes; that is the protocol modules' job.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from swarm.gateway.calls import complete, prepare_chat, replayed, stored_call
from swarm.gateway.openai_format import chat_chunk, chat_logprobs, chat_message, usage
from swarm.gateway.schemas import ChatCompletionRequest
from swarm.gateway.state import GatewayState
from swarm.gateway.streaming import as_api_error, chat_chunks, choice_end, close, open_stream
from swarm.policy.base import Generation
from swarm.records import Step
from swarm.web.auth import Caller
from swarm.web.errors import ApiError

__all__ = ["ChatRun", "Translator", "run_chat", "sse_frame", "translated_events", "collect"]

@dataclass
class ChatRun:
    """One chat call under way: its id (the steps' ``response_id``), sizes, and its chunks."""

    cid: str
    created: int
    model: str
    episode_id: str
    prompt_tokens: int
    chunks: AsyncIterator[dict[str, Any]]
    replayed: bool = False


class Translator(Protocol):
    """Turns chat chunks into one protocol's events, collecting its final body on the way."""

    def start(self) -> list[dict[str, Any]]: ...
    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]: ...
    def end(self) -> list[dict[str, Any]]: ...
    def body(self) -> dict[str, Any]: ...
    def error(self, err: ApiError) -> dict[str, Any]: ...


def renamed(err: ApiError, params: dict[str, str]) -> ApiError:
    """``err`` with a chat parameter name (``max_tokens``, ``messages.3``...) replaced by the protocol's."""
    for chat, own in params.items():
        if err.param is not None and (err.param == chat or err.param.startswith(chat + ".")):
            msg = own + err.message[len(chat):] if err.message.startswith(chat) else err.message
            return ApiError(err.status, msg, code=err.code, param=own, type=err.type)
    return err


async def _result_chunks(cid: str, created: int, model: str, gens: list[Generation], steps: list[Step],
                         logprobs: list[dict[str, Any] | None], replay: bool) -> AsyncIterator[dict[str, Any]]:
    """A finished call as the chunks a stream of it would have sent (text, tool calls, finish, usage)."""
    for i, (g, s) in enumerate(zip(gens, steps, strict=True)):
        yield chat_chunk(cid, created, model, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}])
        for chunk in choice_end(cid, created, model, i, chat_message(g, s.tool_calls).get("content") or "",
                                logprobs[i], g, s, **({"replayed": True} if replay else {})):
            yield chunk
    yield chat_chunk(cid, created, model, [], usage=usage(gens))


async def run_chat(state: GatewayState, caller: Caller, body: ChatCompletionRequest, *, cid: str, protocol: str,
                   key: str | None, params: dict[str, str], max_tokens_ceiling: int | None = None,
                   metadata: dict[str, Any] | None = None) -> ChatRun:
    """Run ``body`` through the chat path (streamed if ``body.stream``); every refusal is raised here, before any chunk.

    ``cid`` becomes the steps' ``response_id`` (the id the protocol shows its client); ``protocol`` is
    recorded in each step's ``metadata.protocol`` (with ``metadata``); ``params`` renames chat parameters in errors.
    ``max_tokens_ceiling`` (with ``body.max_tokens`` unset): sample at most that many tokens, or fewer
    when less room is left in the context or under the gateway's cap, instead of refusing the call.
    """
    assert caller.episode_id is not None
    if key is not None:
        steps = await stored_call(state, caller.episode_id, key, "chat")
        if steps:
            first = steps[0]
            return ChatRun(first.metadata.get("call_id", first.step_id), int(first.created_at), first.policy,
                           first.episode_id, len(first.prompt_ids),
                           _result_chunks(first.metadata.get("call_id", first.step_id), int(first.created_at),
                                          first.policy, replayed(steps), steps, [None] * len(steps), True),
                           replayed=True)
    try:
        plan = await prepare_chat(state, caller, body)
    except ApiError as err:
        raise renamed(err, params) from err
    plan.cid, plan.idempotency_key, plan.include_usage = cid, key, True
    plan.metadata = {"protocol": protocol, **(metadata or {})}
    if max_tokens_ceiling is not None:
        room = state.backend.max_context(plan.policy) - len(plan.prompt.prompt_ids)
        most = min(max_tokens_ceiling, room, state.settings.max_tokens_cap)
        plan.request = dataclasses.replace(plan.request, sampling=dataclasses.replace(plan.request.sampling,
                                                                                      max_tokens=most))
    prompt_tokens = len(plan.prompt.prompt_ids)
    if body.stream:
        first, it = await open_stream(state, plan)
        return ChatRun(cid, plan.created, plan.policy, caller.episode_id, prompt_tokens,
                       chat_chunks(state, plan, first, it))
    gens, steps = await complete(state, plan)
    cid = steps[0].metadata.get("call_id", cid)  # another when a concurrent repeat stored first: its reply
    lps = [chat_logprobs(state.backend, plan.policy, g.response_ids, g.logprobs, g.top_logprobs, g.logprobs_content)
           if plan.want_logprobs else None for g in gens]
    return ChatRun(cid, plan.created, plan.policy, caller.episode_id, prompt_tokens,
                   _result_chunks(cid, plan.created, plan.policy, gens, steps, lps, False))


def sse_frame(event: dict[str, Any]) -> bytes:
    """One server-sent event named by its ``type`` (both the Responses and the Messages streams do so)."""
    return f"event: {event['type']}\ndata: ".encode() + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


async def translated_events(tr: Translator, run: ChatRun) -> AsyncIterator[bytes]:
    """The protocol's SSE stream for ``run``; a failure after the headers went out is an in-band error event."""
    try:
        for ev in tr.start():
            yield sse_frame(ev)
        async for chunk in run.chunks:
            for ev in tr.feed(chunk):
                yield sse_frame(ev)
        for ev in tr.end():
            yield sse_frame(ev)
    except Exception as exc:  # headers are out: report in-band
        yield sse_frame(tr.error(as_api_error(exc)))
    finally:
        await close(run.chunks)


async def collect(tr: Translator, run: ChatRun) -> dict[str, Any]:
    """The protocol's JSON body for a non-streamed ``run``."""
    tr.start()
    async for chunk in run.chunks:
        tr.feed(chunk)
    tr.end()
    return tr.body()
