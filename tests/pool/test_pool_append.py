"""add_steps(append=True): the pool numbers an episode's steps, so concurrent writers never share an index."""

from __future__ import annotations

import threading

from pool_helpers import episode, step

from swarm.pool import Pool, StepFilter


def test_concurrent_appends_get_distinct_consecutive_indices(pool: Pool) -> None:
    ep = episode(pool)
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        try:
            for k in range(15):
                pool.add_steps([step(ep, index=0, seed=seed * 100 + k)], append=True)  # everyone guesses 0
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stored = pool.query_steps(StepFilter(episode_id=ep.episode_id), limit=100)
    assert sorted(s.index for s in stored) == list(range(45))
    assert pool.last_step(ep.episode_id).index == 44


def test_append_numbers_in_batch_order_sets_the_objects_and_retries_are_no_ops(pool: Pool) -> None:
    ep = episode(pool)
    first = [step(ep, index=7, seed=1), step(ep, index=7, seed=2)]
    pool.add_steps(first, append=True)
    assert [s.index for s in first] == [0, 1]
    again = first[1].model_copy(update={"index": 5})
    pool.add_steps([again], append=True)  # a retry numbered before it knew the stored index
    assert pool.count_steps(StepFilter(episode_id=ep.episode_id)) == 2
    assert pool.get_step(first[1].step_id).index == 1
