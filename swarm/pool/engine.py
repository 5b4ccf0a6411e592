"""An open pool database: :class:`Database`, the base every part of :class:`swarm.pool.Pool` builds on.

It holds the SQLAlchemy engine (``engine``), the pool engine's :class:`~swarm.pool.engines.Dialect`
(``sql``: everything the database does its own way, see :mod:`swarm.pool.engines`), transactions
(``_tx``) and the planner-statistics upkeep. It knows no concrete database and the schema only to
create it; it never tests a dialect's name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Self

import sqlalchemy as sa

from swarm.pool.engines import Dialect, engine_section
from swarm.pool.schema import metadata

__all__ = ["Database", "transaction"]


@contextmanager
def transaction(engine: sa.Engine, write: bool = False) -> Iterator[sa.Connection]:
    """One transaction: committed on success, rolled back on any exception.

    ``write`` tells the engine a write follows (SQLite then takes its write lock up front)."""
    with engine.connect() as conn:
        conn.info["swarm_write"] = write
        with conn.begin():
            yield conn


class Database:
    """An open pool database: its engines, transactions and planner statistics; the Pool's base.

    ``sql`` is the pool engine (default: the one ``url``'s scheme names, with its default settings).
    """

    def __init__(self, url: str, sql: Dialect | None = None) -> None:
        self.url = url
        self.sql = sql if sql is not None else engine_section(url).build()
        self.engine = self.sql.connect(url)
        self.dialect = self.engine.dialect.name  # SQLAlchemy's name of the database (reports, benchmarks)
        self._stats_lock = threading.Lock()
        self._new_since_analyze = 0
        self._steps_at_analyze = 0
        with self._tx(write=True) as conn:
            metadata.create_all(conn, checkfirst=True)

    def _tx(self, write: bool = False) -> AbstractContextManager[sa.Connection]:
        return transaction(self.engine, write=write)

    def _analyze(self) -> None:
        """Refresh the query planner's statistics (PostgreSQL ANALYZE; SQLite PRAGMA optimize)."""
        with self.engine.connect() as c:
            self.sql.analyze(c)
            c.commit()

    def _maybe_analyze(self, n_new: int) -> None:
        """After ``n_new`` steps were written: on an ``auto_analyze`` engine, refresh the statistics whenever
        the steps written grow the table by a fifth (at least 1,000 steps) since the last refresh, so lease
        and filter plans stay index-driven even where autovacuum is off or has not run yet."""
        if not self.sql.auto_analyze or n_new == 0:
            return
        with self._stats_lock:
            self._new_since_analyze += n_new
            if self._new_since_analyze < max(1000, self._steps_at_analyze // 5):
                return
            self._steps_at_analyze += self._new_since_analyze
            self._new_since_analyze = 0
        self._analyze()

    def close(self) -> None:
        """Close every connection of the engine."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

