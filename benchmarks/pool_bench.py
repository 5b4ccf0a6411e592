"""Pool benchmark (not a test): ingest rate, bytes on disk with and without block dedupe, lease latency.

    python benchmarks/pool_bench.py [--lease-steps 100000] [--backends sqlite,postgres]

For SQLite (a fresh file under a temp dir) and PostgreSQL (a fresh database on
$SWARM_TEST_POSTGRES_URL or, if reachable, postgres@127.0.0.1:5432, dropped afterwards) it prints:
  - steps/s ingested through ``add_steps`` in batches of 1 and of 64;
  - bytes on disk per step for 20-turn episodes whose every turn repeats the whole context,
    with block dedupe (block_size 64) and without (block_size 10**9: every sequence inline),
    and their ratio;
  - lease latency p50 / p99 (lease of one group: 2 episodes x 50 turns = 100 steps with their
    tokens; then ack) with N steps in the pool (default 100k),
    plus one lease with the non-zero-variance group filter.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.pool import Pool, StepFilter  # noqa: E402
from swarm.records import Episode, Step  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
NO_DEDUPE = 10**9


# ---------------------------------------------------------------- databases
def postgres_admin_url() -> str | None:
    url = os.environ.get("SWARM_TEST_POSTGRES_URL")
    if url:
        return url
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=0.5).close()
    except OSError:
        return None
    return DEFAULT_PG


@contextmanager
def fresh_db(backend: str) -> Iterator[Callable[[], str]]:
    """Yields a factory of fresh database URLs for ``backend``; everything is removed afterwards."""
    made: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pool_bench_") as tmp:
        admin = None
        if backend == "postgres":
            admin = sa.create_engine(postgres_admin_url(), isolation_level="AUTOCOMMIT")

        def new() -> str:
            name = f"pool_bench_{uuid.uuid4().hex[:10]}"
            if admin is None:
                return f"sqlite:///{tmp}/{name}.db"
            with admin.connect() as c:
                c.execute(sa.text(f'CREATE DATABASE "{name}"'))
            made.append(name)
            return sa.engine.make_url(str(admin.url)).set(database=name).render_as_string(hide_password=False)

        try:
            yield new
        finally:
            if admin is not None:
                with admin.connect() as c:
                    for name in made:
                        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()


def bytes_used(pool: Pool) -> int:
    """Bytes the pool's data takes on disk (tables, indexes, TOAST; SQLite: the file after checkpoint)."""
    with pool.engine.connect() as c:
        if pool.dialect == "sqlite":
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            return int(c.exec_driver_sql("PRAGMA page_count").scalar()) * int(
                c.exec_driver_sql("PRAGMA page_size").scalar()
            )
        return int(
            c.execute(
                sa.text(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind = 'r'"
                )
            ).scalar()
        )


# ---------------------------------------------------------------- workloads
def rand_ids(rng: random.Random, n: int) -> list[int]:
    return array("H", rng.randbytes(2 * n)).tolist()  # fast random ids < 65536


def ingest_rate(url: str, batch: int, n_steps: int) -> float:
    pool = Pool(url)
    rng = random.Random(0)
    ep = pool.add_episode(Episode(task="bench"))
    steps = []
    for i in range(n_steps):
        resp = rand_ids(rng, 64)
        steps.append(
            Step(
                episode_id=ep.episode_id,
                index=i,
                prompt_ids=rand_ids(rng, 512),
                response_ids=resp,
                response_logprobs=[-rng.random() for _ in resp],
            )
        )
    t0 = time.perf_counter()
    for i in range(0, n_steps, batch):
        pool.add_steps(steps[i : i + batch])
    dt = time.perf_counter() - t0
    pool.close()
    return n_steps / dt


def twenty_turn_bytes(url: str, block_size: int, n_episodes: int) -> tuple[float, int]:
    pool = Pool(url, block_size=block_size)
    base = bytes_used(pool)
    rng = random.Random(1)
    n_steps = 0
    for _ in range(n_episodes):
        ep = pool.add_episode(Episode(task="bench"))
        ctx = rand_ids(rng, 600)  # system prompt + task
        batch = []
        for turn in range(20):
            resp = rand_ids(rng, rng.randrange(40, 200))
            batch.append(
                Step(
                    episode_id=ep.episode_id,
                    index=turn,
                    prompt_ids=list(ctx),
                    response_ids=resp,
                    response_logprobs=[-rng.random() for _ in resp],
                )
            )
            ctx = ctx + resp + rand_ids(rng, rng.randrange(20, 120))  # tool result / user turn
        pool.add_steps(batch)
        n_steps += len(batch)
    tokens = pool.stats()["tokens"]
    used = bytes_used(pool) - base
    pool.close()
    return used / n_steps, tokens["logical"] // n_steps, tokens["dedupe_ratio"]


def fill_for_leases(pool: Pool, n_steps: int) -> None:
    """Groups of 2 episodes x 50 turns (100 steps), finished with final rewards (one 1, one 0)."""
    rng = random.Random(2)
    per_group, groups_per_batch = 100, 2
    for b in range(n_steps // (per_group * groups_per_batch)):
        batch, eps = [], []
        for g in range(groups_per_batch):
            gid = f"g{b}-{g}"
            prompt = rand_ids(rng, 64)
            for _ in range(2):
                ep = pool.add_episode(Episode(task="bench", group_id=gid))
                eps.append(ep.episode_id)
                ctx = list(prompt)
                for turn in range(50):
                    resp = rand_ids(rng, 16)
                    # model_construct: skip the per-token validators, the fill is not what is measured
                    batch.append(
                        Step.model_construct(
                            step_id=f"step-{uuid.uuid4().hex}",
                            episode_id=ep.episode_id,
                            index=turn,
                            prompt_ids=list(ctx),
                            response_ids=resp,
                            response_logprobs=[-0.5] * 16,
                            policy="bench",
                            created_at=time.time(),
                        )
                    )
                    ctx += resp + rand_ids(rng, 8)
        pool.add_steps(batch)
        for i, ep_id in enumerate(eps):
            pool.end_episode(ep_id, reward=float(i % 2))


def lease_latency(pool: Pool, n: int, flt: StepFilter, **kw) -> tuple[float, float, int]:
    times, got = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        lease = pool.lease(flt, ttl_s=60, **kw)
        times.append(time.perf_counter() - t0)
        got += len(lease.steps)
        pool.ack(lease.lease_id, consumed_version=1)
    times.sort()
    return statistics.median(times) * 1e3, times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3, got // n


# ---------------------------------------------------------------- main
def run_backend(backend: str, lease_steps: int) -> None:
    print(f"\n== {backend} ==", flush=True)
    with fresh_db(backend) as new_url:
        for batch, n in ((1, 300), (64, 64 * 30)):
            rate = ingest_rate(new_url(), batch, n)
            print(
                f"ingest, batches of {batch:>2}: {rate:8.0f} steps/s  (512-token prompt, 64-token response)", flush=True
            )

        with_d, logical, token_ratio = twenty_turn_bytes(new_url(), 64, 10)
        without_d, _, _ = twenty_turn_bytes(new_url(), NO_DEDUPE, 10)
        print(
            f"20-turn episodes ({logical} tokens/step on average): {with_d:8.0f} B/step with dedupe, "
            f"{without_d:8.0f} B/step without -> {without_d / with_d:.1f}x smaller on disk "
            f"(token ids alone: {token_ratio:.1f}x)",
            flush=True,
        )

        pool = Pool(new_url())
        t0 = time.perf_counter()
        fill_for_leases(pool, lease_steps)
        n = pool.count_steps()
        print(f"filled {n} steps for leases in {time.perf_counter() - t0:.0f} s", flush=True)
        flt = StepFilter.trainable("bench")
        p50, p99, per = lease_latency(pool, 200, flt, max_groups=1)
        print(f"lease+tokens with {n} steps: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  ({per} steps/lease, 200 leases)")
        p50, p99, per = lease_latency(pool, 20, flt.model_copy(update={"nonzero_variance": True}), max_groups=1)
        print(f"  same with nonzero_variance (GROUP BY over the pool): p50 {p50:6.1f} ms  p99 {p99:6.1f} ms")
        pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lease-steps", type=int, default=100_000)
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()
    t0 = time.perf_counter()
    for backend in args.backends.split(","):
        if backend == "postgres" and postgres_admin_url() is None:
            print("\n== postgres == skipped: no SWARM_TEST_POSTGRES_URL and nothing on 127.0.0.1:5432")
            continue
        run_backend(backend, args.lease_steps)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
