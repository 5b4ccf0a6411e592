"""Pool basics on both backends: episodes, steps (round trip, idempotency), rewards, events, labels, versions, stats."""

from __future__ import annotations

import threading

import pytest
from pool_helpers import episode, step

from swarm.errors import ConflictError, NotFoundError, ValidationError
from swarm.pool import Pool, StepFilter
from swarm.records import Episode, EpisodeStatus, Event, PolicyVersion, RewardStatus, Source


def test_step_round_trip_is_exact(pool: Pool):
    ep = episode(pool, group_id="g")
    lps = [-0.1, -1e-300, -0.30000000000000004, -123.456789012345678, 0.0]
    s = step(
        ep,
        index=3,
        n_prompt=200,
        seed=1,
        response_ids=[0, 4_000_000_000, 7, 7, 65_535],
        response_logprobs=lps,
        prompt_messages=[{"role": "user", "content": "hi"}],
        response_text="ok",
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}],
        finish_reason="stop",
        response_id="resp-1",
        prefix_consistent=True,
        policy="p",
        policy_version=2,
        source=Source.whitebox,
        timings={"latency_s": 0.25},
        metadata={"k": [1, {"x": None}]},
    )
    assert pool.add_step(s) == s.step_id
    got = pool.get_step(s.step_id)
    assert got.prompt_ids == s.prompt_ids and got.response_ids == s.response_ids
    assert got.response_logprobs == lps  # float64: bit-exact
    expect = s.model_copy(update={"task": "math", "group_id": "g"})
    assert got.model_dump() == expect.model_dump()
    assert pool.get_step_by_response_id("resp-1").step_id == s.step_id
    light = pool.get_step(s.step_id, with_tokens=False)
    assert light.prompt_ids == [] and light.response_logprobs is None and light.response_text == "ok"


def test_add_steps_is_idempotent_and_detects_conflicts(pool: Pool):
    ep = episode(pool)
    a, b = step(ep, 0, seed=1), step(ep, 1, seed=2)
    assert pool.add_steps([a, b]) == [a.step_id, b.step_id]
    assert pool.add_steps([a, b]) == [a.step_id, b.step_id]  # identical: no-op
    assert pool.count_steps() == 2
    with pytest.raises(ConflictError, match="different step"):
        pool.add_step(a.model_copy(update={"response_text": "changed"}))
    with pytest.raises(ConflictError, match="share a step_id"):
        pool.add_steps([b, b.model_copy(update={"index": 9})])
    # a failing batch writes nothing, not even its valid steps
    c = step(ep, 2, seed=3)
    with pytest.raises(ConflictError):
        pool.add_steps([c, a.model_copy(update={"index": 5})])
    with pytest.raises(NotFoundError):
        pool.get_step(c.step_id)


def test_steps_need_an_open_episode(pool: Pool):
    with pytest.raises(NotFoundError, match="episode"):
        pool.add_step(step("ep-missing"))
    ep = episode(pool)
    s = step(ep)
    pool.add_step(s)
    pool.end_episode(ep.episode_id, reward=1.0)
    with pytest.raises(ConflictError, match="finished, not open"):
        pool.add_step(step(ep, 1))
    pool.add_step(s)  # retrying an already stored step stays a no-op
    with pytest.raises(ValidationError, match="steps\\[0\\]"):
        pool.add_steps([{"episode_id": ep.episode_id, "response_ids": [1], "response_logprobs": []}])


def test_last_step_and_lookups(pool: Pool):
    ep = episode(pool)
    assert pool.last_step(ep.episode_id) is None
    for i in (0, 2, 1):
        pool.add_step(step(ep, i, seed=i))
    last = pool.last_step(ep.episode_id)
    assert last.index == 2 and last.response_ids
    with pytest.raises(NotFoundError):
        pool.last_step("ep-nope")
    with pytest.raises(NotFoundError):
        pool.get_step("step-nope")
    with pytest.raises(NotFoundError):
        pool.get_step_by_response_id("resp-nope")
    with pytest.raises(NotFoundError):
        pool.get_episode("ep-nope")
    with pytest.raises(ConflictError):
        pool.add_episode(Episode(episode_id=ep.episode_id, task="x"))


def test_end_episode_rewards_and_reward_resolution(pool: Pool):
    ep = episode(pool, metadata={"seed": 1})
    s0, s1 = step(ep, 0), step(ep, 1)
    pool.add_steps([s0, s1])
    assert pool.get_step(s0.step_id).reward_status == RewardStatus.pending
    done = pool.end_episode(ep.episode_id, reward=0.5, step_rewards={s1.step_id: 2.0}, metadata={"won": True})
    assert done.status == EpisodeStatus.finished and done.reward_status == RewardStatus.final
    assert done.metadata == {"seed": 1, "won": True} and done.ended_at is not None
    g0, g1 = pool.get_step(s0.step_id), pool.get_step(s1.step_id)
    assert (g0.reward, g0.reward_status) == (0.5, RewardStatus.final)  # the episode's
    assert (g1.reward, g1.reward_status) == (2.0, RewardStatus.final)  # its own
    with pytest.raises(ConflictError, match="not open"):
        pool.end_episode(ep.episode_id)
    with pytest.raises(ValidationError, match="status"):
        pool.end_episode(episode(pool).episode_id, status=EpisodeStatus.open)
    ep2 = episode(pool)
    with pytest.raises(NotFoundError, match="not in this episode"):
        pool.end_episode(ep2.episode_id, step_rewards={s0.step_id: 1.0})
    assert pool.get_episode(ep2.episode_id).status == EpisodeStatus.open  # rolled back
    assert pool.end_episode(ep2.episode_id, status=EpisodeStatus.failed).status == EpisodeStatus.failed


def test_late_rewards_and_events(pool: Pool):
    ep = episode(pool)
    s = step(ep)
    pool.add_step(s)
    pool.end_episode(ep.episode_id)  # no reward yet
    assert pool.get_step(s.step_id).reward_status == RewardStatus.pending
    pool.report_reward(episode_id=ep.episode_id, reward=0.25, source="agent", final=False)
    assert pool.get_step(s.step_id).reward_status == RewardStatus.pending
    pool.add_event(Event(kind="reward", episode_id=ep.episode_id, value=1.0))
    got = pool.get_step(s.step_id)
    assert (got.reward, got.reward_status) == (1.0, RewardStatus.final)
    assert not pool.report_reward(step_id=s.step_id, reward=-1.0, source="agent").applied  # final: kept as history
    pool.report_reward(step_id=s.step_id, reward=-1.0, source="admin")
    assert pool.get_step(s.step_id).reward == -1.0
    ev = Event(kind="feedback", step_id=s.step_id, rating=4, correction="better")
    pool.add_event(ev)
    got_events = pool.events(episode_id=ep.episode_id)
    assert [e.kind for e in got_events] == ["reward", "feedback"] and got_events[1].episode_id == ep.episode_id
    assert pool.events(step_id=s.step_id)[0].correction == "better"
    with pytest.raises(ValidationError, match="exactly one"):
        pool.report_reward(reward=1.0, source="admin")
    with pytest.raises(ValidationError, match="finite"):
        pool.report_reward(step_id=s.step_id, reward=float("inf"), source="admin")
    with pytest.raises(NotFoundError):
        pool.report_reward(step_id="step-nope", reward=1.0, source="admin")
    with pytest.raises(NotFoundError):
        pool.add_event(Event(kind="feedback", episode_id="ep-nope"))


def test_heartbeat_and_abandon_stale(pool: Pool):
    stale = episode(pool, timeout_s=10, created_at=100.0, updated_at=100.0)
    fresh = episode(pool, timeout_s=10, created_at=100.0, updated_at=100.0)
    forever = episode(pool, created_at=100.0, updated_at=100.0)
    s = step(stale)
    pool.add_step(s)  # activity: updated_at = now
    pool.report_reward(episode_id=stale.episode_id, reward=1.0, source="agent")
    assert pool.abandon_stale(now=50.0) == []
    pool.heartbeat(fresh.episode_id)
    import time

    t = time.time() + 5  # both touched just now: neither is older than 10 s
    assert pool.abandon_stale(now=t) == []
    assert sorted(pool.abandon_stale(now=t + 60)) == sorted([stale.episode_id, fresh.episode_id])
    assert pool.get_episode(stale.episode_id).status == EpisodeStatus.abandoned
    assert pool.get_episode(forever.episode_id).status == EpisodeStatus.open
    assert pool.get_step(s.step_id).step_id == s.step_id  # kept...
    lease = pool.lease(StepFilter(), max_steps=10)
    assert lease.steps == []  # ...but never leased
    with pytest.raises(ConflictError):
        pool.heartbeat(stale.episode_id)


def test_labels(pool: Pool):
    ep = episode(pool)
    s = step(ep)
    pool.add_step(s)
    lbl = pool.label("step", s.step_id, "garbled", exclude=True, note="tool output cut off")
    assert pool.labels(s.step_id) == [lbl]
    with pytest.raises(NotFoundError):
        pool.label("episode", "ep-nope", "x")
    with pytest.raises(ValidationError, match="target"):
        pool.label("batch", s.step_id, "x")


def test_policy_versions(pool: Pool):
    assert pool.latest_version("p") == 0 and pool.policy_versions("p") == []
    pool.add_policy_version(PolicyVersion(policy="p", version=1, adapter_path="/a/1"))
    pool.add_policy_version(PolicyVersion(policy="p", version=3, adapter_path="/a/3"))
    pool.add_policy_version(PolicyVersion(policy="p", version=3, adapter_path="/a/3"))
    pool.add_policy_version(PolicyVersion(policy="q", version=7))
    assert pool.latest_version("p") == 3
    assert [v.version for v in pool.policy_versions("p")] == [1, 3]
    with pytest.raises(ConflictError):
        pool.add_policy_version(PolicyVersion(policy="p", version=3, adapter_path="/other"))


def test_stats(pool: Pool):
    ep = episode(pool, task="a")
    pool.add_steps([step(ep, 0, seed=1, source=Source.whitebox), step(ep, 1, seed=2, policy="q")])
    pool.end_episode(ep.episode_id, reward=1.0)
    episode(pool, task="b")
    st = pool.stats()
    assert st["steps"]["total"] == 2
    assert st["steps"]["by_source"] == {"whitebox": 1, "blackbox": 1}
    assert st["steps"]["by_policy"] == {"default": 1, "q": 1}
    assert st["steps"]["by_reward_status"] == {"final": 2}
    assert st["episodes"]["by_status"] == {"finished": 1, "open": 1}
    assert st["tokens"]["logical"] == 16 and st["tokens"]["stored"] == 16


def test_concurrent_writers_in_threads(pool: Pool):
    eps = [episode(pool) for _ in range(4)]
    errors: list[BaseException] = []

    def write(ep):
        try:
            for i in range(10):
                pool.add_steps([step(ep, 2 * i, seed=i), step(ep, 2 * i + 1, seed=100 + i)])
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(ep,)) for ep in eps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.count_steps() == 80


def test_bad_urls():
    with pytest.raises(ValidationError, match="unsupported database"):
        Pool("mysql://x/y")
    with pytest.raises(ValidationError, match="SQLite file"):
        Pool("sqlite://")
