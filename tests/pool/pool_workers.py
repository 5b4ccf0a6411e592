"""Subprocess entry points for pool tests (not a test module): a lease consumer and a batch writer.

python pool_workers.py lease URL       lease 2 groups at a time until none is left; ack;
                                       print each lease's step ids as one JSON line
python pool_workers.py write URL EP    write batches of 64 steps to episode EP forever,
                                       printing each batch number once it is committed
"""

from __future__ import annotations

import itertools
import json
import sys
import time

from pool_helpers import seeded_step

from swarm.pool import Pool, StepFilter


def lease(url: str) -> None:
    pool = Pool(url)
    print("ready", flush=True)
    sys.stdin.readline()  # start together with the other consumer
    empty = 0
    while empty < 3:
        got = pool.lease(StepFilter(), max_groups=2, ttl_s=120)
        if not got.steps:
            empty += 1
            continue
        empty = 0
        print(json.dumps([s.step_id for s in got.steps]), flush=True)
        pool.ack(got.lease_id, consumed_version=1)
        time.sleep(0.02)  # "train": gives the other consumer a turn (at 5 ms, one took all 100 groups at load ~6)


def write(url: str, episode_id: str) -> None:
    pool = Pool(url)
    print("ready", flush=True)
    for batch in itertools.count():
        pool.add_steps([seeded_step(episode_id, batch, i) for i in range(64)])
        print(batch, flush=True)


if __name__ == "__main__":
    {"lease": lease, "write": write}[sys.argv[1]](*sys.argv[2:])
