"""ServiceState: what every route of the app needs (the pool's roles, backend, settings, key signer), its auth
checks, and the FastAPI dependencies over them (:func:`Service` and the six kinds of caller a route may require).

The pool comes in as :class:`swarm.pool.Served` and is handed to routes by role (``lookup``, ``recorder``,
``annotator``, ``reader``, ``leases``, ``versions``, ``agreements``, ``overview``), so each call says which
part of the pool it uses and nothing here needs the concrete :class:`~swarm.pool.Pool`.

One instance per app, on ``app.state.gateway`` (the gateway's :class:`~swarm.gateway.state.GatewayState`
extends it with the episode write path). Pool calls are blocking (SQLAlchemy), so routes run them through
:meth:`ServiceState.db` on a worker thread. The ``HTTPBearer`` scheme is declared only so /openapi.json
documents the bearer auth. The dependencies are ``async def`` although they never await: FastAPI runs plain
``def`` dependencies on a worker thread, a thread hop per dependency per call. It holds no routes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from swarm.policy.base import PolicyBackend
from swarm.pool import Agreements, Annotator, LeaseBook, Lookup, Overview, Reader, Recorder, Served, Versions
from swarm.web.auth import KEY_PREFIX, Caller, KeySigner, bearer_token, token_matches
from swarm.web.errors import ApiError
from swarm.web.settings import GatewaySettings

__all__ = ["ServiceState", "get_state", "Service", "episode_caller", "client_caller", "any_caller", "admin_caller",
           "reader_caller", "sync_caller"]

T = TypeVar("T")
INLINE_CHARS = 4096  # see ServiceState.cpu


class ServiceState:
    """The pool (by role) and backend an app serves, its settings, and the credential checks of its routes."""

    def __init__(self, pool: Served, backend: PolicyBackend, settings: GatewaySettings) -> None:
        self.lookup: Lookup = pool
        self.recorder: Recorder = pool
        self.annotator: Annotator = pool
        self.reader: Reader = pool
        self.leases: LeaseBook = pool
        self.versions: Versions = pool
        self.agreements: Agreements = pool
        self.overview: Overview = pool.overview
        self.backend = backend
        self.settings = settings
        self.signer = KeySigner(settings.secret)
        # SQLite has one writer at a time and its busy handler sleeps with backoff (up to 100 ms)
        # while it waits: queueing our own writers here instead keeps p99 and throughput sane.
        self._write_gate = asyncio.Lock() if pool.single_writer else None

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking pool call on a worker thread."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    async def write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking pool *write* on a worker thread (one at a time per process on SQLite)."""
        if self._write_gate is None:
            return await self.db(fn, *args, **kwargs)
        async with self._write_gate:
            return await self.db(fn, *args, **kwargs)

    async def cpu(self, fn: Callable[..., T], *args: Any, chars: int | None = None, **kwargs: Any) -> T:
        """Run tokenizer / template work off the event loop, or on it when ``chars`` of text is small.

        A thread hop costs more CPU than templating and tokenizing a short chat (a few hundred
        microseconds under load, most of it waiting for the GIL), so work over fewer than
        ``INLINE_CHARS`` characters runs right here.
        """
        if chars is not None and chars < INLINE_CHARS:
            return fn(*args, **kwargs)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    def base_url(self, request: Request) -> str:
        base = self.settings.base_url or str(request.base_url).rstrip("/")
        return base + "/v1"

    # ------------------------------------------------------------------ credentials
    def _service(self, token: str | None) -> Caller | None:
        s = self.settings
        if token_matches(token, s.admin_token):
            return Caller(service=True, admin=True)
        if token_matches(token, s.client_token):
            return Caller(service=True)
        return None

    def _episode_key(self, token: str) -> Caller:
        episode_id = self.signer.verify(token)
        if episode_id is None:
            raise ApiError(401, "invalid api key (forged, corrupted or issued under another secret)",
                           code="invalid_api_key")
        return Caller(episode_id=episode_id)

    def episode_caller(self, request: Request) -> Caller:
        """An episode api key is required (chat, completions, white-box steps)."""
        token = bearer_token(request)
        if not token:
            raise ApiError(401, "missing api key: send 'Authorization: Bearer <episode api key>' "
                           "(from POST /v1/episodes)", code="missing_api_key")
        if not token.startswith(KEY_PREFIX):
            raise ApiError(401, "invalid api key: expected an episode key from POST /v1/episodes",
                           code="invalid_api_key")
        return self._episode_key(token)

    def client_caller(self, request: Request) -> Caller:
        """The client token when one is configured (episode creation); open otherwise."""
        token = bearer_token(request)
        caller = self._service(token)
        if caller is not None:
            return caller
        if self.settings.client_token is None:
            return Caller(service=True)
        raise ApiError(401, "this gateway requires the client token (SWARM_CLIENT_TOKEN) as bearer token",
                       code="invalid_client_token")

    def any_caller(self, request: Request,
                   refusal: str = "this route needs the episode's api key (or a configured client / admin token)",
                   ) -> Caller:
        """An episode key, or a configured client/admin token: never open, whatever is configured."""
        token = bearer_token(request)
        if token and token.startswith(KEY_PREFIX):
            return self._episode_key(token)
        caller = self._service(token)
        if caller is not None:
            return caller
        raise ApiError(401, refusal, code="missing_api_key" if not token else "invalid_api_key")

    def sync_caller(self, request: Request) -> Caller:
        """``/v1/sync*``: open only when no token is configured; else as :meth:`any_caller`."""
        if self.settings.open:
            bearer_token(request)  # a malformed Authorization header is a 401 all the same
            return Caller(service=True)
        return self.any_caller(request, "this gateway has tokens configured: /v1/sync needs an episode api key or "
                               "the client / admin token")

    def reader_caller(self, request: Request) -> Caller:
        """Pool reads: the admin token when one is set, else the client token when set; open otherwise."""
        s = self.settings
        token = bearer_token(request)
        if s.admin_token is None and s.client_token is None:
            return Caller(service=True, admin=True)
        caller = self._service(token)
        if caller is not None and (caller.admin or s.admin_token is None):
            return caller
        raise ApiError(401 if not token else 403, "reading pool data requires the "
                       + ("admin token (SWARM_ADMIN_TOKEN)" if s.admin_token else "client token (SWARM_CLIENT_TOKEN)"),
                       code="read_token_required")

    def admin_caller(self, request: Request) -> Caller:
        """The admin token when one is configured (leases, labels); open otherwise."""
        token = bearer_token(request)
        if self.settings.admin_token is None:
            return Caller(service=True, admin=True)
        if token_matches(token, self.settings.admin_token):
            return Caller(service=True, admin=True)
        raise ApiError(401 if not token else 403, "this route requires the admin token (SWARM_ADMIN_TOKEN)",
                       code="admin_token_required")


def get_state(request: Request) -> ServiceState:
    return request.app.state.gateway


async def Service(request: Request) -> ServiceState:  # noqa: N802 - reads as a type in signatures
    return get_state(request)


_bearer = HTTPBearer(auto_error=False, description="an episode api key, the client token or the admin token")
_Cred = HTTPAuthorizationCredentials | None


async def episode_caller(request: Request, _: _Cred = Depends(_bearer)) -> Caller:
    return get_state(request).episode_caller(request)


async def client_caller(request: Request, _: _Cred = Depends(_bearer)) -> Caller:
    return get_state(request).client_caller(request)


async def any_caller(request: Request, _: _Cred = Depends(_bearer)) -> Caller:
    return get_state(request).any_caller(request)


async def admin_caller(request: Request, _: _Cred = Depends(_bearer)) -> Caller:
    return get_state(request).admin_caller(request)


async def sync_caller(request: Request, _: _Cred = Depends(_bearer)) -> Caller:
    return get_state(request).sync_caller(request)


def reader_caller(request: Request, _: _Cred = Depends(_bearer)) -> Caller:
    return get_state(request).reader_caller(request)
