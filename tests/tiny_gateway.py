"""The real gateway on loopback serving a model on the HF backend (the warmed tiny model, or SmolLM2), for the
environment adapters' tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from swarm.app import GatewaySettings, create_app
from swarm.policy.hf import HFBackend
from swarm.pool import Pool
from swarm.stack import ServerThread

__all__ = ["tiny_gateway"]


@contextlib.contextmanager
def tiny_gateway(tmp_path: Path, model_path: Path, policies: tuple[str, ...] = ("default",), **backend_kw: Any
                 ) -> Iterator[tuple[str, Pool]]:
    """(gateway url, pool): a SQLite pool under ``tmp_path`` and the model behind every name in ``policies``
    (``backend_kw``: more HFBackend arguments, e.g. ``chat_template="smollm2"``)."""
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    backend = HFBackend(str(model_path), policies=policies, torch_threads=1, **backend_kw)
    server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
    try:
        yield server.url, pool
    finally:
        server.stop()
        backend.close()
        pool.close()
