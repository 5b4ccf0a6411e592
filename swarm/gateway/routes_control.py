"""Run control routes, ``/v1/control``: a client starts, pauses, resumes, retunes and stops the training run
whose process serves this gateway (docs/scale_out.md "Driving the server from a client").

Routes only: the state is the app's :class:`~swarm.control.Control` (``app.state.control``), which only the
training process's own gateway has; any other gateway (``flows.serve``, a second gateway on the pool) answers
404. Every route needs the admin token when one is configured, like the pool's write routes. Refusals are
OpenAI-shaped: 400 names the knob or key, 409 says which state forbids the call.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from swarm.control import Control
from swarm.gateway.state import GatewayState, State
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.state import admin_caller

__all__ = ["router"]

router = APIRouter(tags=["control"])


class StartIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overrides: dict[str, Any] = Field(default_factory=dict)  # dotted config keys -> values ({"algo.lr": 1e-3})
    holder: str = Field(default="client", max_length=256)  # who holds the run (shown by GET /v1/control)


def _control(request: Request) -> Control:
    control = getattr(request.app.state, "control", None)
    if control is None:
        raise ApiError(404, "this gateway serves no run control: only the gateway of the training process "
                       "(python -m flows.train) does", code="no_run_control")
    return control


@router.get("/v1/control")
async def control_status(request: Request, caller: Caller = Depends(admin_caller)) -> dict[str, Any]:
    """The run's state, holder, policy version, updates done / total, knobs and changes."""
    return _control(request).status()


@router.post("/v1/control/start")
async def start(request: Request, body: StartIn = Body(default_factory=StartIn),
                caller: Caller = Depends(admin_caller), state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Start the waiting run with config overrides (validated like the command line's); 409 unless waiting."""
    control = _control(request)
    return await state.db(control.start, body.overrides, body.holder)


@router.post("/v1/control/pause")
async def pause(request: Request, caller: Caller = Depends(admin_caller)) -> dict[str, Any]:
    """Hold the run before its next update."""
    return _control(request).pause()


@router.post("/v1/control/resume")
async def resume(request: Request, caller: Caller = Depends(admin_caller)) -> dict[str, Any]:
    """Let a paused run go on."""
    return _control(request).resume()


@router.post("/v1/control/retune")
async def retune(request: Request, knobs: dict[str, Any] = Body(...),
                 caller: Caller = Depends(admin_caller)) -> dict[str, Any]:
    """Queue ``{knob: value}`` changes, applied between updates (all valid or none)."""
    control = _control(request)
    control.retune(knobs)
    return control.status()


@router.post("/v1/control/stop")
async def stop(request: Request, caller: Caller = Depends(admin_caller)) -> dict[str, Any]:
    """End the run cleanly: the current update finishes, then the checkpoint; a waiting run just ends."""
    return _control(request).stop()
