"""Shared fixtures: offline/quiet environment, free loopback ports, pool URLs for both backends."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Offline, quiet, loopback-only settings (see ../shared/ENVIRONMENT.md); set before any import.
for _k, _v in {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_k, _v)

REPO = Path(__file__).resolve().parents[1]
POSTGRES_URL = os.environ.get("SWARM_TEST_POSTGRES_URL")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``make test``: ``-n 2``): a module's tests go to one worker (its module fixtures, e.g.
    servers, start once), and so do all of ``tests/policy/test_vllm*.py``, where the session's real vLLM server is
    used (one engine, not one per worker). Done here because ``--dist loadgroup`` marks do nothing under pytest 9.2
    (pytest-xdist 3.8.0 renames ``item._nodeid``, which pytest no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/policy/test_vllm*" if path.startswith("tests/policy/test_vllm") else path

    return ModuleScheduling(config, log)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a real server started by the test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pool.db'}"


@contextlib.contextmanager
def _fresh_postgres_database(prefix: str) -> Iterator[str]:
    """Create an empty PostgreSQL database, yield its URL, drop it afterwards."""
    if not POSTGRES_URL:
        pytest.skip("SWARM_TEST_POSTGRES_URL is not set (no PostgreSQL server for this test)")
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    with _fresh_postgres_database("swarm_test") as url:
        yield url


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database shared by one test module (for tests whose servers are slow to start)."""
    with _fresh_postgres_database("swarm_module") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def pool_url(request: pytest.FixtureRequest) -> str:
    """Each pool test runs on both backends: a SQLite file and (when available) PostgreSQL."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """The locally built tiny model checkpoint (built once, cached under the repo's .cache/)."""
    from swarm.policy.tiny import ensure_tiny_model

    return ensure_tiny_model(cache_dir=REPO / ".cache" / "models")


@pytest.fixture(scope="session")
def warm_tiny_model_path() -> Path:
    """The tiny model after the word-chain warm-up: the default policy of `flows.train`."""
    from swarm.policy.tiny import ensure_tiny_model
    from swarm.policy.warmup import word_chain_warmup

    return ensure_tiny_model(cache_dir=REPO / ".cache" / "models", warmup=word_chain_warmup)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server for every flow test of the session (start-up costs 10-25 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
