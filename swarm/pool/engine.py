"""An open pool database: :class:`Database`, the base every part of :class:`swarm.pool.Pool` builds on.

It holds the SQLAlchemy engine (``engine``), the pool engine's :class:`~swarm.pool.engines.Dialect`
(``sql``: everything the database does its own way, see :mod:`swarm.pool.engines`), transactions
(``_tx``) and the planner-statistics upkeep. It knows no concrete database and the schema only to
create it; it never tests a dialect's name.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Self

import sqlalchemy as sa

from swarm.pool.engines import Dialect, engine_section
from swarm.pool.schema import metadata

__all__ = ["Database", "transaction", "DriverConnection"]


@contextmanager
def transaction(engine: sa.Engine, write: bool = False) -> Iterator[sa.Connection]:
    """One transaction: committed on success, rolled back on any exception.

    ``write`` tells the engine a write follows (SQLite then takes its write lock up front)."""
    with engine.connect() as conn:
        conn.info["swarm_write"] = write
        with conn.begin():
            yield conn


class DriverConnection:
    """``execute(statement, params)`` of a Core statement straight on a DBAPI connection, for the gateway's hot path.

    SQLAlchemy compiles each statement once per shape of its parameters (how long each expanding list is, which
    columns an insert sets) to the driver's SQL and parameter order, and the dialect's own bind and result
    processors convert the values: the rows written and read are the ones ``sa.Connection.execute`` writes and
    reads, without its per-call work (execution context, events, result objects), which cost several times the
    statement itself on a local SQLite file (docs/pool.md "Driver-level statements"). ``params``: a dict (a select,
    whose lists are expanding parameters), or a list of dicts (an executemany: inserts, updates); a select's rows
    come back as named tuples.
    """

    def __init__(self, conn: Any, dialect: sa.Dialect) -> None:
        self.conn, self.dialect = conn, dialect

    def run(self, sql: str) -> None:
        """One statement of plain SQL without parameters (``BEGIN``, ``COMMIT``)."""
        cur = self.conn.cursor()
        try:
            cur.execute(sql)
        finally:
            cur.close()

    def execute(self, stmt: sa.Executable, params: dict[str, Any] | list[dict[str, Any]]) -> list[Any]:
        """Run ``stmt`` with ``params``; a select's rows (named tuples), else an empty list."""
        cur = self.conn.cursor()
        try:
            if isinstance(params, list):
                if not params:
                    return []
                sql, order, binds, _ = _compiled(stmt, self.dialect, ("many", tuple(params[0])))
                cur.executemany(sql, [_bound(order, binds, p) for p in params])
                return []
            shape = tuple((k, len(v) if isinstance(v, list) else -1) for k, v in params.items())
            sql, order, binds, row = _compiled(stmt, self.dialect, shape)
            cur.execute(sql, _bound(order, binds, params))
            if row is None:
                return []
            cls, procs = row
            return [cls(*(v if p is None or v is None else p(v) for p, v in zip(procs, r, strict=True)))
                    for r in cur.fetchall()]
        finally:
            cur.close()


_Order = list[tuple[str, int | None]]


@functools.lru_cache(maxsize=512)
def _compiled(stmt: sa.Executable, dialect: sa.Dialect, shape: tuple) -> tuple[str, _Order, list, Any]:
    """(the driver's SQL, where each positional parameter comes from, its bind processor, the row class and result
    processors of a select) for ``stmt`` at ``shape``."""
    if shape and shape[0] == "many":
        compiled = stmt.compile(dialect=dialect, column_keys=list(shape[1]))
        expanding: dict[str, int] = {}
    else:
        expanding = {k: n for k, n in shape if n >= 0}
        values = {k: [None] * n if n >= 0 else None for k, n in shape}
        compiled = stmt.params(values).compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
    assert compiled.positiontup is not None, "a positional (qmark) driver"
    order: _Order = []
    for name in compiled.positiontup:
        base, _, i = name.rpartition("_")
        order.append((base, int(i) - 1) if base in expanding else (name, None))
    binds = [compiled.binds[k].type.dialect_impl(dialect).bind_processor(dialect) for k, _ in order]
    row = None
    if isinstance(stmt, sa.Select):
        cols = list(stmt.selected_columns)
        cls = collections.namedtuple("Row", [c.name for c in cols], rename=True)  # type: ignore[misc]
        row = (cls, [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in cols])
    return str(compiled), order, binds, row


def _bound(order: _Order, binds: list, params: dict[str, Any]) -> tuple:
    out = []
    for (key, i), proc in zip(order, binds, strict=True):
        v = params[key] if i is None else params[key][i]
        out.append(v if proc is None else proc(v))
    return tuple(out)


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

    @contextmanager
    def _driver_write(self) -> Iterator[DriverConnection]:
        """One write transaction on a DBAPI connection (``Dialect.driver_begin``: SQLite's takes
        the write lock up front, as ``_tx(write=True)`` does); a driver error is raised as SQLAlchemy's
        (``sa.exc.IntegrityError``, ...), as the other path raises it. Only where ``Dialect.driver_sql``."""
        error = self.engine.dialect.loaded_dbapi.Error
        with self._driver_conn() as c:
            try:
                c.run(self.sql.driver_begin)
                try:
                    yield c
                except BaseException:
                    if getattr(c.conn, "in_transaction", True):  # some errors end the transaction themselves
                        c.run("ROLLBACK")
                    raise
                c.run("COMMIT")
            except error as e:
                raise sa.exc.DBAPIError.instance(None, None, e, error) from e

    @contextmanager
    def _driver_conn(self) -> Iterator[DriverConnection]:
        """A DBAPI connection of the engine's own pool (its connect settings, its pool's rules), for one use: a read
        on it is one statement, its own snapshot. Only where ``Dialect.driver_sql``."""
        fairy = self.engine.raw_connection()
        try:
            yield DriverConnection(fairy.dbapi_connection, self.engine.dialect)
        finally:
            fairy.close()  # back to the pool

    def close(self) -> None:
        """Close every connection of the engine."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

