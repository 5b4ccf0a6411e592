"""Lineage query latency on a large pool: ``python tests/dashboard/bench_lineage.py --steps 1000000``.

Bulk-fills a SQLite pool (tests/dashboard/bulk.py: 50 versions, 64-step acked leases), then times
``Pool.step_lineage`` of consumed steps and ``Pool.version_lineage`` of versions (first call and
median of warm calls), in process. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bulk import fill  # noqa: E402

from swarm.pool import Pool, StepFilter  # noqa: E402


def _time(fn, reps: int) -> tuple[float, float]:
    t = time.perf_counter()
    fn()
    first = (time.perf_counter() - t) * 1000
    warm = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        warm.append((time.perf_counter() - t) * 1000)
    return first, statistics.median(warm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        pool = Pool(f"sqlite:///{d}/pool.db")
        t = time.time()
        fill(pool, args.steps)
        print(f"filled {args.steps:,} steps in {time.time() - t:.0f} s")
        consumed = pool.query_steps(StepFilter(consumed=True), limit=1, order="-created")[0]
        old = pool.query_steps(StepFilter(consumed=True), limit=1, order="created")[0]
        versions = [v.version for v in pool.policy_versions(consumed.policy)]
        mid = versions[len(versions) // 2]
        made = pool.version_lineage(consumed.policy, mid, limit=0)["made_of"]["steps"]
        rows = {
            "step_lineage, newest consumed step": lambda: pool.step_lineage(consumed.step_id),
            "step_lineage, oldest consumed step": lambda: pool.step_lineage(old.step_id),
            f"version_lineage, v{mid} ({made:,} steps made it), page of 50": lambda: pool.version_lineage(
                consumed.policy, mid),
            f"version_lineage, v{mid}, page at offset 10,000": lambda: pool.version_lineage(
                consumed.policy, mid, offset=10_000),
        }
        print("| call | first ms | warm median ms |\n|---|---:|---:|")
        for name, fn in rows.items():
            first, warm = _time(fn, args.reps)
            print(f"| {name} | {first:.0f} | {warm:.0f} |")
        pool.close()


if __name__ == "__main__":
    main()
