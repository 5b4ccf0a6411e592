"""Leases on both backends: whole groups, ack / release / expiry, no step shared by concurrent leases (threads, processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pool_helpers import episode, group, step

from swarm.errors import LeaseError, ValidationError
from swarm.pool import Pool, StepFilter

HERE = Path(__file__).parent


def _groups(pool: Pool, sizes: list[int]) -> dict[str, set[str]]:
    out = {}
    for n, size in enumerate(sizes):
        made = group(pool, f"g{n}", [float(i) for i in range(size)])
        out[f"g{n}"] = {s.step_id for s in made}
    return out


def test_lease_takes_whole_groups_oldest_first(pool: Pool):
    g = _groups(pool, [3, 2, 4, 1])
    first = pool.lease(StepFilter.trainable(), max_groups=2)
    assert first.group_ids == ["g0", "g1"]
    assert {s.step_id for s in first.steps} == g["g0"] | g["g1"]
    assert all(s.response_ids and s.response_logprobs for s in first.steps)  # with tokens
    assert [s.group_id for s in first.steps] == ["g0"] * 3 + ["g1"] * 2
    # max_steps never splits a group: g2 (4) does not fit in 3, g3 (1) does
    second = pool.lease(StepFilter.trainable(), max_steps=3)
    assert second.group_ids == ["g3"]
    third = pool.lease(StepFilter.trainable(), max_steps=4, max_groups=5)
    assert third.group_ids == ["g2"]
    assert pool.lease(StepFilter.trainable(), max_groups=5).steps == []


def test_ungrouped_steps_are_groups_of_one(pool: Pool):
    ep = episode(pool)
    made = [step(ep, i) for i in range(3)]
    pool.add_steps(made)
    got = pool.lease(StepFilter(), max_groups=2)
    assert got.group_ids == [s.step_id for s in made[:2]]


def test_ack_release_and_errors(pool: Pool):
    _groups(pool, [2, 2])
    a = pool.lease(StepFilter.trainable(), max_groups=1)
    b = pool.lease(StepFilter.trainable(), max_groups=1)
    assert a.group_ids == ["g0"] and b.group_ids == ["g1"]
    assert pool.stats()["steps"]["leased"] == 4
    assert pool.ack(a.lease_id, consumed_version=7) == 2
    assert {s.step_id for s in pool.query_steps(StepFilter(consumed=True))} == {s.step_id for s in a.steps}
    with pytest.raises(LeaseError, match="already acked"):
        pool.ack(a.lease_id, consumed_version=7)
    with pytest.raises(LeaseError, match="acknowledged"):
        pool.release(a.lease_id)
    with pytest.raises(LeaseError, match="no such lease"):
        pool.ack("lease-nope", 1)
    with pytest.raises(ValidationError, match="consumed_version"):
        pool.ack(b.lease_id, -1)
    assert pool.release(b.lease_id) == 2
    assert pool.release(b.lease_id) == 0
    with pytest.raises(LeaseError, match="released"):
        pool.ack(b.lease_id, 1)
    again = pool.lease(StepFilter.trainable(), max_groups=5)
    assert again.group_ids == ["g1"]  # released steps come back; consumed ones never do
    assert pool.stats()["steps"]["consumed"] == 2


def test_expired_lease_returns_its_steps(pool: Pool):
    g = _groups(pool, [2])
    old = pool.lease(StepFilter.trainable(), max_groups=1, ttl_s=1.5)  # long enough for a loaded machine
    assert pool.lease(StepFilter.trainable(), max_groups=1).steps == []
    time.sleep(max(0.0, old.expires_at - time.time()) + 0.05)
    new = pool.lease(StepFilter.trainable(), max_groups=1)
    assert {s.step_id for s in new.steps} == g["g0"]
    with pytest.raises(LeaseError, match="expired"):
        pool.ack(old.lease_id, 1)
    assert pool.release(old.lease_id) == 0  # does not touch the new lease's steps
    assert pool.ack(new.lease_id, 1) == 2


def test_lease_argument_validation(pool: Pool):
    for kw, field in [
        ({}, "max_steps or max_groups"),
        ({"max_steps": 0}, "max_steps"),
        ({"max_groups": 1.5}, "max_groups"),
        ({"max_steps": 1, "ttl_s": 0}, "ttl_s"),
    ]:
        with pytest.raises(ValidationError, match=field):
            pool.lease(StepFilter(), **kw)
    with pytest.raises(ValidationError, match="consumed"):
        pool.lease(StepFilter(consumed=True), max_steps=1)


def _check_partition(leases: list[list[str]], everything: set[str]) -> None:
    flat = [sid for ids in leases for sid in ids]
    assert len(flat) == len(set(flat)), "a step was handed to two leases"
    assert set(flat) == everything


def test_concurrent_leases_in_threads_never_share_a_step(pool: Pool):
    ep = episode(pool)
    made = [step(ep, i, group_id=f"g{i // 3}") for i in range(90)]
    pool.add_steps(made)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def consume():
        try:
            while True:
                got = pool.lease(StepFilter(), max_steps=6)
                if not got.steps:
                    return
                results.append([s.step_id for s in got.steps])
                assert len(got.steps) == 3 * len(got.group_ids)  # whole groups of three
                pool.ack(got.lease_id, 1)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=consume) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _check_partition(results, {s.step_id for s in made})


def test_concurrent_leases_in_two_processes_never_share_a_step(pool: Pool, pool_url: str):
    ep = episode(pool)
    made = [step(ep, i, group_id=f"g{i // 2}") for i in range(200)]
    pool.add_steps(made)
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "pool_workers.py"), "lease", pool_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    leases = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        leases.append([json.loads(line) for line in out.splitlines()])
    assert all(leases), "both processes should have leased something"
    _check_partition([ids for per in leases for ids in per], {s.step_id for s in made})
    assert pool.count_steps(StepFilter(consumed=False)) == 0


def test_lease_applies_group_conditions(pool: Pool):
    _groups(pool, [1, 3])  # g0: one step (zero variance), g1: rewards 0, 1, 2
    group(pool, "flat", [1.0, 1.0])
    ep = episode(pool)
    pool.add_step(step(ep))
    pool.end_episode(ep.episode_id, reward=1.0)  # ungrouped
    got = pool.lease(StepFilter.trainable(nonzero_variance=True), max_groups=5)
    assert got.group_ids == ["g1"]
    got = pool.lease(StepFilter.trainable(min_group_size=2), max_groups=5)
    assert got.group_ids == ["flat"]
    got = pool.lease(StepFilter.trainable(min_group_size=1), max_groups=5)
    assert len(got.group_ids) == 2 and got.group_ids[0] == "g0"  # g0 and the ungrouped step
