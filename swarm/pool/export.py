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


def _schema(with_tokens: bool) -> dict[str, Any]:
    import polars as pl

    schema: dict[str, Any] = {
        "step_id": pl.String,
        "episode_id": pl.String,
        "index": pl.Int64,
        "parent_step_id": pl.String,
        "task": pl.String,
        "group_id": pl.String,
        "policy": pl.String,
        "policy_version": pl.Int64,
        "source": pl.String,
        "response_id": pl.String,
        "reward": pl.Float64,
        "reward_final": pl.Boolean,
        "episode_status": pl.String,
        "episode_type": pl.String,
        "created_at": pl.Float64,
        "prompt_len": pl.Int64,
        "response_len": pl.Int64,
        "consumed_version": pl.Int64,
        "finish_reason": pl.String,
        "response_text": pl.String,
        "metadata": pl.String,
    }
    if with_tokens:
        schema |= {
            "prompt_ids": pl.List(pl.UInt32),
            "response_ids": pl.List(pl.UInt32),
            "response_logprobs": pl.List(pl.Float64),
        }
    return schema


class ExportMixin(Database):
    """to_polars / export_parquet for :class:`swarm.pool.store.Pool`."""

    def to_polars(self, filter: StepFilter | None = None, with_tokens: bool = False) -> pl.DataFrame:
        import polars as pl

        f = coerce(StepFilter, filter or StepFilter(), "filter")
        schema = _schema(with_tokens)
        cols: dict[str, list] = {k: [] for k in schema}
        token_cols = [S.c.block_keys, S.c.tail, S.c.logprobs] if with_tokens else []
        base = (
            sa.select(
                S.c.step_id,
                S.c.episode_id,
                S.c.idx,
                S.c.parent_step_id,
                S.c.task,
                S.c.group_id,
                S.c.policy,
                S.c.policy_version,
                S.c.source,
                S.c.response_id,
                REWARD.label("r"),
                REWARD_FINAL.label("final"),
                E.c.status,
                E.c.type,
                S.c.created_at,
                S.c.length,
                S.c.n_prompt,
                S.c.consumed_version,
                S.c.body,
                S.c.meta,
                *token_cols,
            )
            .select_from(JOIN)
            .where(*step_conditions(f, self.dialect))
            .order_by(S.c.created_at, S.c.step_id)
        )
        offset = 0
        while True:
            with self._tx() as c:
                rows = list(c.execute(base.limit(_PAGE).offset(offset)).mappings())
                tokens = load_tokens(c, rows) if with_tokens else {}
            for r in rows:
                body = r["body"]
                vals = [
                    r["step_id"],
                    r["episode_id"],
                    r["idx"],
                    r["parent_step_id"],
                    r["task"],
                    r["group_id"],
                    r["policy"],
                    r["policy_version"],
                    r["source"],
                    r["response_id"],
                    r["r"],
                    bool(r["final"]),
                    r["status"],
                    r["type"],
                    r["created_at"],
                    r["n_prompt"],
                    r["length"] - r["n_prompt"],
                    r["consumed_version"],
                    body.get("finish_reason"),
                    body.get("response_text"),
                    json.dumps(r["meta"], sort_keys=True),
                ]
                if with_tokens:
                    ids, n = tokens[r["step_id"]], r["n_prompt"]
                    lp = None if r["logprobs"] is None else unpack_floats(r["logprobs"])
                    vals += [ids[:n], ids[n:], lp]
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
