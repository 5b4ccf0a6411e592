"""The openenv server a task starts for itself: openenv's ``create_app`` under uvicorn on 127.0.0.1.

:func:`serve` starts, once per worker process and environment, the app openenv's own ``create_app``
builds for the environment class, under uvicorn in a daemon thread on a free loopback port
(:class:`_Server`), and returns its URL. The server lives in the worker's process, so it ends with
it whatever ends the run (the flow's end, Ctrl-C, SIGTERM, a killed ``runner=process`` worker);
:func:`stop_servers` stops it cleanly first, and runs at interpreter exit. A server given by
``task.options.url`` is never started or stopped here.
"""

from __future__ import annotations

import atexit
import socket
import threading
import time
from typing import Any

import uvicorn

from experiments.openenv.options import Options, env_types, library

__all__ = ["serve", "running", "stop_servers"]


class _Server:
    """An ASGI app under uvicorn in a daemon thread, on a loopback socket bound before it starts (no port race)."""

    def __init__(self, app: Any, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name=f"openenv-{self.url.rsplit(':', 1)[1]}", daemon=True)

    def start(self, timeout_s: float = 30.0) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"openenv server on {self.url} failed to start (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"openenv server on {self.url} did not start within {timeout_s}s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


_LOCK = threading.Lock()
_SERVERS: dict[tuple[str, int], _Server] = {}


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


def serve(opts: Options) -> tuple[str, int]:
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
            server = _SERVERS[key] = _Server(_QuietClose(app)).start()
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
