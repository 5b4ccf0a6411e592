"""Lineage and eval results under ``/v1/pool``: from a step to the update that consumed it, from a
version back to its data and forward to its evals.

- ``GET /v1/pool/lineage/steps/{step_id}``: :meth:`swarm.pool.Pool.step_lineage`.
- ``GET /v1/pool/lineage/versions/{policy}/{version}``: :meth:`swarm.pool.Pool.version_lineage`
  (``limit`` / ``offset`` page the steps that made it).
- ``GET /v1/pool/evals?policy=&version=``: :meth:`swarm.pool.Pool.eval_results` with a per
  (policy, version, task, source) summary.

Same auth as the other pool reads (:func:`swarm.web.state.reader_caller`); an unknown step or version
is a 404 in the OpenAI error shape. It reads only.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response

from swarm.gateway.state import GatewayState, State
from swarm.pool import INT32_MAX, eval_summary
from swarm.web.auth import Caller
from swarm.web.pool_json import readable_response
from swarm.web.state import reader_caller

__all__ = ["router"]

router = APIRouter(tags=["pool"])


@router.get("/v1/pool/lineage/steps/{step_id}")
async def step_lineage(step_id: str, state: GatewayState = Depends(State),
                       _: Caller = Depends(reader_caller)) -> Response:
    """A step's episode (reward history, feedback), group, lease, consuming update, version and its evals."""
    d = await state.db(state.reader.step_lineage, step_id)
    return readable_response(d)


@router.get("/v1/pool/lineage/versions/{policy}/{version}")
async def version_lineage(policy: str, version: int = Path(ge=0, le=INT32_MAX), limit: int = Query(50, ge=0, le=1000),
                          offset: int = Query(0, ge=0, le=2**62), state: GatewayState = Depends(State),
                          _: Caller = Depends(reader_caller)) -> Response:
    """A version's record, parent, leases, the data that made it (counts and a page of steps), its evals."""
    d = await state.db(state.reader.version_lineage, policy, version, limit=limit, offset=offset)
    return readable_response(d)


@router.get("/v1/pool/evals")
async def list_evals(policy: str | None = None, version: int | None = Query(None, ge=0, le=INT32_MAX),
                     limit: int = Query(1000, ge=0, le=1000), state: GatewayState = Depends(State),
                     _: Caller = Depends(reader_caller)) -> dict[str, Any]:
    """Eval results (of a policy, of a version), oldest first, and their per-version summary."""
    rows = await state.db(state.versions.eval_results, policy, version, limit=limit)
    return {"object": "list", "data": [r.model_dump(mode="json") for r in rows], "summary": eval_summary(rows)}
