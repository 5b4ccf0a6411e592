"""Steps leaving the pool: a polars DataFrame, a Parquet file, or chat-format JSONL for SFT.

Parquet / polars: one row per step: its scalar fields, the resolved reward and reward status, its
episode's status and type, lengths, consumption, and (``with_tokens``) the exact prompt ids, response
ids and logprobs as list columns. Reads in pages, so exports of large pools stay bounded in
memory per page (the DataFrame itself is, of course, whole). polars is imported lazily.

Chat JSONL (:meth:`ExportMixin.export_chat_jsonl`): one row per *branch*: a matching step that no other
matching step of its episode names as its parent (the leaf of a step chain), written as its prompt
messages plus its reply, ``{"messages": [...], "reward", "episode_id", "step_id", "policy_version",
"task"}``. A step recorded as bare tokens (no prompt messages or no reply text) has no chat form and is
left out. Read one episode at a time, so memory stays bounded by the largest episode.

Also the command line ``python -m swarm.pool.export --pool URL (--curation NAME[@V] | --filter JSON)
--format jsonl|parquet [--min-reward X] OUT``. It does not tokenize or decode.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from swarm.pool.blocks import unpack_floats
from swarm.pool.checks import coerce
from swarm.pool.engine import Database
from swarm.pool.filter import StepFilter
from swarm.pool.query import JOIN, REWARD, REWARD_FINAL, step_conditions
from swarm.pool.rows import ORDERS, load_tokens, read_steps
from swarm.pool.schema import episodes as E
from swarm.pool.schema import steps as S
from swarm.records import Step

if TYPE_CHECKING:
    import polars as pl

__all__ = ["ExportMixin", "chat_row", "main"]

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
                .select_from(JOIN).where(*step_conditions(f, self.sql)).order_by(S.c.created_at, S.c.step_id))
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

    def export_chat_jsonl(self, filter: StepFilter | None, path: str | Path, min_reward: float | None = None) -> int:
        """Write the matching branches as chat JSONL (see the module docstring); returns rows.

        ``min_reward``: only branches whose (resolved) reward is at least this (a branch without a reward
        is then left out too).
        """
        f = coerce(StepFilter, filter or StepFilter(), "filter")
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        n = 0
        with out.open("w", encoding="utf-8") as fh:
            for episode in self._episodes_of(f):
                parents = {s.parent_step_id for s in episode}
                for s in episode:
                    if s.step_id in parents or (min_reward is not None and (s.reward is None or s.reward < min_reward)):
                        continue
                    row = chat_row(s)
                    if row is not None:
                        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                        n += 1
        return n

    def _episodes_of(self, f: StepFilter) -> Iterator[list[Step]]:
        """The matching steps (without tokens), one episode's at a time, in index order."""
        episode: list[Step] = []
        offset = 0
        while True:
            with self._tx() as c:
                page = read_steps(c, step_conditions(f, self.sql), False, ORDERS["episode"], _PAGE, offset)
            for s in page:
                if episode and s.episode_id != episode[0].episode_id:
                    yield episode
                    episode = []
                episode.append(s)
            if len(page) < _PAGE:
                break
            offset += _PAGE
        if episode:
            yield episode


def chat_row(s: Step) -> dict[str, Any] | None:
    """One step as an SFT row: its prompt messages + its reply; None without messages or reply text."""
    if not s.prompt_messages or s.response_text is None:
        return None
    reply: dict[str, Any] = {"role": "assistant", "content": s.response_text}
    if s.tool_calls:
        reply["tool_calls"] = s.tool_calls
    return {"messages": [*s.prompt_messages, reply], "reward": s.reward, "episode_id": s.episode_id,
            "step_id": s.step_id, "policy_version": s.policy_version, "task": s.task}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m swarm.pool.export",
                                description="Export a curated set of steps as chat JSONL (SFT) or Parquet.")
    p.add_argument("--pool", required=True, help="the pool URL: sqlite:///pool.db or postgresql+psycopg://...")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--curation", help="a saved curation: NAME (its newest version) or NAME@VERSION")
    which.add_argument("--filter", help='a StepFilter as JSON, e.g. \'{"task": "math", "label": "gold"}\'')
    p.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    p.add_argument("--min-reward", type=float, default=None, help="keep rows whose reward is at least this")
    p.add_argument("out", help="the file to write")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); prints what it wrote, returns the exit code."""
    from swarm.errors import SwarmError
    from swarm.pool.curations import CurationsMixin, parse_ref

    class Exporter(ExportMixin, CurationsMixin):  # the pool as this command needs it (Pool's .store imports us)
        pass

    a = _args(argv)
    pool = Exporter(a.pool)
    try:
        if a.curation is not None:
            c = pool.curation(*parse_ref(a.curation))
            f, what = c.filter, f"curation {c.ref}"
        else:
            f, what = coerce(StepFilter, json.loads(a.filter), "--filter"), "--filter"
        if a.format == "jsonl":
            n = pool.export_chat_jsonl(f, a.out, min_reward=a.min_reward)
        else:
            if a.min_reward is not None:
                import polars as pl

                df = pool.to_polars(f, with_tokens=True).filter(pl.col("reward") >= a.min_reward)
                Path(a.out).parent.mkdir(parents=True, exist_ok=True)
                df.write_parquet(a.out)
                n = df.height
            else:
                n = pool.export_parquet(f, a.out)
    except (SwarmError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    finally:
        pool.close()
    print(f"wrote {n} {'branches' if a.format == 'jsonl' else 'steps'} of {what} to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
