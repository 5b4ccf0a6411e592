"""OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``.

Auth is the episode api key. Streaming is decided by the body's ``stream`` field only (clients
send ``Accept: application/json`` even when streaming). Each call stores one step per choice
before it is answered (see :mod:`swarm.gateway.calls`); the response adds
``swarm: {step_id, step_ids, policy_version, prefix_consistent}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, StreamingResponse

from swarm.gateway.auth import Caller
from swarm.gateway.calls import CallPlan, generate, prepare_chat, prepare_completion, store
from swarm.gateway.deps import State, episode_caller
from swarm.gateway.openai_format import chat_logprobs, chat_response, completion_logprobs, completion_response
from swarm.gateway.schemas import ChatCompletionRequest, CompletionRequest
from swarm.gateway.state import GatewayState
from swarm.gateway.streaming import chat_events, completion_events, open_stream

__all__ = ["router"]

router = APIRouter(tags=["openai"])

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
async def chat_completions(body: ChatCompletionRequest, caller: Caller = Depends(episode_caller),
                           state: GatewayState = Depends(State)) -> Any:
    """OpenAI chat completions; ``model`` picks the policy."""
    plan = await prepare_chat(state, caller, body)
    if body.stream:
        first, it = await open_stream(state, plan)
        return StreamingResponse(chat_events(state, plan, first, it), media_type="text/event-stream",
                                 headers=_SSE_HEADERS)
    gens = await generate(state, plan)
    steps = await store(state, plan, gens)
    lps = [chat_logprobs(state.backend, plan.policy, g.response_ids, g.logprobs, g.top_logprobs, g.logprobs_content)
           if plan.want_logprobs else None for g in gens]
    return JSONResponse(chat_response(plan.cid, plan.created, plan.policy, gens, [s.tool_calls for s in steps], lps,
                                      _swarm(plan, steps)))


@router.post("/v1/completions")
async def completions(body: CompletionRequest, caller: Caller = Depends(episode_caller),
                      state: GatewayState = Depends(State)) -> Any:
    """OpenAI (legacy) text completions over one prompt (text or token ids)."""
    plan = await prepare_completion(state, caller, body)
    if body.stream:
        first, it = await open_stream(state, plan)
        return StreamingResponse(completion_events(state, plan, first, it), media_type="text/event-stream",
                                 headers=_SSE_HEADERS)
    gens = await generate(state, plan)
    steps = await store(state, plan, gens)
    lps = [completion_logprobs(state.backend, plan.policy, g.response_ids, g.logprobs, tops=g.top_logprobs)
           if plan.want_logprobs else None for g in gens]
    return JSONResponse(completion_response(plan.cid, plan.created, plan.policy, gens, lps, _swarm(plan, steps)))
