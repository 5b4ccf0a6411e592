"""Gateway fixtures: a real uvicorn server on 127.0.0.1 (free port) over a SQLite pool in tmp."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.app import GatewaySettings, create_app
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.stack import ServerThread


class Gateway:
    """A running gateway plus its pool, with small helpers for tests."""

    def __init__(self, pool: Pool, backend: Any, settings: GatewaySettings) -> None:
        self.pool, self.backend, self.settings = pool, backend, settings
        self.server = ServerThread(create_app(pool, backend, settings)).start()
        self.url = self.server.url
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def episode(self, task: str = "t", token: str | None = None, **kw: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = self.http.post("/v1/episodes", json={"task": task, **kw}, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()

    def post(self, path: str, key: str | None = None, **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {})
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return self.http.post(path, headers=headers, **kw)

    def chat(self, key: str, messages: list[dict[str, Any]], **kw: Any) -> httpx.Response:
        return self.post("/v1/chat/completions", key, json={"model": "default", "messages": messages, **kw})

    def stop(self) -> None:
        self.http.close()
        self.server.stop()


@pytest.fixture
def make_gateway(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def make(backend: Any = None, pool: Pool | None = None, **settings: Any) -> Gateway:
        pool = pool or Pool(f"sqlite:///{tmp_path / 'pool.db'}")
        gw = Gateway(pool, backend or EchoBackend(), GatewaySettings(**settings))
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    """An open gateway (no tokens) over the EchoBackend."""
    return make_gateway()


@pytest.fixture
def gw(make_gateway: Callable[..., Gateway], pool_url: str) -> Gateway:
    """A gateway with an admin token ("adm"), on each pool backend: the trust tests' server."""
    return make_gateway(EchoBackend(max_context=4096), pool=Pool(pool_url), admin_token="adm")


@pytest.fixture(scope="session")
def hf_backend(tiny_model_path: Path) -> Iterator[Any]:
    from swarm.policy.hf import HFBackend

    backend = HFBackend(str(tiny_model_path), torch_threads=1)
    yield backend
    backend.close()


@pytest.fixture
def hf_gateway(make_gateway: Callable[..., Gateway], hf_backend: Any) -> Gateway:
    return make_gateway(hf_backend)
