"""The PostgreSQL pool engine (``postgresql+psycopg://``): many machines, many writers.

READ COMMITTED; rows a write decides on are locked (``FOR UPDATE``, taken in id order so concurrent
batches queue and never deadlock); lease and policy claims additionally take one transaction-scoped
advisory lock (:meth:`PostgreSQL.claim_lock`), while ingestion, acks and reads carry on unblocked. JSON
metadata is JSONB; long id lists bind as one array (``= ANY(:ids)``: a statement may bind at most
65,535 parameters). The pool refreshes the planner's statistics itself as steps arrive
(``auto_analyze``), so plans stay index-driven even where autovacuum has not run yet.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

import sqlalchemy as sa
from pydantic import Field
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from swarm.pool.engines import ENGINES, Dialect, EngineSection
from swarm.settings import derive

__all__ = ["PostgreSQL", "PostgreSQLSection"]

_CLAIM_LOCK_KEY = 0x5357_4152_4D50  # "SWARMP": one advisory lock id for lease claims


class PostgreSQL(Dialect):
    """PostgreSQL: row locks, an advisory lock for claims, JSONB, array binds."""

    name = "postgresql"
    auto_analyze = True

    def __init__(self, pool_size: Annotated[int, Field(ge=1)] = 8, max_overflow: Annotated[int, Field(ge=0)] = 16,
                 pre_ping: bool = True, jit: bool = False) -> None:
        """``pool_size`` / ``max_overflow``: connections kept / opened beyond those per process; ``pre_ping``:
        test a pooled connection before use (a server restart then costs no failed call); ``jit``: let the
        server JIT-compile the pool's queries. Off by default: they are short, and the chain walk of a lease's
        token blocks (a recursive query the planner over-estimates) spent ~25 ms compiling for a 1 ms walk."""
        self.pool_size, self.max_overflow, self.pre_ping, self.jit = pool_size, max_overflow, pre_ping, jit

    def connect(self, url: str) -> sa.Engine:
        args = {} if self.jit else {"options": "-c jit=off"}
        return sa.create_engine(url, pool_size=self.pool_size, max_overflow=self.max_overflow,
                                pool_pre_ping=self.pre_ping, connect_args=args)

    def claim_lock(self, conn: sa.Connection) -> None:
        """A transaction-scoped advisory lock: the select-then-claim of a lease is atomic across machines."""
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _CLAIM_LOCK_KEY})

    def _insert_ignore(self, table: sa.Table) -> sa.Insert:
        return _insert_ignore(table)

    def add_column(self, conn: sa.Connection, table: sa.Table, column: sa.Column) -> None:
        """``ADD COLUMN IF NOT EXISTS``: two processes opening one older pool at once both get through."""
        conn.exec_driver_sql(self._add_column_sql(conn, table, column, if_not_exists="IF NOT EXISTS "))

    def analyze(self, conn: sa.Connection) -> None:
        conn.exec_driver_sql("ANALYZE steps, episodes, labels, leases, blocks")

    def json_eq(self, col: sa.ColumnElement, key: str, value: Any) -> sa.ColumnElement:
        return col.op("->", return_type=JSONB)(sa.literal(key)) == sa.cast(sa.literal(json.dumps(value)), JSONB)

    def json_has(self, col: sa.ColumnElement, key: str) -> sa.ColumnElement:
        return col.op("?", return_type=sa.Boolean)(sa.literal(key))

    def json_text(self, col: sa.ColumnElement, key: str) -> sa.ColumnElement:
        return col.op("->>")(sa.literal(key))

    def in_ids(self, col: sa.ColumnElement, ids: list[str]) -> sa.ColumnElement:
        return col == sa.any_(sa.cast(sa.bindparam(None, list(ids), type_=ARRAY(sa.Text)), ARRAY(sa.Text)))


@functools.cache
def _insert_ignore(table: sa.Table) -> sa.Insert:
    return postgresql.insert(table).on_conflict_do_nothing()


@ENGINES.declare("postgresql")
class PostgreSQLSection(derive(PostgreSQL, base=EngineSection)):  # type: ignore[misc]
    """``engine: postgresql`` (any ``postgresql+<driver>://`` URL): the pool shared by many machines."""

    def build(self) -> PostgreSQL:
        return PostgreSQL(**self.args())
