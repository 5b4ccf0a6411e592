"""The dashboard's Lineage view API under ``/dashboard/api/lineage``: a step's chain to the update that
consumed it, and a version's data and eval results.

- ``GET /dashboard/api/lineage/steps/{step_id}``: :meth:`swarm.pool.Pool.step_lineage`.
- ``GET /dashboard/api/lineage/versions/{policy}/{version}``: :meth:`swarm.pool.Pool.version_lineage`
  plus ``chart``: the policy's eval results per version (SVG, rendered on the server), the version
  shown marked in its tooltips.
- ``GET /dashboard/api/lineage/versions``: published versions (newest first), for the view's picker.

Reads need the same token as the pool read API. It only reads; the queries are the pool's bounded ones
(eval results and policy versions are small tables, one row per evaluation or update).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response

from swarm.dashboard import svg
from swarm.pool import INT32_MAX, eval_summary
from swarm.web.pool_json import readable_response
from swarm.web.state import Service, ServiceState, reader_caller

__all__ = ["router", "eval_chart"]

router = APIRouter(tags=["dashboard"])


def eval_chart(summary: list[dict[str, Any]], policy: str, version: int) -> str:
    """Mean eval reward (and each metric) per version of ``policy``, one line per task, source and value."""
    series: dict[str, list[tuple[float, float, str]]] = {}
    for r in summary:
        values = {"reward": r["reward"], **r["metrics"]}
        for name, y in values.items():
            if y is None:
                continue
            note = f"{r['episodes']} episodes" + (" (this version)" if r["version"] == version else "")
            series.setdefault(f"{r['task']} {name} ({r['source']})", []).append((r["version"], y, note))
    return svg.line_chart(series, f"eval results of {policy} per version", time_axis=False, y_min=None,
                          y_label="mean over eval episodes", x_label="policy version", x_integer=True,
                          empty="no eval results for this policy yet")


@router.get("/dashboard/api/lineage/steps/{step_id}", dependencies=[Depends(reader_caller)])
async def step_chain(step_id: str, state: ServiceState = Depends(Service)) -> Response:
    """Step -> episode (reward history) -> group -> lease -> update / version -> eval results."""
    return readable_response(await state.db(state.reader.step_lineage, step_id))


@router.get("/dashboard/api/lineage/versions", dependencies=[Depends(reader_caller)])
async def versions(state: ServiceState = Depends(Service)) -> dict[str, Any]:
    """Published policy versions, newest first (at most 200)."""
    return {"data": await state.db(state.overview.versions, 200)}


@router.get("/dashboard/api/lineage/versions/{policy}/{version}", dependencies=[Depends(reader_caller)])
async def version_chain(policy: str, version: int = Path(ge=0, le=INT32_MAX), limit: int = Query(25, ge=0, le=500),
                        offset: int = Query(0, ge=0, le=2**62), state: ServiceState = Depends(Service)) -> Response:
    """The data that made ``version`` (leases, counts, a page of steps) and its eval results, with a chart."""
    d = await state.db(state.reader.version_lineage, policy, version, limit=limit, offset=offset)
    rows = await state.db(state.versions.eval_results, policy)
    d["chart"] = eval_chart(eval_summary(rows), policy, version)
    return readable_response(d)
