"""Kept for old imports only: the dashboard's queries are the pool's own now (:class:`swarm.pool.Overview`,
``pool.overview``), so no module outside the pool runs SQL on its tables. Use ``pool.overview.<query>``."""

from __future__ import annotations

from typing import Any

from swarm.pool import Monitor

__all__ = ["recent_leases"]


def recent_leases(pool: Monitor, limit: int = 40) -> list[dict[str, Any]]:
    """``pool.overview.recent_leases(limit)``."""
    return pool.overview.recent_leases(limit)
