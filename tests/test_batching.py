"""Sample-collection strategies C1-C5 fire when they should and not before."""

from swarm.batching import Decision, GroupState, Snapshot, Strategy, decide


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
