"""``POST /v1/responses``: OpenAI's Responses API, run through the chat completions path.

Same auth (the episode api key as bearer token), the same recording (one step per call, exact
ids and logprobs, ``metadata.protocol: "responses"``, the Response ``id`` as the step's
``response_id``), prefix consistency across turns, the same ``Idempotency-Key`` replay, errors in
OpenAI's shape. ``previous_response_id`` reads the named response back from the pool. Translation:
:mod:`swarm.gateway.responses_api`; generation and storage: :mod:`swarm.gateway.bridge`.
There is no ``GET /v1/responses/{id}``.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from swarm.errors import NotFoundError
from swarm.gateway.bridge import collect, run_chat, translated_events
from swarm.gateway.responses_api import PARAMS, ResponsesRequest, ResponsesTranslator, history_of, to_chat
from swarm.gateway.routes_openai import idempotency_key
from swarm.gateway.state import GatewayState, State
from swarm.gateway.streaming import sse_response
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.state import episode_caller

__all__ = ["router"]

router = APIRouter(tags=["openai"])

def _metadata(body: ResponsesRequest) -> dict[str, Any]:
    """What each step records about the request beyond the chat call (whether instructions made its system message)."""
    chained = {"previous_response_id": body.previous_response_id} if body.previous_response_id else {}
    return {"instructions": bool(body.instructions), **chained}


async def _previous(state: GatewayState, caller: Caller, response_id: str) -> list[dict[str, Any]]:
    """The conversation ``previous_response_id`` names: a response of the caller's own episode (else a 404)."""
    try:
        step = await state.db(state.lookup.get_step_by_response_id, response_id, with_tokens=False)
    except NotFoundError:
        step = None
    if step is None or step.episode_id != caller.episode_id:
        raise ApiError(404, f"previous_response_id: no response {response_id!r} in this episode",
                       param="previous_response_id", code="not_found")
    return history_of(step)


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request, caller: Caller = Depends(episode_caller),
                          state: GatewayState = Depends(State)) -> Any:
    """OpenAI Responses API; ``model`` picks the policy, ``stream`` picks SSE ``response.*`` events."""
    key = idempotency_key(request)
    history = await _previous(state, caller, body.previous_response_id) if body.previous_response_id else None
    run = await run_chat(state, caller, to_chat(body, history), cid=f"resp_{uuid.uuid4().hex}", protocol="responses",
                         key=key, params=PARAMS, metadata=_metadata(body))
    tr = ResponsesTranslator(body, run)
    if body.stream:
        return sse_response(translated_events(tr, run))
    return JSONResponse(await collect(tr, run))
