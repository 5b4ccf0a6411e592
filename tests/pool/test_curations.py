"""Named, versioned curations, lease plans, the trainer's combined filter, and the chat-JSONL export per branch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from pool_helpers import episode, group, step

from swarm.errors import NotFoundError, ValidationError
from swarm.loop import trainable_filter
from swarm.pool import Pool, StepFilter, parse_ref
from swarm.records import EpisodeType

REPO = Path(__file__).resolve().parents[2]


def test_save_versions_and_load(pool: Pool) -> None:
    a = pool.save_curation("clean", StepFilter(task="math", label="gold"), note="first cut")
    assert (a.name, a.version, a.note, a.ref) == ("clean", 1, "first cut", "clean@1")
    same = pool.save_curation("clean", StepFilter(label="gold", task="math"), note="ignored")
    assert same.version == 1 and same.note == "first cut"  # same filter: no new version
    b = pool.save_curation("clean", StepFilter(task="math", label="gold", min_length=10))
    assert b.version == 2
    pool.save_curation("other", StepFilter(episode_type="eval"))
    assert pool.curation("clean") == b
    assert pool.curation("clean", 1).filter == StepFilter(task="math", label="gold")
    assert [(c.name, c.version) for c in pool.curations()] == [("clean", 2), ("other", 1)]
    back = pool.save_curation("clean", StepFilter(task="math", label="gold"))  # back to v1's filter: a new version
    assert back.version == 3


def test_errors_name_what_is_wrong(pool: Pool) -> None:
    pool.save_curation("clean", StepFilter(task="math"))
    with pytest.raises(NotFoundError, match="no curation named 'dirty'.*known: clean"):
        pool.curation("dirty")
    with pytest.raises(NotFoundError, match="'clean' has no version 7"):
        pool.curation("clean", 7)
    for bad in ("", "x" * 257, "a@b"):
        with pytest.raises(ValidationError, match="curation name"):
            pool.save_curation(bad, StepFilter())
    with pytest.raises(ValidationError, match="filter"):
        pool.save_curation("x", {"tsk": "math"})  # type: ignore[arg-type]
    assert parse_ref("clean") == ("clean", None) and parse_ref("clean@3") == ("clean", 3)
    for bad in ("clean@", "clean@x", "clean@0", "@3"):
        with pytest.raises(ValidationError):
            parse_ref(bad)


def test_lease_plans_round_trip(pool: Pool) -> None:
    assert pool.lease_plans() == []
    f = trainable_filter("default", 4, 1, curated=StepFilter(task="math"))
    pool.set_lease_plan("default", f, "clean@2", 4)
    pool.set_lease_plan("default", f, "clean@2", 5)  # one row per policy: the newest plan
    (plan,) = pool.lease_plans()
    assert plan["policy"] == "default" and plan["curation"] == "clean@2" and plan["version"] == 5
    assert StepFilter.model_validate(plan["filter"]) == f


def test_trainable_filter_combines_and_refuses_contradictions() -> None:
    f = trainable_filter("p", 10, 3, curated=StepFilter(task="math", label="gold", max_staleness=1,
                                                         current_version=0), nonzero_variance=True)
    assert (f.task, f.label, f.policy, f.consumed, f.episode_type) == ("math", "gold", "p", False, EpisodeType.train)
    assert (f.max_staleness, f.current_version, f.nonzero_variance) == (1, 10, True)  # the stricter, at our version
    assert trainable_filter("p", 10, None, curated=StepFilter(nonzero_variance=True)).nonzero_variance
    assert trainable_filter("p", 10, None).max_staleness is None
    same = StepFilter(policy="p", episode_type="train", reward_status="final", episode_status="finished", consumed=False)
    assert trainable_filter("p", 10, 1, curated=same) == trainable_filter("p", 10, 1)  # agreeing fields are fine
    for field, value in (("consumed", True), ("episode_type", "eval"), ("reward_status", "pending"),
                         ("episode_status", "open"), ("include_excluded", True), ("policy", "other")):
        with pytest.raises(ValidationError, match=f"curation field {field}="):
            trainable_filter("p", 1, 1, curated=StepFilter(**{field: value}))


def test_a_curated_lease_takes_only_the_curation(pool: Pool) -> None:
    group(pool, "gold-group", [0.0, 1.0], metadata={"set": "gold"})
    group(pool, "plain-group", [0.0, 1.0])
    f = trainable_filter("default", 0, None, curated=pool.save_curation("g", StepFilter(metadata={"set": "gold"})).filter)
    lease = pool.lease(f, max_groups=10)
    assert lease.group_ids == ["gold-group"] and len(lease.steps) == 2


def _chain(pool: Pool, reward: float, **ep_kw) -> list:
    """One episode: a two-turn conversation (s0 -> s1) plus a second branch s1b off s0."""
    ep = episode(pool, **ep_kw)
    m0 = [{"role": "user", "content": "hi"}]
    s0 = step(ep, 0, prompt_messages=m0, response_text="hello")
    m1 = m0 + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    s1 = step(ep, 1, parent_step_id=s0.step_id, prompt_messages=m1, response_text="sure")
    s1b = step(ep, 2, parent_step_id=s0.step_id, prompt_messages=m1, response_text="no")
    bare = step(ep, 3)  # recorded as bare tokens: no chat form
    pool.add_steps([s0, s1, s1b, bare])
    pool.end_episode(ep.episode_id, reward=reward)
    return [s0, s1, s1b, bare]


def test_chat_jsonl_one_row_per_branch_and_min_reward(pool: Pool, tmp_path: Path) -> None:
    good = _chain(pool, 1.0, task="chat")
    _chain(pool, 0.2, task="chat")
    out = tmp_path / "sft.jsonl"
    assert pool.export_chat_jsonl(StepFilter(task="chat"), out) == 4  # two branches per episode
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and {r["task"] for r in rows} == {"chat"}
    first = next(r for r in rows if r["step_id"] == good[1].step_id)
    assert first["messages"] == [*good[1].prompt_messages, {"role": "assistant", "content": "sure"}]
    assert first["reward"] == 1.0 and first["episode_id"] == good[1].episode_id and first["policy_version"] == 0
    assert good[0].step_id not in {r["step_id"] for r in rows}  # a parent is not a branch
    assert pool.export_chat_jsonl(StepFilter(task="chat"), out, min_reward=0.5) == 2
    assert {json.loads(line)["reward"] for line in out.read_text().splitlines()} == {1.0}
    # a selection that leaves the children out makes their parent the leaf
    assert pool.export_chat_jsonl(StepFilter(task="chat", max_length=0), out) == 0


def test_export_cli_by_curation_and_filter(sqlite_url: str, tmp_path: Path) -> None:
    """The CLI on SQLite (the pool queries under it run on both backends in the tests above)."""
    pool_url = sqlite_url
    pool = Pool(pool_url)
    try:
        _chain(pool, 1.0, task="chat")
        group(pool, "g", [0.0, 1.0], task="math")
        pool.save_curation("chats", StepFilter(task="chat"))
    finally:
        pool.close()
    run = [sys.executable, "-m", "swarm.pool.export", "--pool", pool_url]
    jsonl = tmp_path / "a.jsonl"
    r = subprocess.run([*run, "--curation", "chats@1", "--format", "jsonl", str(jsonl)], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "wrote 2 branches of curation chats@1" in r.stdout and len(jsonl.read_text().splitlines()) == 2
    pq = tmp_path / "b.parquet"
    r = subprocess.run([*run, "--filter", '{"task": "math"}', "--format", "parquet", "--min-reward", "0.5", str(pq)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert pl.read_parquet(pq)["reward"].to_list() == [1.0]
    r = subprocess.run([*run, "--curation", "nope", str(jsonl)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "no curation named 'nope'" in r.stderr
