"""Client agreement for the C4 / C5 batching strategies: ``POST /v1/sync/agree`` and ``GET /v1/sync``.

Routes only: the agreements themselves live in the pool (:mod:`swarm.pool.agreements`), so a
client may agree through any gateway of a shared pool and the trainer sees it. An agreement counts
until the trainer takes it (an update fired on it). Once any token is configured both routes need a
credential (an episode api key, the client token or the admin token): else anyone could list the
clients and trigger a C4 update.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict

from swarm.gateway.state import GatewayState, State
from swarm.web.auth import Caller
from swarm.web.limits import Id
from swarm.web.state import sync_caller

__all__ = ["router"]

router = APIRouter(tags=["sync"])


class AgreeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    client_id: Id


async def _state_json(state: GatewayState) -> dict[str, Any]:
    active, agreed = await state.db(state.agreements.sync_clients)
    return {"active_clients": sorted(active), "agreed_clients": sorted(agreed)}


@router.post("/v1/sync/agree")
async def agree(body: AgreeIn, caller: Caller = Depends(sync_caller),
                state: GatewayState = Depends(State)) -> dict[str, Any]:
    """A client asks for an update now (C4: any active client suffices; C5: all must ask)."""
    await state.write(state.agreements.agree, body.client_id)
    return await _state_json(state)


@router.get("/v1/sync")
async def sync_state(caller: Caller = Depends(sync_caller), state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Active clients and the agreements not yet taken by an update, as the pool records them."""
    return await _state_json(state)
