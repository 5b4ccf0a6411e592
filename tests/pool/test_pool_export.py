"""Export on both backends: polars DataFrame and Parquet file with exact tokens and resolved rewards."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from pool_helpers import episode, group, step

from swarm.pool import Pool, StepFilter


def test_to_polars_and_parquet(pool: Pool, tmp_path: Path):
    made = group(pool, "g", [0.0, 1.0], metadata={"k": 1})
    open_ep = episode(pool)
    pool.add_step(step(open_ep))
    df = pool.to_polars(StepFilter(group_id="g"))
    assert df.height == 2 and "prompt_ids" not in df.columns
    assert sorted(df["reward"].to_list()) == [0.0, 1.0] and df["reward_final"].all()
    assert set(df["episode_status"]) == {"finished"}
    assert df["metadata"].to_list() == ['{"k": 1}'] * 2

    path = tmp_path / "out" / "steps.parquet"
    assert pool.export_parquet(StepFilter(), path) == 3
    back = pl.read_parquet(path).filter(pl.col("group_id") == "g").sort("created_at")
    for row, s in zip(back.iter_rows(named=True), sorted(made, key=lambda s: s.created_at), strict=True):
        assert row["prompt_ids"] == s.prompt_ids
        assert row["response_ids"] == s.response_ids
        assert row["response_logprobs"] == s.response_logprobs
        assert row["prompt_len"] == len(s.prompt_ids)
    assert pool.to_polars(StepFilter(task="nothing"), with_tokens=True).height == 0
