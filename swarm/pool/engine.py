"""Database connections for the pool: one SQLAlchemy engine per URL, transactions, and
:class:`Database`, the base every part of :class:`swarm.pool.Pool` builds on (engine, dialect, ``_tx``).

SQLite: WAL journal (readers never block the writer), ``busy_timeout`` so concurrent writers
in other threads or processes wait instead of failing, ``synchronous=NORMAL`` (a committed
transaction survives a killed process; a power cut may lose the last few commits but never
corrupts the file). Every write transaction starts with ``BEGIN IMMEDIATE``: it takes the
write lock up front, so two writers serialise instead of one failing on lock upgrade.

PostgreSQL (``postgresql+psycopg://``): READ COMMITTED; lease claims additionally take a
transaction-scoped advisory lock (see :func:`claim_lock`).

This module does not know the schema beyond creating it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from swarm.errors import ValidationError
from swarm.pool.schema import metadata

__all__ = ["Database", "make_engine", "transaction", "insert_ignore", "claim_lock"]

_BUSY_TIMEOUT_S = 60.0
_CLAIM_LOCK_KEY = 0x5357_4152_4D50  # "SWARMP": one advisory lock id for lease claims


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url`` with the tables created; ValidationError for other backends."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as e:
        raise ValidationError(f"url: not a database URL: {url!r}") from e
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValidationError("url: the pool needs a SQLite file (in-memory databases are per connection)")
        engine = sa.create_engine(url, connect_args={"timeout": _BUSY_TIMEOUT_S, "check_same_thread": False},
                                  pool_size=8, max_overflow=16)
        _sqlite_setup(engine)
    elif backend == "postgresql":
        engine = sa.create_engine(url, pool_size=8, max_overflow=16, pool_pre_ping=True)
    else:
        raise ValidationError(f"url: unsupported backend {backend!r}; use sqlite:/// or postgresql+psycopg://")
    with transaction(engine, write=True) as conn:
        metadata.create_all(conn, checkfirst=True)
    return engine


def _sqlite_setup(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        # the driver's own transaction handling is off; we emit BEGIN ourselves (see _begin)
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=OFF")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(conn.info.pop("swarm_begin", "BEGIN"))


@contextmanager
def transaction(engine: sa.Engine, write: bool = False) -> Iterator[sa.Connection]:
    """One transaction: committed on success, rolled back on any exception."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.info["swarm_begin"] = "BEGIN IMMEDIATE" if write else "BEGIN"
        with conn.begin():
            yield conn


def insert_ignore(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """INSERT rows, silently skipping those whose primary key already exists."""
    if not rows:
        return
    conn.execute(_insert_ignore(conn.dialect.name, table), rows)


@functools.cache
def _insert_ignore(dialect: str, table: sa.Table) -> sa.Insert:
    return (sqlite if dialect == "sqlite" else postgresql).insert(table).on_conflict_do_nothing()


def claim_lock(conn: sa.Connection) -> None:
    """Serialise lease claims across processes and machines for the rest of this transaction.

    SQLite needs nothing (BEGIN IMMEDIATE already holds the database's write lock); on
    PostgreSQL a transaction-scoped advisory lock makes the select-then-claim atomic, while
    ingestion, acks and reads carry on unblocked.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _CLAIM_LOCK_KEY})


class Database:
    """An open pool database: its engine and dialect, transactions, planner statistics; the Pool's base."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self._stats_lock = threading.Lock()
        self._new_since_analyze = 0
        self._steps_at_analyze = 0

    def _tx(self, write: bool = False) -> AbstractContextManager[sa.Connection]:
        return transaction(self.engine, write=write)

    def optimize(self) -> None:
        """Refresh the query planner's statistics (PostgreSQL ANALYZE; SQLite PRAGMA optimize).

        The pool also does this by itself on PostgreSQL whenever the steps it wrote grow the
        table by a fifth (at least 1,000 steps) since the last refresh, so lease and filter
        plans stay index-driven even where autovacuum is off or has not run yet.
        """
        with self.engine.connect() as c:
            c.exec_driver_sql("ANALYZE steps, episodes, labels, leases" if self.dialect == "postgresql"
                              else "PRAGMA optimize")
            c.commit()

    def _maybe_analyze(self, n_new: int) -> None:
        if self.dialect != "postgresql" or n_new == 0:
            return
        with self._stats_lock:
            self._new_since_analyze += n_new
            if self._new_since_analyze < max(1000, self._steps_at_analyze // 5):
                return
            self._steps_at_analyze += self._new_since_analyze
            self._new_since_analyze = 0
        self.optimize()

    def close(self) -> None:
        """Close every connection of the engine."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
