"""The data-lifecycle dashboard, served by the app (:mod:`swarm.app`) at ``/dashboard``.

Six views over the pool: Collection (what is coming in), Representation (what a step really
is: messages, exact tokens, logprobs), Curation (the :class:`~swarm.pool.StepFilter` of a running
trainer's next lease, from its lease plan, before its batching strategy picks groups; labels and saved
curations, with live counts and Parquet / chat-JSONL export), Prefix merging
(what merging saves per batch, and the prefix tree) Consumption (leases, acks, staleness, reward) and
Lineage (a step's chain to the version it trained and that version's evals; a version's data).

Everything ships in this package: one HTML page, a small vanilla-JS file and a stylesheet;
charts are SVG rendered on the server. It imports no gateway module: credentials, errors
and the service state come from :mod:`swarm.web`. Reads go through bounded, indexed queries
(:class:`swarm.pool.Overview`, the pool's monitoring queries) and background-refreshed aggregates
(:mod:`swarm.dashboard.snapshot`). It does not train, lease or change anything but labels and saved curations.
See docs/dashboard.md.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

__all__ = ["mount_dashboard", "STATIC_DIR"]

STATIC_DIR = Path(__file__).parent / "static"


def mount_dashboard(app: FastAPI) -> None:
    """Add the dashboard's routes and static assets to an app (:func:`swarm.app.create_app` does this)."""
    from swarm.dashboard.routes import router

    app.include_router(router)
    app.mount("/dashboard/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
