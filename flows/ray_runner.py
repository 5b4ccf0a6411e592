"""prefect-ray's ``RayTaskRunner``, made to deliver each task run's last state and logs to Prefect.

A Prefect task in a Ray worker reports its states as events (and its logs) through background
services of that worker process. The final ``Completed`` event is queued as the task returns,
and ``ray.shutdown`` may kill the worker before that queue is sent: Prefect's UI then shows the
run ``Running`` forever (seen in CI). Here the Ray function drains both services before it
returns, so a result the flow has seen is a result Prefect has recorded. Imported only with
``runner=ray`` (prefect-ray is the ``dist`` extra).
"""

from __future__ import annotations

from typing import Any

from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect_ray import RayTaskRunner

__all__ = ["DrainingRayTaskRunner", "DRAIN_TIMEOUT_S"]

# per service, at most: an unreachable API must not hold the worker, and the flow waits 30 s in all for its tasks
DRAIN_TIMEOUT_S = 5.0


class DrainingRayTaskRunner(RayTaskRunner):
    """``RayTaskRunner`` whose Ray function sends the worker's queued Prefect events and logs before it returns."""

    @staticmethod
    def _run_prefect_task(*upstream_ray_obj_refs: Any, **kwargs: Any) -> Any:
        try:
            return RayTaskRunner._run_prefect_task(*upstream_ray_obj_refs, **kwargs)
        finally:  # (Prefect 3.9's services share one registry, so the first call may already drain both)
            EventsWorker.drain_all(timeout=DRAIN_TIMEOUT_S)
            APILogWorker.drain_all(timeout=DRAIN_TIMEOUT_S)
