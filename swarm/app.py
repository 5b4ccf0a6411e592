"""The FastAPI app: ``create_app(pool, backend, settings)``, the gateway's routes with the dashboard mounted.

Assembled here, above :mod:`swarm.gateway` and :mod:`swarm.dashboard`, so that neither imports the
other. Wires the routers, OpenAI-shaped error handlers, the Host check of a gateway without tokens
(:mod:`swarm.gateway.hosts`), the request body limit and the background
sweep that abandons open episodes idle past their ``timeout_s``. Serving (uvicorn, host, port)
is the caller's business: see ``flows/serve.py``. Nothing here reads config files or env vars.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swarm.control import Control
from swarm.dashboard import mount_dashboard
from swarm.gateway import (
    routes_control,
    routes_episodes,
    routes_ingest,
    routes_lineage,
    routes_messages,
    routes_openai,
    routes_pool,
    routes_responses,
    sync,
)
from swarm.gateway.fastlane import FastLane
from swarm.gateway.hosts import HostCheck, host_name
from swarm.gateway.state import GatewayState, State
from swarm.policy.base import PolicyBackend
from swarm.pool import Served
from swarm.web.errors import error_body, install_error_handlers
from swarm.web.settings import GatewaySettings

__all__ = ["create_app", "BodyLimit", "GatewayApp", "GatewaySettings"]

log = logging.getLogger("swarm.gateway")


class BodyLimit:
    """Refuses request bodies over a limit with 413 (by Content-Length, and while streaming in),
    and URLs holding NUL with 400.

    ``POST /v1/steps`` (white-box) has its own, larger limit.
    """

    def __init__(self, app: ASGIApp, default: int, whitebox: int) -> None:
        self.app, self.default, self.whitebox = app, default, whitebox

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if "\x00" in scope.get("path", "") or b"%00" in scope.get("query_string", b"").lower():
            # ids in paths and filters are bound into SQL; PostgreSQL refuses NUL in text
            return await self._refuse(send, 400, "the URL must not contain NUL (%00) characters", "invalid_value")
        limit = self.whitebox if scope.get("path") == "/v1/steps" else self.default
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    return await self._refuse(send, 413, f"request body is larger than {limit} bytes",
                                              "request_too_large")
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise StarletteHTTPException(413, f"request body is larger than {limit} bytes")
            return msg

        await self.app(scope, limited, send)

    @staticmethod
    async def _refuse(send: Send, status: int, message: str, code: str) -> None:
        body = json.dumps(error_body(message, "invalid_request_error", code=code)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class GatewayApp(FastAPI):
    """The FastAPI app with the gateway's fast lane at its door (:mod:`swarm.gateway.fastlane`): chat calls, episode
    opens and ends are served by the same route code without FastAPI's per-request layers; everything else, and any
    request the lane does not take as it is, goes the FastAPI way."""

    fast_lane: FastLane | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.fast_lane
        if lane is not None and lane.wants(scope):
            scope["app"] = self  # as Starlette sets it
            return await lane(scope, receive, send, super().__call__)
        await super().__call__(scope, receive, send)


async def _sweep(state: GatewayState) -> None:
    while True:
        await asyncio.sleep(state.settings.sweep_interval_s)
        try:
            ids = await state.write(state.recorder.abandon_stale)
            if ids:
                log.info("abandoned %d idle episode(s)", len(ids))
        except Exception:  # a sweep failing once (database busy) must not stop the next ones
            log.warning("abandon sweep failed", exc_info=True)


def create_app(pool: Served, backend: PolicyBackend, settings: GatewaySettings | None = None,
               control: Control | None = None) -> FastAPI:
    """The app over ``pool`` and ``backend``: gateway routes, the dashboard, error handlers and middleware;
    ``control`` (the training process's run control) enables ``/v1/control``. ``pool`` is anything that serves
    the roles of :class:`swarm.pool.Served` (a :class:`~swarm.pool.Pool` does)."""
    settings = settings or GatewaySettings()
    state = GatewayState(pool, backend, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log.info("gateway access: %s", settings.access_summary())
        task = asyncio.create_task(_sweep(state))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            aclose = getattr(backend, "aclose", None)  # the engine / upstream connections of this loop
            if callable(aclose):
                await aclose()

    app = GatewayApp(
        title="swarmpool gateway",
        version="0.1.0",
        description="OpenAI-compatible gateway that records every call as an exact step in the swarm data pool.",
        lifespan=lifespan,
        # no OpenTelemetry here: left on, FastAPI looks up the tracer providers on every request
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.gateway = state
    app.state.control = control
    install_error_handlers(app)
    app.add_middleware(BodyLimit, default=settings.max_body_bytes, whitebox=settings.max_whitebox_body_bytes)
    host_check = None
    if settings.open:  # no tokens: refuse foreign Host names (DNS rebinding); added last, so it runs first
        base = host_name(settings.base_url.split("://", 1)[-1].split("/", 1)[0]) if settings.base_url else ""
        app.add_middleware(HostCheck, allowed=(*settings.allowed_hosts, base))
        host_check = HostCheck(None, allowed=(*settings.allowed_hosts, base))  # type: ignore[arg-type]

    @app.get("/health", tags=["meta"])
    async def health(st: GatewayState = Depends(State)) -> dict[str, Any]:
        """Liveness, the served policies and their current versions."""
        policies = st.backend.policies()
        return {"status": "ok", "policies": policies, "versions": {p: st.backend.version(p) for p in policies}}

    for module in (routes_openai, routes_responses, routes_messages, routes_episodes, routes_ingest, routes_pool,
                   routes_lineage, sync, routes_control):
        app.include_router(module.router)
    mount_dashboard(app)
    app.fast_lane = FastLane(app, state, host_check, settings.max_body_bytes)
    return app
