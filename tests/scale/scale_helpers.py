"""Helpers for scale-out tests: start ``python -m flows.serve`` gateway processes on loopback."""

from __future__ import annotations

from flows.serve import GatewayProcess, spawn

__all__ = ["GatewayProcess", "start_gateway"]


def start_gateway(pool_url: str, secret: str, *overrides: str, timeout_s: float = 90) -> GatewayProcess:
    """Start a gateway process over ``pool_url`` with ``SWARM_GATEWAY_SECRET=secret``; wait until it answers."""
    return spawn("model=echo", f"pool.url={pool_url}", *overrides,
                 env={"SWARM_GATEWAY_SECRET": secret, "SWARM_POOL_URL": None}, timeout_s=timeout_s)
