"""Pool fixtures: an open Pool on each backend (builders live in pool_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swarm.pool import Pool


@pytest.fixture
def pool(pool_url: str) -> Iterator[Pool]:
    p = Pool(pool_url)
    yield p
    p.close()
