"""A local swarm stack in one process: pool + policy backend + gateway served on loopback.

Used by the training flow, the research agent's dry runs and integration tests, so all of them
start the real gateway the same way (uvicorn in a background thread, a free port when
``port=0``). It does not build backends from config (``flows/`` does that).
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from swarm.policy.base import PolicyBackend
from swarm.pool import Served

__all__ = ["Stack", "ServerThread", "start_stack", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """Runs an ASGI app with uvicorn in a daemon thread; ``stop()`` shuts it down cleanly.

    The server has the gateway's connection limits (:mod:`swarm.gateway.connections`).
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 settings: Any = None) -> None:
        """``settings`` (a GatewaySettings) sets the connection limits; default: the gateway app's own."""
        from swarm.gateway import GatewaySettings
        from swarm.gateway.connections import uvicorn_config

        self.host = host
        self.port = port or free_port(host)
        gateway = getattr(getattr(app, "state", None), "gateway", None)
        settings = settings or getattr(gateway, "settings", None) or GatewaySettings()
        config = uvicorn_config(app, settings, log_level=log_level, host=host, port=self.port, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"gateway on {self.url} failed to start (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway on {self.url} did not start within {timeout_s}s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@dataclass
class Stack:
    pool: Served
    backend: PolicyBackend
    server: ServerThread
    extra: dict[str, Any] = field(default_factory=dict)
    frozen: bool = False  # the process's heap was frozen when this stack started (start_stack's freeze_heap)

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()
        if self.frozen:  # what was alive at the start may be collected again (a test runs many flows in one process)
            gc.unfreeze()
            self.frozen = False

    def sync_clients(self) -> tuple[frozenset[str], frozenset[str]]:
        """(active, agreed) clients of the pool (every gateway on it), for the C4 / C5 strategies."""
        return self.pool.sync_clients()

    def take_agreements(self) -> frozenset[str]:
        """Consume the open agreements (an update fired on them); returns whose they were."""
        return self.pool.take_agreements()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_stack(pool: Served, backend: PolicyBackend, settings: Any = None, host: str = "127.0.0.1",
                port: int = 0, log_level: str = "warning", control: Any = None, freeze_heap: bool = False) -> Stack:
    """Serve ``pool`` + ``backend`` through a real gateway on ``host:port`` (0: a free port), uvicorn at ``log_level``;
    ``control`` (a :class:`~swarm.control.Control`) serves ``/v1/control``.

    ``freeze_heap`` (the flows: a process that serves until it ends) moves every object alive once the gateway is up
    (the libraries, the model, the pool) out of the garbage collector's view until :meth:`Stack.stop`: each full
    collection otherwise walked those ~300k objects again, every request in flight waiting it out
    (docs/gateway.md "Side by side with LiteLLM's proxy": p99 at 32 clients 145 -> 33 ms).
    """
    from swarm.app import GatewaySettings, create_app

    settings = settings or GatewaySettings.from_env()
    settings.check_bind(host)
    app = create_app(pool, backend, settings, control=control)
    server = ServerThread(app, host=host, port=port, log_level=log_level, settings=settings).start()
    if freeze_heap:
        gc.collect()
        gc.freeze()
    return Stack(pool, backend, server, extra={"app": app}, frozen=freeze_heap)


