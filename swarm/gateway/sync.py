"""Client agreement for the C4 / C5 batching strategies: ``POST /v1/sync/agree`` and ``GET /v1/sync``.

Clients are *active* while they opened an episode within ``active_window_s``; an agreement
counts until the trainer consumes it (:meth:`SyncBoard.take` after an update fires). Kept in
this gateway's memory: with several gateways, point the agreeing clients at the trainer's one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from swarm.gateway.auth import Caller
from swarm.gateway.deps import State, client_caller
from swarm.gateway.state import GatewayState

__all__ = ["SyncBoard", "router"]

router = APIRouter(tags=["sync"])


class SyncBoard:
    """Which clients are active and which asked for an update; thread-safe."""

    def __init__(self, active_window_s: float = 60.0) -> None:
        self.active_window_s = active_window_s
        self._seen: dict[str, float] = {}
        self._agreed: set[str] = set()
        self._lock = threading.Lock()

    def seen(self, client_id: str | None) -> None:
        if client_id:
            with self._lock:
                self._seen[client_id] = time.monotonic()

    def agree(self, client_id: str) -> None:
        with self._lock:
            self._seen[client_id] = time.monotonic()
            self._agreed.add(client_id)

    def snapshot(self) -> tuple[frozenset[str], frozenset[str]]:
        """(active clients, agreed clients) right now."""
        cutoff = time.monotonic() - self.active_window_s
        with self._lock:
            active = frozenset(c for c, t in self._seen.items() if t >= cutoff)
            return active, frozenset(self._agreed)

    def take(self) -> frozenset[str]:
        """Consume the agreements (an update fired on them)."""
        with self._lock:
            agreed, self._agreed = frozenset(self._agreed), set()
            return agreed


class AgreeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    client_id: str = Field(min_length=1, max_length=1000)


def _state_json(board: SyncBoard) -> dict[str, Any]:
    active, agreed = board.snapshot()
    return {"active_clients": sorted(active), "agreed_clients": sorted(agreed)}


@router.post("/v1/sync/agree")
async def agree(body: AgreeIn, caller: Caller = Depends(client_caller),
                state: GatewayState = Depends(State)) -> dict[str, Any]:
    """A client asks for an update now (C4: any active client suffices; C5: all must ask)."""
    state.sync.agree(body.client_id)
    return _state_json(state.sync)


@router.get("/v1/sync")
async def sync_state(caller: Caller = Depends(client_caller), state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Active clients and the agreements not yet consumed by an update."""
    return _state_json(state.sync)
