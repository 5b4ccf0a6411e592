"""OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``.

Auth is the episode api key. Streaming is decided by the body's ``stream`` field only (clients
send ``Accept: application/json`` even when streaming). Each call stores one step per choice
before it is answered (see :mod:`swarm.gateway.calls`); the response adds
``swarm: {step_id, step_ids, policy_version, prefix_consistent}``.

Idempotent calls: with an ``Idempotency-Key`` header (OpenAI SDK: ``extra_headers``; the swarm SDK's
clients send one that stays the same across their retries) a call that repeats one this episode
already stored is answered from the stored steps (``swarm.replayed: true``), never recorded twice,
also when the first answer was lost (the gateway died after the commit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from swarm.gateway.calls import complete, prepare_chat, prepare_completion, replayed, stored_call
from swarm.gateway.openai_format import (
    chat_chunk,
    chat_logprobs,
    chat_message,
    chat_response,
    completion_chunk,
    completion_logprobs,
    completion_response,
    usage,
)
from swarm.gateway.schemas import ChatCompletionRequest, CompletionRequest
from swarm.gateway.state import GatewayState, State
from swarm.gateway.streaming import chat_chunks, completion_chunks, events, open_stream, sse_response, swarm_fields
from swarm.records import Step
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.state import episode_caller

__all__ = ["router"]

router = APIRouter(tags=["openai"])

MAX_IDEMPOTENCY_KEY = 256


def idempotency_key(request: Request) -> str | None:
    """The ``Idempotency-Key`` header: printable ASCII, at most 256 characters (else a 400)."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isascii() or not key.isprintable():
        raise ApiError(400, f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters",
                       param="Idempotency-Key", code="invalid_value")
    return key


def _answer(kind: str, steps: list[Step], stream: bool, include_usage: bool) -> Any:
    """The answer of a call already stored as ``steps`` (a repeat with its Idempotency-Key), as first sent."""
    gens, first = replayed(steps), steps[0]
    cid, created, policy = first.metadata.get("call_id", first.step_id), int(first.created_at), first.policy
    swarm = {**swarm_fields(first), "step_ids": [s.step_id for s in steps], "episode_id": first.episode_id,
             "replayed": True}
    calls = [s.tool_calls for s in steps]
    if kind == "chat":
        body = chat_response(cid, created, policy, gens, calls, [None] * len(gens), swarm)
    else:
        body = completion_response(cid, created, policy, gens, [None] * len(gens), swarm)
    if not stream:
        return JSONResponse(body)

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        for i, ch in enumerate(body["choices"]):
            if kind == "chat":
                delta = chat_message(gens[i], calls[i])
                if "tool_calls" in delta:
                    delta["tool_calls"] = [{"index": j, **c} for j, c in enumerate(delta["tool_calls"])]
                chunk = chat_chunk(cid, created, policy, [{"index": i, "delta": delta, "logprobs": None,
                                                          "finish_reason": ch["finish_reason"]}], swarm=swarm)
            else:
                chunk = completion_chunk(cid, created, policy, [{"index": i, "text": ch["text"], "logprobs": None,
                                                                "finish_reason": ch["finish_reason"]}], swarm=swarm)
            yield chunk
        if include_usage:
            yield (chat_chunk if kind == "chat" else completion_chunk)(cid, created, policy, [], usage=usage(gens))

    return sse_response(events(chunks()))


async def _call(kind: str, body: ChatCompletionRequest | CompletionRequest, request: Request, caller: Caller,
                state: GatewayState) -> Any:
    """One chat or completion call: a repeat's stored answer, else prepared, generated, stored and answered."""
    key = idempotency_key(request)
    usage_too = bool(body.stream_options and body.stream_options.include_usage)
    if key is not None and caller.episode_id is not None:
        steps = await stored_call(state, caller.episode_id, key, kind)
        if steps:
            return _answer(kind, steps, bool(body.stream), usage_too)
    chat = kind == "chat"
    plan = await (prepare_chat(state, caller, body) if chat else prepare_completion(state, caller, body))
    plan.idempotency_key = key
    if body.stream:
        first, it = await open_stream(state, plan)
        return sse_response(events((chat_chunks if chat else completion_chunks)(state, plan, first, it)))
    gens, steps = await complete(state, plan)
    if steps[0].metadata.get("call_id") != plan.cid:  # a concurrent repeat stored first: answer with its reply
        return _answer(kind, steps, False, usage_too)
    swarm = {**swarm_fields(steps[0]), "step_ids": [s.step_id for s in steps], "episode_id": plan.episode.episode_id}
    if chat:
        lps = [chat_logprobs(state.backend, plan.policy, g.response_ids, g.logprobs, g.top_logprobs,
                             g.logprobs_content) if plan.want_logprobs else None for g in gens]
        return JSONResponse(chat_response(plan.cid, plan.created, plan.policy, gens, [s.tool_calls for s in steps],
                                          lps, swarm))
    lps = [completion_logprobs(state.backend, plan.policy, g.response_ids, g.logprobs, tops=g.top_logprobs)
           if plan.want_logprobs else None for g in gens]
    return JSONResponse(completion_response(plan.cid, plan.created, plan.policy, gens, lps, swarm))


@router.get("/v1/models")
async def list_models(state: GatewayState = Depends(State)) -> dict[str, Any]:
    """The served policies, as OpenAI models."""
    return {"object": "list", "data": [
        {"id": p, "object": "model", "created": 0, "owned_by": "swarm", "version": state.backend.version(p)}
        for p in state.backend.policies()
    ]}


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, caller: Caller = Depends(episode_caller),
                           state: GatewayState = Depends(State)) -> Any:
    """OpenAI chat completions; ``model`` picks the policy."""
    return await _call("chat", body, request, caller, state)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, caller: Caller = Depends(episode_caller),
                      state: GatewayState = Depends(State)) -> Any:
    """OpenAI (legacy) text completions over one prompt (text or token ids)."""
    return await _call("completion", body, request, caller, state)
