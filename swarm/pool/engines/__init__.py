"""Pool engines: one module per database holds everything the pool does differently on it.

An engine is a :class:`Dialect` subclass (how to connect, lock, upsert, query JSON, refresh the
planner's statistics) and its config section, declared once in one module beside it::

    class SQLite(Dialect):
        def __init__(self, busy_timeout_s: float = 60.0, pool_size: int = 8) -> None: ...

    @ENGINES.declare("sqlite")
    class SQLiteSection(derive(SQLite, base=EngineSection)):
        def build(self) -> SQLite:
            return SQLite(**self.args())

The section's fields are the dialect's constructor parameters (:func:`swarm.settings.derive`) plus the
pool's own ``url`` and ``block_size``; its ``build`` is the engine's factory. The built-in kinds are the
modules of this package (``sqlite``, ``postgresql``), picked from the URL's scheme; any other is a dotted
module path that declares itself (``@ENGINES.declare(__name__)``), named with ``engine=``.
:func:`swarm.pool.open_pool` is the one entry point: ``open_pool(url, engine=None, **settings)``.

Nothing here knows a concrete database or the schema; the pool's modules call the :class:`Dialect` methods
and never test a dialect's name.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pydantic
import sqlalchemy as sa
from pydantic import Field

from swarm.errors import ConfigError, ValidationError
from swarm.explain import explain
from swarm.settings import Registry, Section

__all__ = ["Dialect", "EngineSection", "ENGINES", "engine_kind", "engine_section"]


class Dialect:
    """What one database does its own way, behind small methods the pool calls.

    The defaults are portable SQL (SQLAlchemy's generic constructs); an engine overrides what its
    database does differently. ``name`` is SQLAlchemy's dialect name of the engines it makes.
    """

    name: ClassVar[str] = ""
    auto_analyze: ClassVar[bool] = False  # the pool refreshes planner statistics as steps arrive (see Database)
    # a write transaction excludes every other writer: no row locks are needed, and callers may queue their writers
    single_writer: ClassVar[bool] = False
    # the gateway's hot statements (episode heads, step writes) run straight on a DBAPI connection of the engine's
    # pool (swarm.pool.engine.DriverConnection; the driver must take positional parameters): a local file answers
    # them in microseconds, and SQLAlchemy's per-call work (execution context, events, result objects) costs
    # several times that
    driver_sql: ClassVar[bool] = False
    driver_begin: ClassVar[str] = "BEGIN"  # how such a write transaction starts
    # a driver write can be tried *without waiting* (``Database._driver_write(wait=False)``): on a connection these
    # statements set up so it neither waits for another writer's lock nor checkpoints its log at commit, the two
    # things that can stall a local file's write for milliseconds; empty: no such writes (the caller uses a thread).
    # The connection is the pool's own, opened beside the engine's: an engine with one connection only (an in-memory
    # SQLite) must leave this empty
    nowait_setup: ClassVar[tuple[str, ...]] = ()
    checkpoint_sql: ClassVar[str] = ""  # copies such a connection's committed log into the database, not waiting

    def busy(self, exc: BaseException) -> bool:
        """Whether a driver error says another writer holds the lock (a write tried without waiting did nothing)."""
        return False

    # ------------------------------------------------------------------ connecting
    def connect(self, url: str) -> sa.Engine:
        """A SQLAlchemy engine for ``url`` (ValidationError when this engine cannot open it)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ transactions and locks
    def claim_lock(self, conn: sa.Connection) -> None:
        """Serialise lease and policy claims across processes for the rest of this transaction.

        Default: nothing (a database whose write transactions already exclude each other)."""

    def lock_rows(self, q: sa.Select) -> sa.Select:
        """``q`` locking the rows it reads until the transaction ends (``FOR UPDATE``; ``q`` itself on a
        ``single_writer`` engine)."""
        return q if self.single_writer else q.with_for_update()

    def insert_ignore(self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        """INSERT ``rows``, silently skipping those whose primary key already exists."""
        if rows:
            conn.execute(self._insert_ignore(table), rows)

    def _insert_ignore(self, table: sa.Table) -> sa.Insert:
        raise NotImplementedError

    def add_column(self, conn: sa.Connection, table: sa.Table, column: sa.Column) -> None:
        """Add ``column`` (nullable, as declared on ``table``) to the existing table: how an older pool gains
        a column (:func:`swarm.pool.schema.upgrade`). Default: a plain ``ALTER TABLE ... ADD COLUMN``."""
        conn.exec_driver_sql(self._add_column_sql(conn, table, column))

    def _add_column_sql(self, conn: sa.Connection, table: sa.Table, column: sa.Column, if_not_exists: str = "") -> str:
        prep = conn.dialect.identifier_preparer
        kind = column.type.compile(dialect=conn.dialect)
        return f"ALTER TABLE {prep.format_table(table)} ADD COLUMN {if_not_exists}{prep.format_column(column)} {kind}"

    def analyze(self, conn: sa.Connection) -> None:
        """Refresh the query planner's statistics of the pool's tables."""

    # ------------------------------------------------------------------ expressions
    def json_eq(self, col: sa.ColumnElement, key: str, value: Any) -> sa.ColumnElement:
        """``col[key] == value`` for a JSON object column (a JSON null matches ``None``)."""
        raise NotImplementedError

    def json_has(self, col: sa.ColumnElement, key: str) -> sa.ColumnElement:
        """Whether the JSON object in ``col`` has ``key``."""
        raise NotImplementedError

    def json_text(self, col: sa.ColumnElement, key: str) -> sa.ColumnElement:
        """``col[key]`` as text (None when absent)."""
        raise NotImplementedError

    def in_ids(self, col: sa.ColumnElement, ids: list[str]) -> sa.ColumnElement:
        """``col IN ids`` with one bound parameter for the whole list, however long.

        Default: a JSON text bound once and expanded by the database (works where ``json_each`` does)."""
        each = sa.func.json_each(sa.bindparam(None, json.dumps(list(ids)), type_=sa.Text)).table_valued("value")
        return col.in_(sa.select(each.c.value))

    def floor_div(self, col: sa.ColumnElement, width: float) -> sa.ColumnElement:
        """``floor(col / width)`` as an integer (``col`` positive)."""
        return sa.cast(sa.func.floor(col / width), sa.BigInteger)

    def rows(self, conn: sa.Connection, q: sa.Select, index: str | None = None) -> list[dict[str, Any]]:
        """``q``'s rows as dicts; ``index`` names the steps index a planner without statistics should walk
        (a hint: an engine whose planner picks well ignores it)."""
        return [dict(r) for r in conn.execute(q).mappings()]


class EngineSection(Section):
    """A ``pool`` section: the pool's own settings, and (in a subclass) its engine's, the dialect's parameters."""

    url: str = "sqlite:///swarm_pool.db"
    block_size: int = Field(default=64, ge=1)  # token block length of the content-addressed store

    def build(self) -> Dialect:
        """This engine's :class:`Dialect` with the section's settings (the pool opens it on ``url``)."""
        raise NotImplementedError


ENGINES = Registry(point="pool", key="engine", home="swarm.pool.engines", base=EngineSection)


def engine_kind(url: str) -> str:
    """The built-in engine a URL names by its scheme (``sqlite``, ``postgresql``); ValidationError when
    ``url`` is not a database URL."""
    try:
        return sa.engine.make_url(url).get_backend_name()
    except sa.exc.ArgumentError as e:
        raise ValidationError(f"url: not a database URL: {url!r}") from e


def engine_section(url: str, engine: str | None = None, **settings: Any) -> EngineSection:
    """The validated section of ``engine`` (default: the URL's scheme) for ``url`` and ``settings``.

    A bad or unknown setting is a ConfigError naming the key (and the close one); an unknown URL scheme is a
    ValidationError."""
    kind = engine or engine_kind(url)
    try:
        cls = ENGINES.get(kind)
    except ConfigError as e:
        if engine is not None:
            raise
        raise ValidationError(f"url: unsupported database {kind!r}; use sqlite:///path/pool.db or "
                              "postgresql+psycopg://user@host:5432/db (or a module declaring a pool engine: "
                              "pool.engine=...)") from e
    data = {ENGINES.key: kind, "url": url, **settings}
    try:
        return cls.model_validate(data)  # type: ignore[return-value]
    except pydantic.ValidationError as e:
        raise ConfigError(explain(e, cls, data, prefix=ENGINES.point)) from None

