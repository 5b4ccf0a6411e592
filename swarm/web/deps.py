"""FastAPI dependencies: the service state and the six kinds of caller a route may require.

The ``HTTPBearer`` scheme is declared only so /openapi.json documents the bearer auth; the checks
themselves are in :class:`swarm.web.state.ServiceState`. They are ``async def`` although they never
await: FastAPI runs plain ``def`` dependencies on a worker thread, a thread hop per dependency per call.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from swarm.web.auth import Caller
from swarm.web.state import ServiceState, get_state

__all__ = ["Service", "episode_caller", "client_caller", "any_caller", "admin_caller", "reader_caller",
           "sync_caller"]

_bearer = HTTPBearer(auto_error=False, description="an episode api key, the client token or the admin token")
_Cred = HTTPAuthorizationCredentials | None


async def Service(request: Request) -> ServiceState:  # noqa: N802 - reads as a type in signatures
    return get_state(request)


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
