"""Scale-out fixtures: a PostgreSQL database shared by one test module."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_URL = os.environ.get("SWARM_TEST_POSTGRES_URL")

# Loopback-only Ray (../shared/ENVIRONMENT.md), set before anything imports ray
for _k, _v in {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}.items():
    os.environ.setdefault(_k, _v)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database shared by one test module (gateway processes are slow to start)."""
    if not POSTGRES_URL:
        pytest.skip("SWARM_TEST_POSTGRES_URL is not set (no PostgreSQL server for this test)")
    import sqlalchemy as sa

    name = f"swarm_scale_{uuid.uuid4().hex[:12]}"
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
