"""The SQLite pool engine (``sqlite:///file.db``): a single file, one writer at a time.

WAL journal (readers never block the writer), ``busy_timeout`` so concurrent writers in other threads
or processes wait instead of failing, ``synchronous=NORMAL`` (a committed transaction survives a
killed process; a power cut may lose the last few commits but never corrupts the file). Every write
transaction starts with ``BEGIN IMMEDIATE``: it takes the write lock up front, so two writers
serialise instead of one failing on lock upgrade. That lock also serialises lease claims and makes
row locks unnecessary. A gateway's step writes may skip both waits (``nowait_setup``: no busy timeout, no
checkpoint at commit; docs/pool.md "Writes without waiting"). JSON goes through the JSON1 functions; the planner has
no statistics, so walks over the newest steps name their index (``INDEXED BY``).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from pydantic import Field
from sqlalchemy.dialects import sqlite

from swarm.errors import ValidationError
from swarm.pool.engines import ENGINES, Dialect, EngineSection
from swarm.settings import derive

__all__ = ["SQLite", "SQLiteSection"]

PageSize = Literal[4096, 8192, 16384, 32768, 65536]


class SQLite(Dialect):
    """SQLite: one file, WAL, ``BEGIN IMMEDIATE`` writes."""

    name = "sqlite"
    single_writer = True  # BEGIN IMMEDIATE holds the database's write lock: no row locks needed
    driver_sql = True  # a gateway's episode heads and step writes (swarm/pool/heads.py, store.py)
    driver_begin = "BEGIN IMMEDIATE"
    # a gateway's step writes run on its event loop (swarm/gateway/state.py): never wait for the lock, never
    # checkpoint at commit; the pool checkpoints on a thread of its own instead (Database._checkpoint_soon)
    nowait_setup = ("PRAGMA busy_timeout=0", "PRAGMA wal_autocheckpoint=0")
    checkpoint_sql = "PRAGMA wal_checkpoint(PASSIVE)"

    def __init__(self, busy_timeout_s: Annotated[float, Field(gt=0)] = 60.0, pool_size: Annotated[int, Field(ge=1)] = 8,
                 max_overflow: Annotated[int, Field(ge=0)] = 16, page_size: PageSize = 4096) -> None:
        """``busy_timeout_s``: how long a writer waits for another's lock; ``pool_size`` / ``max_overflow``:
        connections kept / opened beyond those per process; ``page_size``: bytes a database page of a *new*
        file (an existing file keeps its own). 16 KB pages store a step in 5-20% fewer bytes (rows are 1-3 KB),
        but a call's commit writes 3.2x the WAL bytes and ~1.2x the CPU (docs/pool.md "Bytes per step"), so the
        default keeps SQLite's 4 KB for the gateway's one-call transactions."""
        self.busy_timeout_s, self.pool_size, self.max_overflow = busy_timeout_s, pool_size, max_overflow
        self.page_size = page_size

    def connect(self, url: str) -> sa.Engine:
        if sa.engine.make_url(url).database in (None, "", ":memory:"):
            raise ValidationError("url: the pool needs a SQLite file (in-memory databases are per connection)")
        engine = sa.create_engine(url, connect_args={"timeout": self.busy_timeout_s, "check_same_thread": False},
                                  pool_size=self.pool_size, max_overflow=self.max_overflow)
        self.setup(engine)
        return engine

    def setup(self, engine: sa.Engine) -> None:
        """The pragmas on each new connection, and ``BEGIN`` / ``BEGIN IMMEDIATE`` as the pool's transaction
        asks (:func:`swarm.pool.engine.transaction` sets ``conn.info["swarm_write"]``)."""
        busy_ms = int(self.busy_timeout_s * 1000)

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # the driver's transaction handling is off; we emit BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA page_size={int(self.page_size)}")  # before WAL: only an empty file takes it
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=OFF")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.pop("swarm_write", False) else "BEGIN")

    def busy(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)  # extended codes (SQLITE_BUSY_SNAPSHOT, ...) keep the base
        return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY

    def _insert_ignore(self, table: sa.Table) -> sa.Insert:
        return _insert_ignore(table)

    def analyze(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql("PRAGMA optimize")

    def json_eq(self, col: sa.ColumnElement, key: str, value: Any) -> sa.ColumnElement:
        path = _path(key)
        kind = sa.func.json_type(col, path)
        val = sa.func.json_extract(col, path)
        if value is None:
            return kind == "null"
        if isinstance(value, bool):
            return kind == ("true" if value else "false")
        if isinstance(value, int | float):
            return sa.and_(kind.in_(["integer", "real"]), val == value)
        if isinstance(value, str):
            return sa.and_(kind == "text", val == value)
        if isinstance(value, dict | list):
            return val == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        raise ValidationError(f"metadata: value for {key!r} must be JSON, got {type(value).__name__}")

    def json_has(self, col: sa.ColumnElement, key: str) -> sa.ColumnElement:
        return sa.func.json_type(col, _path(key)).is_not(None)

    def json_text(self, col: sa.ColumnElement, key: str) -> sa.ColumnElement:
        return sa.func.json_extract(col, _path(key))

    def floor_div(self, col: sa.ColumnElement, width: float) -> sa.ColumnElement:
        return sa.cast(col / width, sa.Integer)  # SQLite truncates towards zero (times are positive)

    def rows(self, conn: sa.Connection, q: sa.Select, index: str | None = None) -> list[dict[str, Any]]:
        """``q`` run with ``steps INDEXED BY index``.

        SQLite's planner (no statistics) prefers e.g. the task or the policy index and then sorts or
        filters every step of that task / policy, up to the whole pool, where walking the created_at
        index (or the unconsumed steps' partial index) stops after one page. SQLAlchemy cannot render
        ``INDEXED BY``, so it is added to the compiled statement here.
        """
        if index is None:
            return super().rows(conn, q)
        compiled = q.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        sql = str(compiled)
        marker = "FROM steps JOIN episodes"
        if sql.count(marker) != 1 or not compiled.positiontup:
            return super().rows(conn, q)
        sql = sql.replace(marker, f"FROM steps INDEXED BY {index} JOIN episodes", 1)
        params = tuple(compiled.params[k] for k in compiled.positiontup)
        return [dict(r) for r in conn.exec_driver_sql(sql, params).mappings()]


def _path(key: str) -> str:
    if '"' in key or "\\" in key:
        raise ValidationError(f"metadata: key {key!r} may not contain quotes or backslashes")
    return f'$."{key}"'


@functools.cache
def _insert_ignore(table: sa.Table) -> sa.Insert:
    return sqlite.insert(table).on_conflict_do_nothing()


@ENGINES.declare("sqlite")
class SQLiteSection(derive(SQLite, base=EngineSection)):  # type: ignore[misc]
    """``engine: sqlite`` (any ``sqlite:///`` URL): the pool in one SQLite file."""

    def build(self) -> SQLite:
        return SQLite(**self.args())
