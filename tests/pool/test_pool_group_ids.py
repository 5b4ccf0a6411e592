"""StepFilter.group_ids: reading and leasing exactly the groups a batching strategy chose."""

from __future__ import annotations

from pool_helpers import episode, group, step

from swarm.pool import Pool, StepFilter


def test_group_ids_selects_and_leases_only_those_groups(pool: Pool) -> None:
    for gid in ("g0", "g1", "g2"):
        group(pool, gid, [0.0, 1.0])
    loose = episode(pool)
    single = step(loose)
    pool.add_step(single)
    pool.end_episode(loose.episode_id, reward=1.0)

    chosen = StepFilter(group_ids=["g2", single.step_id])
    assert {s.group_id or s.step_id for s in pool.query_steps(chosen)} == {"g2", single.step_id}
    assert pool.count_steps(chosen) == 3

    lease = pool.lease(StepFilter.trainable(group_ids=["g1"]), max_groups=5)
    assert lease.group_ids == ["g1"] and {s.group_id for s in lease.steps} == {"g1"}
    assert pool.lease(StepFilter.trainable(group_ids=["g1"]), max_groups=5).steps == []
