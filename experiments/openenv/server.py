"""The openenv server a task starts for itself: openenv's ``create_app`` under uvicorn on 127.0.0.1.

:func:`serve` starts, once per worker process and environment, the app openenv's own ``create_app``
builds for the environment class, in a :class:`swarm.stack.ServerThread` (uvicorn in a daemon thread,
a free loopback port), and returns its URL. The server lives in the worker's process, so it ends with
it whatever ends the run (the flow's end, Ctrl-C, SIGTERM, a killed ``runner=process`` worker);
:func:`stop_servers` stops it cleanly first, and runs at interpreter exit. A server given by
``task.options.url`` is never started or stopped here.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from experiments.openenv.options import EnvOptions, env_types, library
from swarm.stack import ServerThread

__all__ = ["serve", "running", "stop_servers"]

_LOCK = threading.Lock()
_SERVERS: dict[tuple[str, int], ServerThread] = {}


class _QuietClose:
    """openenv 0.3.0's ``/ws`` handler closes a socket the client has already closed; starlette 1.x raises
    ``WebSocketDisconnect`` from that close and uvicorn would log a traceback for every episode."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise


def serve(opts: EnvOptions) -> tuple[str, int]:
    """(URL, sessions) of this process's server for ``opts.env``, started on first use with ``opts.sessions()``
    concurrent sessions (1 for an environment that does not declare ``SUPPORTS_CONCURRENT_SESSIONS``)."""
    library()
    cls, action_cls, observation_cls = env_types(opts.env)
    sessions = opts.sessions(bool(getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False)))
    key = (opts.env, sessions)
    with _LOCK:
        server = _SERVERS.get(key)
        if server is None or not server.thread.is_alive():
            from openenv.core.env_server import create_app

            app = create_app(cls, action_cls, observation_cls, max_concurrent_envs=sessions)
            server = _SERVERS[key] = ServerThread(_QuietClose(app)).start()
        return server.url, sessions


def running() -> list[str]:
    """URLs of the servers this process started and that still run."""
    with _LOCK:
        return [s.url for s in _SERVERS.values() if s.thread.is_alive()]


def stop_servers() -> int:
    """Stop every server this process started (uvicorn's graceful shutdown); returns how many."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()
    return len(servers)


atexit.register(stop_servers)
