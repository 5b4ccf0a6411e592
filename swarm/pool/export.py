"""Steps as a polars DataFrame or a Parquet file, for analysis outside the pool.

One row per step: its scalar fields, the resolved reward and reward status, its episode's
status and type, lengths, consumption, and (``with_tokens``) the exact prompt ids, response
ids and logprobs as list columns. Reads in pages, so exports of large pools stay bounded in
memory per page (the DataFrame itself is, of course, whole). polars is imported lazily.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from swarm.pool.blocks import unpack_floats
from swarm.pool.checks import coerce
from swarm.pool.engine import Database
from swarm.pool.filter import StepFilter
from swarm.pool.query import JOIN, REWARD, REWARD_FINAL, step_conditions
from swarm.pool.rows import load_tokens
from swarm.pool.schema import episodes as E
from swarm.pool.schema import steps as S

if TYPE_CHECKING:
    import polars as pl

__all__ = ["ExportMixin"]

_PAGE = 2000
# the scalar columns, in DataFrame order: name -> (polars dtype, what SELECT reads it from)
_SCALARS = {
    "step_id": ("String", S.c.step_id), "episode_id": ("String", S.c.episode_id), "index": ("Int64", S.c.idx),
    "parent_step_id": ("String", S.c.parent_step_id), "task": ("String", S.c.task),
    "group_id": ("String", S.c.group_id), "policy": ("String", S.c.policy),
    "policy_version": ("Int64", S.c.policy_version), "source": ("String", S.c.source),
    "response_id": ("String", S.c.response_id), "reward": ("Float64", REWARD),
    "reward_final": ("Boolean", sa.cast(REWARD_FINAL, sa.Boolean)), "episode_status": ("String", E.c.status),
    "episode_type": ("String", E.c.type), "created_at": ("Float64", S.c.created_at),
    "prompt_len": ("Int64", S.c.n_prompt), "response_len": ("Int64", S.c.length - S.c.n_prompt),
    "consumed_version": ("Int64", S.c.consumed_version),
}
_BODY = ("finish_reason", "response_text")  # then these, from the step's JSON body, and its metadata as JSON


def _schema(with_tokens: bool) -> dict[str, Any]:
    import polars as pl

    schema: dict[str, Any] = {k: getattr(pl, t) for k, (t, _) in _SCALARS.items()}
    schema |= {k: pl.String for k in (*_BODY, "metadata")}
    if with_tokens:
        schema |= {"prompt_ids": pl.List(pl.UInt32), "response_ids": pl.List(pl.UInt32),
                   "response_logprobs": pl.List(pl.Float64)}
    return schema


class ExportMixin(Database):
    """to_polars / export_parquet for :class:`swarm.pool.Pool`."""

    def to_polars(self, filter: StepFilter | None = None, with_tokens: bool = False) -> pl.DataFrame:
        """The matching steps, one row each, oldest first (see the module docstring for the columns)."""
        import polars as pl

        f = coerce(StepFilter, filter or StepFilter(), "filter")
        schema = _schema(with_tokens)
        cols: dict[str, list] = {k: [] for k in schema}
        token_cols = [S.c.block_keys, S.c.tail, S.c.logprobs] if with_tokens else []
        base = (sa.select(*(e.label(k) for k, (_, e) in _SCALARS.items()), S.c.body, S.c.meta, *token_cols)
                .select_from(JOIN).where(*step_conditions(f, self.dialect)).order_by(S.c.created_at, S.c.step_id))
        offset = 0
        while True:
            with self._tx() as c:
                rows = list(c.execute(base.limit(_PAGE).offset(offset)).mappings())
                tokens = load_tokens(c, rows) if with_tokens else {}
            for r in rows:
                vals = [r[k] for k in _SCALARS] + [r["body"].get(k) for k in _BODY]
                vals.append(json.dumps(r["meta"], sort_keys=True))
                if with_tokens:
                    ids, n = tokens[r["step_id"]], r["prompt_len"]
                    vals += [ids[:n], ids[n:], None if r["logprobs"] is None else unpack_floats(r["logprobs"])]
                for k, v in zip(schema, vals, strict=True):
                    cols[k].append(v)
            if len(rows) < _PAGE:
                break
            offset += _PAGE
        return pl.DataFrame(cols, schema=schema)

    def export_parquet(self, filter: StepFilter | None, path: str | Path, with_tokens: bool = True) -> int:
        """Write the matching steps (with tokens by default: a lossless dataset) to ``path``; returns rows."""
        df = self.to_polars(filter, with_tokens=with_tokens)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        df.write_parquet(path)
        return df.height
