"""A toy pool engine declared out of tree, as a plugin would: SQLite in this process's memory.

The whole engine is this module: a :class:`~swarm.pool.Dialect` (here SQLite's, connected to one in-memory
database shared by the process's threads) and its section, whose fields are the dialect's parameters,
declared under the module's own name. ``open_pool("sqlite://", engine="toy_plugin.memory_engine",
cache_kib=512)`` opens a pool on it; nothing in swarm is edited. For tests: the data is gone on close,
and calls should not overlap (one connection).
"""

from __future__ import annotations

from typing import Annotated, Any

import sqlalchemy as sa
from pydantic import Field
from sqlalchemy.pool import StaticPool

from swarm.pool import ENGINES, EngineSection
from swarm.pool.engines.sqlite import SQLite
from swarm.settings import derive


class MemorySQLite(SQLite):
    """SQLite in memory: one connection (so one database) for the whole pool."""

    nowait_setup = ()  # writes without waiting need a connection of their own, i.e. another database here

    def __init__(self, cache_kib: Annotated[int, Field(ge=64)] = 2048, busy_timeout_s: float = 5.0) -> None:
        """``cache_kib``: SQLite's page cache, in KiB (a setting of this engine only)."""
        super().__init__(busy_timeout_s=busy_timeout_s)
        self.cache_kib = cache_kib

    def connect(self, url: str) -> sa.Engine:
        engine = sa.create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
        self.setup(engine)

        @sa.event.listens_for(engine, "connect")
        def _cache(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute(f"PRAGMA cache_size=-{int(self.cache_kib)}")

        return engine


@ENGINES.declare(__name__)
class MemorySection(derive(MemorySQLite, base=EngineSection)):  # type: ignore[misc]
    """``engine: toy_plugin.memory_engine``: a throwaway pool in memory."""

    def build(self) -> MemorySQLite:
        return MemorySQLite(**self.args())
