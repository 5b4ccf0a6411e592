"""Sample-collection strategies C1-C5 fire when they should and not before; the trainer's wait sees a batch
within milliseconds of its last episode (a real pool), and reads the pool fully only when it could fire."""

import threading
import time
from pathlib import Path

from swarm import loop
from swarm.batching import Decision, GroupState, Snapshot, Strategy, decide
from swarm.pool import Pool
from swarm.pool.lease import finished_count, open_groups, ready_rewards
from swarm.records import Episode, Step


def g(gid: str, rewards: tuple[float, ...], n_open: int = 0) -> GroupState:
    return GroupState(gid, rewards, n_open)


def test_c1_fires_on_enough_finished_episodes() -> None:
    snap = Snapshot(groups=(g("a", (1.0, 0.0, 1.0)), g("b", (0.5,), n_open=3)))
    assert not decide(Strategy.episodes, snap, min_episodes=5).fire
    snap = Snapshot(groups=snap.groups + (g("c", (0.0,)),))
    d = decide("episodes", snap, min_episodes=5)
    assert d.fire and set(d.group_ids) == {"a", "b", "c"}


def test_c2_needs_complete_groups() -> None:
    partial = g("a", (1.0, 0.0, 1.0), n_open=1)  # one episode still running
    small = g("b", (1.0, 0.0))  # ended, but fewer than group_size
    full = g("c", (1.0, 1.0, 1.0, 1.0))
    snap = Snapshot(groups=(partial, small, full))
    assert not decide(Strategy.groups, snap, min_groups=2, group_size=4).fire
    snap = Snapshot(groups=(partial, small, full, g("d", (0.0, 1.0, 0.0, 0.0))))
    d = decide(Strategy.groups, snap, min_groups=2, group_size=4)
    assert d.fire and d.group_ids == ("c", "d")


def test_c3_excludes_zero_variance_groups() -> None:
    flat = g("flat", (1.0, 1.0, 1.0, 1.0))
    varied = g("v1", (0.0, 1.0, 0.0, 0.0))
    snap = Snapshot(groups=(flat, varied))
    d = decide(Strategy.groups_var, snap, min_groups=2, group_size=4)
    assert not d.fire and d.excluded_groups == ("flat",)
    d = decide(Strategy.groups_var, Snapshot(groups=(flat, varied, g("v2", (0.2, 0.1, 0.1, 0.1)))),
               min_groups=2, group_size=4)
    assert d.fire and d.group_ids == ("v1", "v2") and "flat" not in d.group_ids


def test_c4_any_active_client_agrees() -> None:
    groups = (g("a", (1.0, 0.0)),)
    active = frozenset({"w1", "w2"})
    assert not decide(Strategy.any_agree, Snapshot(groups, active, frozenset())).fire
    # an agreement from a client that is no longer active does not count
    assert not decide(Strategy.any_agree, Snapshot(groups, active, frozenset({"gone"}))).fire
    assert decide(Strategy.any_agree, Snapshot(groups, active, frozenset({"w2"}))).fire
    # nothing to train on: no fire even when asked
    assert not decide(Strategy.any_agree, Snapshot((), active, frozenset({"w2"}))).fire


def test_c5_all_active_clients_agree() -> None:
    groups = (g("a", (1.0, 0.0)),)
    active = frozenset({"w1", "w2"})
    assert not decide(Strategy.all_agree, Snapshot(groups, active, frozenset({"w1"}))).fire
    assert decide(Strategy.all_agree, Snapshot(groups, active, frozenset({"w1", "w2", "old"}))).fire
    assert not decide(Strategy.all_agree, Snapshot(groups, frozenset(), frozenset())).fire


def test_decision_reason_says_progress() -> None:
    d = decide(Strategy.groups, Snapshot(), min_groups=3)
    assert isinstance(d, Decision) and d.reason == "0/3 complete groups"


def _episode(pool: Pool, gid: str, reward: float | None, end: bool = True) -> None:
    ep = pool.add_episode(Episode(task="t", group_id=gid))
    pool.add_step(Step(episode_id=ep.episode_id, index=0, policy="default", prompt_ids=[1, 2], response_ids=[3],
                       response_logprobs=[-1.0]))
    if end:
        pool.end_episode(ep.episode_id, reward=reward)


def test_the_snapshot_reads_rewards_as_whole_steps_give_them(tmp_path: Path) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    for r in (0.0, 1.0, 0.5):
        _episode(pool, "g", r)
    _episode(pool, "h", None, end=False)
    flt = loop.trainable_filter("default", 0, None).model_copy(update={"leased": False})
    steps = [(s.group_id, s.episode_id, s.reward) for s in pool.query_steps(flt, limit=100)]
    assert ready_rewards(pool, flt) == steps and len(steps) == 3
    assert finished_count(pool) == 3 and open_groups(pool) == {"h": 1} and open_groups(pool, "eval") == {}
    snap = loop.snapshot(pool, flt)
    assert {(gs.group_id, len(gs.rewards), gs.n_open) for gs in snap.groups} == {("g", 3, 0)}


def test_needed_is_a_lower_bound_on_the_episodes_left() -> None:
    snap = Snapshot(groups=(g("a", (1.0,) * 4), g("b", (1.0, 0.0), n_open=2), g("c", (0.0,), n_open=3)))
    assert loop._needed(Strategy.groups, snap, 0, 2, 4) == 2  # b needs 2 more
    assert loop._needed(Strategy.groups, snap, 0, 3, 4) == 5  # b and c
    assert loop._needed(Strategy.groups, snap, 0, 4, 4) == 9  # b, c and a new group
    assert loop._needed(Strategy.groups_var, snap, 0, 1, 4) == 2  # a has no variance: it never counts
    assert loop._needed(Strategy.episodes, snap, 10, 0, 4) == 3
    assert loop._needed(Strategy.any_agree, snap, 1, 1, 4) is None


def test_the_wait_fires_soon_after_the_last_episode_not_a_poll_later(tmp_path: Path) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    for _ in range(3):
        _episode(pool, "g0", 1.0)
    flt = loop.trainable_filter("default", 0, None)
    polls: list[Decision] = []
    ended: list[float] = []

    def finish() -> None:
        time.sleep(0.3)
        _episode(pool, "g0", 0.0)
        ended.append(time.monotonic())

    threading.Thread(target=finish).start()
    d = loop.wait_for_batch(pool, flt, "groups", min_episodes=1, min_groups=1, group_size=4, timeout_s=30,
                            poll_s=10.0, probe_s=0.01, on_poll=polls.append)
    assert d.fire and d.group_ids == ("g0",)
    assert time.monotonic() - ended[0] < 1.0  # not poll_s (10 s) later
    assert len(polls) == 2  # one snapshot before, one after the episode that completed the group
