"""run_updates (a script's entry to the flow's update) on a real pool and trainer: N updates published as
versions 1..N, settled at the closing checkpoint, stopped from the callback; one place numbers versions; pending leases renewed only when near their expiry."""

from __future__ import annotations

import threading
from pathlib import Path

from tiny_llama import make_tiny_llama

from swarm.pool import Pool, StepFilter
from swarm.records import Episode, PolicyVersion, Step
from swarm.train import Ledger, LoraSpec, TrainConfig, Trainer
from swarm.train.checkpoint import load_latest_checkpoint
from swarm.update import UpdateSettings, run_updates

SETTINGS = UpdateSettings(strategy="groups", min_episodes=1, min_groups=1, group_size=2, timeout_s=10.0,
                          max_staleness=None)


def _group(pool: Pool, gid: str) -> None:
    for i, r in enumerate((0.0, 1.0)):
        ep = pool.add_episode(Episode(task="t", group_id=gid))
        pool.add_step(Step(episode_id=ep.episode_id, index=0, policy="default", prompt_ids=[1, 2, 3, 4],
                           response_ids=[5 + i, 6, 7], response_logprobs=[-1.0, -1.0, -1.0]))
        pool.end_episode(ep.episode_id, reward=r)


def _ledger(tmp_path: Path, every: int = 10) -> Ledger:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    trainer = Trainer(make_tiny_llama(seed=1), TrainConfig(lr=1e-3, lora=LoraSpec(rank=2)), out_dir=tmp_path)
    return Ledger(trainer, pool, every=every)


def test_updates_publish_versions_and_the_close_settles_them(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    pool = led.pool
    _group(pool, "g0")
    seen: list[tuple[int, int]] = []

    def on_update(metrics: dict[str, float], steps: list[Step]) -> None:
        seen.append((int(metrics["policy/version"]), len(steps)))
        _group(pool, f"g{len(seen)}")  # the next update's batch

    assert run_updates(led, SETTINGS, 2, on_update=on_update) == 2
    assert seen == [(1, 2), (2, 2)]
    assert [v.version for v in pool.policy_versions("default")] == [1, 2] and led.trainer.version == 2
    assert led.pending == [] and not led.dirty()  # committed: the two leases are settled
    assert len(pool.query_steps(StepFilter(consumed=True), limit=100)) == 4
    assert len(pool.query_steps(StepFilter(consumed=False), limit=100)) == 2  # g2, added after the last update
    assert load_latest_checkpoint(tmp_path / "checkpoints" / "default")["updates"] == 2


def test_a_stop_set_by_the_callback_ends_after_that_update(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    _group(led.pool, "g0")
    _group(led.pool, "g1")
    stop = threading.Event()
    n = run_updates(led, SETTINGS, 5, stop, on_update=lambda m, steps: stop.set())
    assert n == 1 and led.pool.latest_version("default") == 1 and not led.dirty()


def test_a_restart_publishes_past_the_pools_newest_version(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    led.pool.add_policy_version(PolicyVersion(policy="default", version=3))  # served before a crash
    led.resume(load=False)
    assert led.trainer.version == 4 and led.pool.latest_version("default") == 4


def test_publish_after_takes_the_next_number(tmp_path: Path) -> None:
    trainer = Trainer(make_tiny_llama(seed=1), TrainConfig(lr=1e-3, lora=LoraSpec(rank=2)))
    assert trainer.publish(save=False)[0].version == 1
    assert trainer.publish(save=False, after=7)[0].version == 8 and trainer.version == 8


def test_renew_writes_only_leases_past_half_their_ttl(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    led.ttl_s = 100.0
    _group(led.pool, "g0")
    lease = led.pool.lease(StepFilter.trainable(policy="default"), max_groups=1, ttl_s=led.ttl_s)
    led.trained(lease.lease_id, [s.step_id for s in lease.steps], lease.expires_at)
    assert led.renew() == 0  # 100 s left: nothing to write
    assert led.renew(now=lease.expires_at - 40) == 1  # 40 s left: pushed to a full TTL again
    _group(led.pool, "g1")  # the pending steps stay reserved: a new lease takes only g1
    assert {s.group_id for s in led.pool.lease(StepFilter.trainable(policy="default"), max_groups=5).steps} == {"g1"}


def test_settle_many_settles_a_checkpoints_leases_at_once_or_none(tmp_path: Path) -> None:
    import time

    import pytest

    from swarm.errors import LeaseError
    from swarm.pool.settle import settle_many

    pool = _ledger(tmp_path).pool
    _group(pool, "g0")
    _group(pool, "g1")
    a = pool.lease(StepFilter.trainable(policy="default"), max_groups=1, ttl_s=0.3)
    b = pool.lease(StepFilter.trainable(policy="default"), max_groups=1)
    time.sleep(0.4)  # a expired
    todo = [(a.lease_id, [s.step_id for s in a.steps], 1), (b.lease_id, [b.steps[0].step_id], 2)]
    with pytest.raises(LeaseError):
        settle_many(pool, [*todo, ("lease-unknown", [], 3)])
    assert pool.count_steps(StepFilter(consumed=True)) == 0  # one transaction: nothing settled
    assert settle_many(pool, todo) == 3  # the expired lease's steps too
    assert settle_many(pool, todo) == 0  # settling twice is a no-op
    assert pool.count_steps(StepFilter(consumed=False, leased=False)) == 1  # b's untrained step went back
