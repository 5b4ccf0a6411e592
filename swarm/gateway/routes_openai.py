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

import json
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarm.gateway.calls import CallPlan, generate, prepare_chat, prepare_completion, replayed, store, stored_call
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
from swarm.gateway.streaming import chat_events, completion_events, open_stream
from swarm.web.auth import Caller
from swarm.web.deps import episode_caller
from swarm.web.errors import ApiError

__all__ = ["router"]

router = APIRouter(tags=["openai"])

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
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


async def _replay(state: GatewayState, caller: Caller, key: str | None, kind: str, stream: bool,
                  include_usage: bool) -> Any:
    """The stored answer of an earlier call with this Idempotency-Key, or None."""
    if key is None or caller.episode_id is None:
        return None
    steps = await stored_call(state, caller.episode_id, key, kind)
    if not steps:
        return None
    gens = replayed(steps)
    first = steps[0]
    cid, created, policy = first.metadata.get("call_id", first.step_id), int(first.created_at), first.policy
    swarm = {"step_id": first.step_id, "step_ids": [s.step_id for s in steps], "policy_version": first.policy_version,
             "prefix_consistent": first.prefix_consistent, "episode_id": first.episode_id, "replayed": True}
    calls = [s.tool_calls for s in steps]
    if kind == "chat":
        body = chat_response(cid, created, policy, gens, calls, [None] * len(gens), swarm)
    else:
        body = completion_response(cid, created, policy, gens, [None] * len(gens), swarm)
    if not stream:
        return JSONResponse(body)

    def events() -> Iterator[bytes]:
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
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        if include_usage:
            make = chat_chunk if kind == "chat" else completion_chunk
            tail = make(cid, created, policy, [], usage=usage(len(gens[0].prompt_ids),
                                                               sum(len(g.response_ids) for g in gens)))
            yield f"data: {json.dumps(tail)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=_SSE_HEADERS)


def _swarm(plan: CallPlan, steps: list) -> dict[str, Any]:
    return {
        "step_id": steps[0].step_id,
        "step_ids": [s.step_id for s in steps],
        "policy_version": steps[0].policy_version,
        "prefix_consistent": steps[0].prefix_consistent,
        "episode_id": plan.episode.episode_id,
    }


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
    key = idempotency_key(request)
    usage_too = bool(body.stream_options and body.stream_options.include_usage)
    done = await _replay(state, caller, key, "chat", bool(body.stream), usage_too)
    if done is not None:
        return done
    plan = await prepare_chat(state, caller, body)
    plan.idempotency_key = key
    if body.stream:
        first, it = await open_stream(state, plan)
        return StreamingResponse(chat_events(state, plan, first, it), media_type="text/event-stream",
                                 headers=_SSE_HEADERS)
    gens = await generate(state, plan)
    steps = await store(state, plan, gens)
    if steps[0].metadata.get("call_id") != plan.cid:  # a concurrent repeat stored first: answer with its reply
        first = await _replay(state, caller, key, "chat", False, usage_too)
        if first is not None:
            return first
    lps = [chat_logprobs(state.backend, plan.policy, g.response_ids, g.logprobs, g.top_logprobs, g.logprobs_content)
           if plan.want_logprobs else None for g in gens]
    return JSONResponse(chat_response(plan.cid, plan.created, plan.policy, gens, [s.tool_calls for s in steps], lps,
                                      _swarm(plan, steps)))


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, caller: Caller = Depends(episode_caller),
                      state: GatewayState = Depends(State)) -> Any:
    """OpenAI (legacy) text completions over one prompt (text or token ids)."""
    key = idempotency_key(request)
    usage_too = bool(body.stream_options and body.stream_options.include_usage)
    done = await _replay(state, caller, key, "completion", bool(body.stream), usage_too)
    if done is not None:
        return done
    plan = await prepare_completion(state, caller, body)
    plan.idempotency_key = key
    if body.stream:
        first, it = await open_stream(state, plan)
        return StreamingResponse(completion_events(state, plan, first, it), media_type="text/event-stream",
                                 headers=_SSE_HEADERS)
    gens = await generate(state, plan)
    steps = await store(state, plan, gens)
    if steps[0].metadata.get("call_id") != plan.cid:  # a concurrent repeat stored first: answer with its reply
        first = await _replay(state, caller, key, "completion", False, usage_too)
        if first is not None:
            return first
    lps = [completion_logprobs(state.backend, plan.policy, g.response_ids, g.logprobs, tops=g.top_logprobs)
           if plan.want_logprobs else None for g in gens]
    return JSONResponse(completion_response(plan.cid, plan.created, plan.policy, gens, lps, _swarm(plan, steps)))
