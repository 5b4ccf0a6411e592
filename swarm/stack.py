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
    frozen: tuple[int, ...] | None = None  # the collector's thresholds before start_stack's freeze_heap

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()
        if self.frozen is not None:  # what was alive at the start may be collected again (tests run many flows)
            gc.unfreeze()
            gc.set_threshold(*self.frozen)
            self.frozen = None

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
    (the libraries, the model, the pool) out of the garbage collector's view until :meth:`Stack.stop`, and collects
    the youngest generation after 10,000 net new objects instead of 700. Each full collection otherwise walked those
    ~300k objects again (~120 ms, every ~1,500 calls under load: ~13% of the gateway's CPU per call, and its p99
    latency), and the young ones ran every few calls (~8% more). Cyclic garbage still goes, 10,000 objects at most
    later (docs/gateway.md "What a request costs").
    """
    from swarm.app import GatewaySettings, create_app

    settings = settings or GatewaySettings.from_env()
    settings.check_bind(host)
    app = create_app(pool, backend, settings, control=control)
    server = ServerThread(app, host=host, port=port, log_level=log_level, settings=settings).start()
    frozen = None
    if freeze_heap:
        frozen = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(max(frozen[0], 10_000), *frozen[1:])
    return Stack(pool, backend, server, extra={"app": app}, frozen=frozen)


