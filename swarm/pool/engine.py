"""An open pool database: :class:`Database`, the base every part of :class:`swarm.pool.Pool` builds on.

It holds the SQLAlchemy engine (``engine``), the pool engine's :class:`~swarm.pool.engines.Dialect`
(``sql``: everything the database does its own way, see :mod:`swarm.pool.engines`), transactions
(``_tx``) and the planner-statistics upkeep. It knows no concrete database and the schema only to
create it; it never tests a dialect's name.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.sql import visitors

from swarm.pool.engines import Dialect, engine_section
from swarm.pool.schema import metadata

__all__ = ["Database", "transaction", "DriverConnection", "WriteBusy"]

log = logging.getLogger("swarm.pool")


class WriteBusy(Exception):
    """A write tried without waiting found another writer holding the lock: nothing was written, try it again with
    waiting (on a thread)."""


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

    SQLAlchemy compiles each statement once per shape of its parameters (which columns an insert sets, how long each
    expanding list is: rounded up to a power of two by repeating its last value, which leaves an ``IN`` unchanged
    and bounds the shapes) and says where each of the driver's positional parameters comes from
    (``construct_expanded_state``); the dialect's own bind and result processors convert the values. So the rows
    written and read are the ones ``sa.Connection.execute`` writes and reads, without its per-call work (execution
    context, events, result objects), which cost several times the statement itself on a local SQLite file
    (docs/pool.md "Driver-level statements"). ``params``: a dict (one statement; the lists of its expanding parameters
    are ``IN`` lists), or a list of dicts (an executemany); a select's rows come back as named tuples.
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
                if params:
                    plan = _plan(stmt, self.dialect, tuple((k, -1) for k in params[0]), True)
                    cur.executemany(plan.sql, [plan.bind(p) for p in params])
                return []
            expanding = _expanding(stmt)
            params = {k: _padded(v) if k in expanding else v for k, v in params.items()}
            plan = _plan(stmt, self.dialect, tuple((k, len(v) if k in expanding else -1) for k, v in params.items()),
                         False)
            cur.execute(plan.sql, plan.bind(params))
            if plan.row is None:
                return []
            cls, procs = plan.row
            return [cls(*(v if p is None or v is None else p(v) for p, v in zip(procs, r, strict=True)))
                    for r in cur.fetchall()]
        finally:
            cur.close()


class _Slot:
    """Where a positional parameter's value comes from: ``params[key]``, or its ``index``-th item."""

    __slots__ = ("key", "index")

    def __init__(self, key: str, index: int | None) -> None:
        self.key, self.index = key, index


class _Plan:
    """A statement compiled for one shape: the driver's SQL, each parameter's source and bind processor, and for a
    select its row class and result processors."""

    def __init__(self, sql: str, sources: list[Any], procs: list[Callable[[Any], Any] | None], row: Any) -> None:
        self.sql, self.sources, self.procs, self.row = sql, sources, procs, row

    def bind(self, params: dict[str, Any]) -> tuple:
        out = []
        for src, proc in zip(self.sources, self.procs, strict=True):
            if isinstance(src, _Slot):
                v = params[src.key] if src.index is None else params[src.key][src.index]
                out.append(v if proc is None else proc(v))
            else:  # a value the statement itself holds, processed once
                out.append(src[0])
        return tuple(out)


@functools.lru_cache(maxsize=256)
def _expanding(stmt: sa.Executable) -> frozenset[str]:
    """The names of ``stmt``'s expanding (``IN``-list) parameters."""
    return frozenset(b.key for b in visitors.iterate(stmt) if isinstance(b, sa.BindParameter) and b.expanding)


def _padded(values: Any) -> list[Any]:
    """An ``IN`` list at the next power of two in length, its last value repeated (the same rows match)."""
    values = list(values)
    n = 1
    while n < len(values):
        n *= 2
    return values + values[-1:] * (n - len(values)) if values else values


@functools.lru_cache(maxsize=1024)
def _plan(stmt: sa.Executable, dialect: sa.Dialect, shape: tuple[tuple[str, int], ...], many: bool) -> _Plan:
    """``stmt`` compiled for ``shape`` (each parameter's name and list length, -1 for a single value)."""
    compiled = stmt.compile(dialect=dialect, column_keys=[k for k, _ in shape] if many else None)
    slots = {k: [_Slot(k, i) for i in range(n)] if n >= 0 else _Slot(k, None) for k, n in shape}
    state = compiled.construct_expanded_state(slots)
    assert state.positiontup is not None, "driver_sql needs a positional (qmark) driver"
    origin = {name: key for key, names in (state.parameter_expansion or {}).items() for name in names}
    sources: list[Any] = []
    procs: list[Callable[[Any], Any] | None] = []
    for name in state.positiontup:
        bind = compiled.binds[origin.get(name, name)]
        proc = bind.type.dialect_impl(dialect).bind_processor(dialect)
        value = state.parameters[name]
        if isinstance(value, _Slot):
            sources.append(value)
            procs.append(proc)
        else:
            sources.append((value if proc is None else proc(value),))
            procs.append(None)
    row = None
    if isinstance(stmt, sa.Select):
        cols = list(stmt.selected_columns)
        cls = collections.namedtuple("Row", [c.name for c in cols], rename=True)  # type: ignore[misc]
        row = (cls, [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in cols])
    return _Plan(state.statement, sources, procs, row)


NOWAIT_CHECKPOINT_EVERY = 100  # nowait commits between two checkpoints (SQLite's own default: ~1,000 log pages)


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
        self._nowait_lock = threading.Lock()  # one user at a time of the nowait connection
        self._nowait_fairy: Any = None  # that connection (SQLAlchemy's wrapper, detached from the engine's pool)
        self._nowait_commits = 0
        self._checkpointer: threading.Thread | None = None
        with self._tx(write=True) as conn:
            metadata.create_all(conn, checkfirst=True)
        if self.nowait_writes:
            self._open_nowait()

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

    @property
    def nowait_writes(self) -> bool:
        """Whether a write can be tried without waiting (``wait=False``): it then never waits for another writer's
        lock (:class:`WriteBusy` instead) nor checkpoints at commit, so an event loop may run it itself (SQLite)."""
        return bool(self.sql.nowait_setup)

    @contextmanager
    def _driver_write(self, wait: bool = True) -> Iterator[DriverConnection]:
        """One write transaction on a DBAPI connection (``Dialect.driver_begin``: SQLite's takes the write lock up
        front, as ``_tx(write=True)`` does). Only where ``Dialect.driver_sql``. ``wait=False``: on the nowait
        connection (:attr:`nowait_writes`); :class:`WriteBusy` when another writer holds the lock."""
        with self._driver_conn() if wait else self._nowait_conn() as c:
            c.run(self.sql.driver_begin)
            try:
                yield c
                c.run("COMMIT")
            except BaseException:
                if getattr(c.conn, "in_transaction", True):  # some errors end the transaction themselves
                    c.run("ROLLBACK")
                raise
            if not wait:  # still holding the nowait connection's lock
                self._nowait_commits += 1
                if self._nowait_commits % NOWAIT_CHECKPOINT_EVERY == 0:
                    self._checkpoint_soon()

    def _open_nowait(self) -> None:
        """Open the nowait connection (``Dialect.nowait_setup``), detached from the engine's pool: ours until
        :meth:`close` (the pool opens another in its place). Done when the database opens, off any event loop: a
        connection's first pragmas may wait for the file's lock."""
        fairy = self.engine.raw_connection()
        fairy.detach()
        cur = fairy.dbapi_connection.cursor()
        for sql in self.sql.nowait_setup:
            cur.execute(sql)
        cur.close()
        self._nowait_fairy = fairy

    @contextmanager
    def _nowait_conn(self) -> Iterator[DriverConnection]:
        """The nowait connection; its errors raised as ``_driver_conn``'s, a busy lock as :class:`WriteBusy` (and
        another thread using it is busy too). One that a failure left inside a transaction is closed, not reused."""
        if not self.nowait_writes:
            raise ValueError(f"the {self.sql.name} pool engine has no writes without waiting (nowait_writes is False)")
        if not self._nowait_lock.acquire(blocking=False):
            raise WriteBusy("another thread is writing on the nowait connection")
        error = self.engine.dialect.loaded_dbapi.Error
        try:
            if self._nowait_fairy is None:  # after close(), or a failure
                self._open_nowait()
            try:
                yield DriverConnection(self._nowait_fairy.dbapi_connection, self.engine.dialect)
            except BaseException:
                if getattr(self._nowait_fairy.dbapi_connection, "in_transaction", False):  # a failed ROLLBACK
                    self._nowait_fairy.close()
                    self._nowait_fairy = None
                raise
        except error as e:
            if self.sql.busy(e):
                raise WriteBusy(f"another writer holds the lock: {e}") from e
            raise sa.exc.DBAPIError.instance(None, None, e, error) from e
        finally:
            self._nowait_lock.release()

    def _checkpoint_soon(self) -> None:
        """Checkpoint the log on a thread of the pool's own (the nowait connection never does it at commit), unless
        one is still running: ``Dialect.checkpoint_sql`` does not wait for readers or writers."""
        if self._checkpointer is not None and self._checkpointer.is_alive():
            return
        self._checkpointer = threading.Thread(target=self._checkpoint, name="swarm-pool-checkpoint", daemon=True)
        self._checkpointer.start()

    def _checkpoint(self) -> None:
        try:
            with self._driver_conn() as c:
                c.run(self.sql.checkpoint_sql)
        except Exception:  # noqa: BLE001 - the next one tries again; the log only grows meanwhile
            log.warning("checkpointing the pool's log failed", exc_info=True)

    @contextmanager
    def _driver_conn(self) -> Iterator[DriverConnection]:
        """A DBAPI connection of the engine's own pool (its connect settings, its pool's rules), for one use: a read
        on it is one statement, its own snapshot. A driver's error is raised as SQLAlchemy's (``sa.exc.IntegrityError``,
        ...), as the other path raises it. Only where ``Dialect.driver_sql``."""
        error = self.engine.dialect.loaded_dbapi.Error
        fairy = self.engine.raw_connection()
        try:
            yield DriverConnection(fairy.dbapi_connection, self.engine.dialect)
        except error as e:
            raise sa.exc.DBAPIError.instance(None, None, e, error) from e
        finally:
            fairy.close()  # back to the pool (which rolls back whatever a failure left open)

    def close(self) -> None:
        """Close every connection of the engine (a running checkpoint finishes first)."""
        with self._nowait_lock:
            if self._checkpointer is not None:
                self._checkpointer.join()
            if self._nowait_fairy is not None:
                self._nowait_fairy.close()  # detached: really closed
                self._nowait_fairy = None
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

