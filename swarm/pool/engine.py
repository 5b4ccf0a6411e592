"""An open pool database: :class:`Database`, the base every part of :class:`swarm.pool.Pool` builds on.

It holds the SQLAlchemy engine (``engine``), the pool engine's :class:`~swarm.pool.engines.Dialect`
(``sql``: everything the database does its own way, see :mod:`swarm.pool.engines`), transactions
(``_tx``) and the planner-statistics upkeep. It knows no concrete database and the schema only to
create it; it never tests a dialect's name.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Self

import sqlalchemy as sa

from swarm.pool.engines import Dialect, engine_section
from swarm.pool.schema import metadata

__all__ = ["Database", "transaction", "DriverQuery"]


@contextmanager
def transaction(engine: sa.Engine, write: bool = False) -> Iterator[sa.Connection]:
    """One transaction: committed on success, rolled back on any exception.

    ``write`` tells the engine a write follows (SQLite then takes its write lock up front)."""
    with engine.connect() as conn:
        conn.info["swarm_write"] = write
        with conn.begin():
            yield conn


class DriverQuery:
    """A read statement whose one parameter is an expanding list, run straight on a DBAPI connection.

    Compiled by SQLAlchemy once per list length (the driver's SQL and parameter order), and its rows converted by
    the dialect's own result processors of its columns: the same values as ``Connection.execute(...).mappings()``,
    without SQLAlchemy's per-call work (docs/pool.md "Driver-level reads").
    """

    def __init__(self, stmt: sa.Select, param: str) -> None:
        self.stmt, self.param = stmt, param

    @functools.lru_cache(maxsize=256)  # noqa: B019 - a module-level statement, one entry per (dialect, length)
    def _compiled(self, dialect: sa.Dialect, n: int) -> tuple[str, list[str], list[Callable[[Any], Any] | None]]:
        compiled = self.stmt.params({self.param: [None] * n}).compile(
            dialect=dialect, compile_kwargs={"render_postcompile": True})
        assert compiled.positiontup is not None and len(compiled.positiontup) == n, "one expanding parameter only"
        cols = list(self.stmt.selected_columns)
        return (str(compiled), [c.name for c in cols],
                [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in cols])

    def rows(self, conn: Any, dialect: sa.Dialect, values: list[Any]) -> list[dict[str, Any]]:
        """The rows for ``values`` (at most ``IN_CHUNK`` of them) as column name -> value."""
        sql, names, procs = self._compiled(dialect, len(values))
        cur = conn.cursor()
        try:
            cur.execute(sql, values)
            raw = cur.fetchall()
        finally:
            cur.close()
        return [{n: v if p is None or v is None else p(v) for n, p, v in zip(names, procs, r, strict=True)}
                for r in raw]


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
        self._drivers = threading.local()  # each thread's own DBAPI connection for _driver_rows
        self._driver_conns: list[Any] = []
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

    def _driver_rows(self, query: DriverQuery, values: list[Any]) -> list[dict[str, Any]] | None:
        """``query``'s rows for ``values`` read on this thread's own DBAPI connection (one statement, its own
        snapshot), or None where the engine does not read that way (``Dialect.driver_reads``)."""
        if not self.sql.driver_reads:
            return None
        conn = getattr(self._drivers, "conn", None)
        if conn is None:  # made once per thread, with the engine's connect settings, outside its pool
            fairy = self.engine.raw_connection()
            fairy.detach()
            conn = self._drivers.conn = fairy.dbapi_connection
            with self._stats_lock:
                self._driver_conns.append(conn)
        return query.rows(conn, self.engine.dialect, values)

    def close(self) -> None:
        """Close every connection of the engine."""
        with self._stats_lock:
            conns, self._driver_conns = self._driver_conns, []
        for conn in conns:
            conn.close()
        self._drivers = threading.local()
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

