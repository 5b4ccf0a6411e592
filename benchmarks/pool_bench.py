"""Pool benchmark (not a test): ingest rate, bytes on disk per step against naive int32 arrays, lease latency.

    python benchmarks/pool_bench.py [--parts ingest,bytes,lease,pages,context,driver] [--backends sqlite,postgres]
                                    [--lease-steps 100000] [--episodes 20] [--block-size 64] [--breakdown]

For SQLite (a fresh file under a temp dir) and PostgreSQL (a fresh database on
$SWARM_TEST_POSTGRES_URL or, if reachable, postgres@127.0.0.1:5432, dropped afterwards) it prints:
  - ``ingest``: steps/s ingested through ``add_steps`` in batches of 1 and of 64;
  - ``bytes``: bytes on disk per step of 30-step agent episodes (each turn's prompt is the whole
    context so far: a 600-token system prompt and task, then every reply of 40-200 tokens and every
    tool result of 20-120 tokens; float32 logprobs as the backends produce them; the timings, finish
    reason and gateway metadata a recorded call carries), against naive int32 arrays of
    the same tokens (4 bytes x (prompt + response) tokens per step), with block dedupe
    (``--block-size``) and without (every sequence inline); ``--breakdown`` adds the bytes per step
    of every table and index (SQLite's ``dbstat``, PostgreSQL's relation sizes) and of the steps
    row's columns. ``--text`` also stores each reply's text and tool call, ``--messages`` each call's
    chat history (``prompt_messages``: the whole conversation again at every step, not deduplicated);
  - ``context``: CPU-ms per step of ``add_steps`` at 2 / 20 / 80 turns of one conversation, each step cut from
    scratch and cut from the episode's previous step (``swarm/pool/prefixes.py``), side by side;
  - ``driver`` (SQLite): the gateway's hot statements on the driver and through SQLAlchemy, side by side
    (``Dialect.driver_sql``): ``add_steps`` of 1 and of 11 two-message chat steps (what a batch holds at one and at
    32 clients) and ``episode_heads`` of 1 and 5 episodes, CPU-us a call;
  - ``lease``: lease latency p50 / p99 (lease of one group: 2 episodes x 50 turns = 100 steps with
    their tokens; then ack) with N steps in the pool (default 100k), plus one lease with the
    non-zero-variance group filter.
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

import psutil
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.pool import Pool, StepFilter  # noqa: E402
from swarm.records import Episode, Source, Step  # noqa: E402

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


_WORDS = ("the", "result", "is", "tool", "call", "value", "check", "next", "answer", "compute", "file", "line")


def rand_text(rng: random.Random, n_tokens: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_tokens))  # ~4.5 bytes a token, like English BPE


def f32_logprobs(rng: random.Random, n: int) -> list[float]:
    """Logprobs as the backends record them: float32 values (torch / vLLM sample in float32) as Python floats."""
    return array("f", [-rng.expovariate(2.0) for _ in range(n)]).tolist()


def agent_episode(rng: random.Random, episode_id: str, turns: int, text: bool, messages: bool) -> list[Step]:
    """One agent episode as the gateway records it: every turn's prompt is the whole context so far; ``text``:
    with the reply's text and tool call, ``messages``: with the chat history too."""
    ctx = rand_ids(rng, 600)  # system prompt + task
    msgs: list[dict] = [{"role": "system", "content": rand_text(rng, 400)},
                        {"role": "user", "content": rand_text(rng, 200)}]
    steps, parent = [], None
    for turn in range(turns):
        n_resp = rng.randrange(40, 200)
        resp = rand_ids(rng, n_resp)
        call = f"chatcmpl-{rng.randbytes(12).hex()}"
        tool = turn < turns - 1
        reply = rand_text(rng, n_resp)
        calls = [{"id": f"call_{rng.randbytes(6).hex()}", "type": "function",
                  "function": {"name": "run", "arguments": '{"cmd": "' + rand_text(rng, 6) + '"}'}}] if tool else []
        step = Step(
            episode_id=episode_id, index=turn, parent_step_id=parent, task="bench", group_id=f"g-{episode_id}",
            policy="default", prompt_messages=list(msgs) if messages else None, prompt_ids=list(ctx),
            response_text=reply if text else None, tool_calls=calls if text else [], response_ids=resp,
            response_logprobs=f32_logprobs(rng, n_resp),
            finish_reason="tool_calls" if tool else "stop", response_id=call, prefix_consistent=True,
            timings={"queue_s": rng.random() * 1e-3, "prompt_s": rng.random() * 1e-3, "generate_s": rng.random(),
                     "total_s": 1 + rng.random()},
            metadata={"kind": "chat", "call_id": call, "choice": 0, "n": 1,
                      "prefix_reason": "extends the previous call"},
        )
        steps.append(step)
        parent = step.step_id
        n_tool = rng.randrange(20, 120)
        ctx = ctx + resp + rand_ids(rng, n_tool)  # tool result / user turn
        msgs += [{"role": "assistant", "content": reply, "tool_calls": calls},
                 {"role": "tool", "tool_call_id": calls[0]["id"] if calls else "", "content": rand_text(rng, n_tool)}]
    return steps


def relation_bytes(pool: Pool) -> dict[str, int]:
    """Bytes on disk of every table and index (SQLite: ``dbstat`` pages; PostgreSQL: relation sizes, TOAST
    counted with its table)."""
    with pool.engine.connect() as c:
        if pool.dialect == "sqlite":
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            return {n: int(b) for n, b in c.exec_driver_sql("SELECT name, sum(pgsize) FROM dbstat GROUP BY name")}
        q = ("SELECT c.relname, pg_relation_size(c.oid) + CASE WHEN c.reltoastrelid = 0 THEN 0 "
             "ELSE pg_total_relation_size(c.reltoastrelid) END FROM pg_class c "
             "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')")
        return {n: int(b) for n, b in c.exec_driver_sql(q)}


_STEP_COLUMNS = ("step_id", "episode_id", "parent_step_id", "group_id", "response_id", "block_keys", "tail",
                 "logprobs", "body", "meta", "digest")


def column_bytes(pool: Pool) -> dict[str, float]:
    """Mean stored bytes per step of the steps row's wide columns (PostgreSQL ``pg_column_size``, after any
    compression; SQLite ``length``: bytes of a blob, characters of text)."""
    size = "pg_column_size({})" if pool.dialect != "sqlite" else "length({})"
    have = {col["name"] for col in sa.inspect(pool.engine).get_columns("steps")}
    cols = [c for c in _STEP_COLUMNS if c in have]
    sql = "SELECT count(*), " + ", ".join(f"coalesce(sum({size.format(c)}), 0)" for c in cols) + " FROM steps"
    with pool.engine.connect() as c:
        n, *sums = c.exec_driver_sql(sql).one()
    return {col: float(v) / max(n, 1) for col, v in zip(cols, sums, strict=True)}


def episode_bytes(url: str, block_size: int, n_episodes: int, text: bool = False, messages: bool = False) -> dict:
    """Bytes on disk per step of ``n_episodes`` 30-step agent episodes, against naive int32 arrays."""
    pool = Pool(url, block_size=block_size)
    rng = random.Random(1)
    before_rel, base = relation_bytes(pool), bytes_used(pool)
    n_steps = n_tokens = 0
    for _ in range(n_episodes):
        ep = pool.add_episode(Episode(task="bench"))
        batch = agent_episode(rng, ep.episode_id, 30, text, messages)
        pool.add_steps(batch)
        n_steps += len(batch)
        n_tokens += sum(s.length for s in batch)
    used = bytes_used(pool) - base
    after_rel = relation_bytes(pool)
    rel = {k: (v - before_rel.get(k, 0)) / n_steps for k, v in after_rel.items() if v - before_rel.get(k, 0)}
    out = {"per_step": used / n_steps, "tokens": n_tokens / n_steps, "naive": 4 * n_tokens / n_steps,
           "relations": rel, "columns": column_bytes(pool)}
    pool.close()
    return out


def print_breakdown(res: dict) -> None:
    rel = sorted(res["relations"].items(), key=lambda kv: -kv[1])
    print(f"  {'table / index':<40} {'B/step':>8}")
    for name, b in rel:
        print(f"  {name:<40} {b:8.0f}")
    print(f"  {'(sum)':<40} {sum(res['relations'].values()):8.0f}")
    cols = "  ".join(f"{k} {v:.0f}" for k, v in sorted(res["columns"].items(), key=lambda kv: -kv[1]))
    print(f"  steps columns, mean B/step: {cols}", flush=True)


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
def run_bytes(new_url: Callable[[], str], args: argparse.Namespace) -> None:
    with_d = episode_bytes(new_url(), args.block_size, args.episodes, args.text, args.messages)
    without_d = episode_bytes(new_url(), NO_DEDUPE, args.episodes, args.text, args.messages)
    what = "ids, logprobs, metadata" + (", reply text" if args.text else "")
    what += ", chat history" if args.messages else ""
    print(f"30-step episodes ({what}; {with_d['tokens']:.0f} tokens/step on average, naive int32 "
          f"{with_d['naive']:.0f} B/step):", flush=True)
    for name, r in (("with dedupe", with_d), ("without (inline)", without_d)):
        print(f"  {name:<17} {r['per_step']:8.0f} B/step -> {r['naive'] / r['per_step']:.2f}x below naive int32",
              flush=True)
        if args.breakdown:
            print_breakdown(r)


def page_writes(d: str, rounds: int = 3) -> dict[int, dict[str, float]]:
    """SQLite only: 30-step agent episodes written one step per transaction (as the gateway records a call) into
    files of 4 KB and 16 KB pages, interleaved; per step: wall and CPU ms, KiB written (WAL pages) and file bytes."""
    from swarm.pool.engines.sqlite import SQLite

    proc = psutil.Process()
    res = {p: {"wall": 0.0, "cpu": 0.0, "written": 0.0, "n": 0} for p in (4096, 16384)}
    pools = {p: Pool(f"sqlite:///{d}/pages{p}.db", sql=SQLite(page_size=p)) for p in res}
    for rnd in range(rounds):
        for page, pool in pools.items():
            rng, r = random.Random(rnd), res[page]
            w0, t0, c0 = proc.io_counters().write_bytes, time.perf_counter(), time.process_time()
            for _ in range(2):
                ep = pool.add_episode(Episode(task="bench"))
                for st in agent_episode(rng, ep.episode_id, 30, True, False):
                    pool.add_steps([st])
                    r["n"] += 1
            r["wall"] += time.perf_counter() - t0
            r["cpu"] += time.process_time() - c0
            r["written"] += proc.io_counters().write_bytes - w0
    for page, pool in pools.items():
        pool.close()
        n = res[page].pop("n")
        res[page] = {"wall_ms": 1000 * res[page]["wall"] / n, "cpu_ms": 1000 * res[page]["cpu"] / n,
                     "written_kib": res[page]["written"] / n / 1024,
                     "file_b": os.path.getsize(f"{d}/pages{page}.db") / n}
    return res


def context_cost(url: str, turns: int, reuse: bool, batches: int = 40, batch: int = 8) -> float:
    """CPU-ms per step of ``add_steps`` in ``batch``-step batches, each step a conversation at ``turns`` turns
    (a 2,000-character system prompt, 300-character turns, 80 tokens a turn: the whole context again at every
    call, as the gateway records it); ``reuse=False`` cuts every step from scratch (a memo that keeps nothing)."""
    from swarm.pool.prefixes import PrefixMemo

    pool = Pool(url)
    if not reuse:
        pool._prefixes = PrefixMemo(capacity=0)
    eps = [Episode(episode_id=f"ctx-{uuid.uuid4().hex}", task="bench") for _ in range(batch)]
    pool.add_episodes(eps)
    msgs = [{"role": "system", "content": "x" * 2000}] + [
        {"role": "user" if j % 2 == 0 else "assistant", "content": f"turn {j} " + "y" * 300} for j in range(turns)]

    def step(e: Episode, i: int) -> Step:
        return Step(step_id=f"s-{uuid.uuid4().hex}", episode_id=e.episode_id, index=i, policy="p", policy_version=0,
                    source=Source.blackbox, prompt_messages=msgs, prompt_ids=list(range(100, 100 + turns * 80)),
                    response_ids=list(range(200, 245)), response_text="Sure: " * 8, response_logprobs=[-0.25] * 45,
                    finish_reason="stop", metadata={"kind": "chat", "choice": 0, "n": 1}, timings={"total_s": 0.002})

    work = [[step(e, i) for e in eps] for i in range(batches)]
    t = time.process_time()
    for b in work:
        pool.add_steps(b)
    cpu = time.process_time() - t
    pool.close()
    return 1e3 * cpu / (batches * batch)


def driver_cost(url: str, driver_sql: bool, rounds: int = 300) -> dict[str, float]:
    """CPU-us a call of the gateway's hot pool calls with its statements on the driver or through SQLAlchemy: a batch
    of 1 and of 11 chat steps (two messages, 24 + 10 tokens, the metadata a recorded call carries) appended to open
    episodes, and the heads of 1 and 5 of them."""
    pool = Pool(url)
    pool.sql.driver_sql = driver_sql
    eps = [Episode(episode_id=f"drv-{uuid.uuid4().hex}", task="bench") for _ in range(11)]
    pool.add_episodes(eps)
    msgs = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Please repeat this sentence back to me."}]

    def step(e: Episode) -> Step:
        return Step(step_id=f"s-{uuid.uuid4().hex}", episode_id=e.episode_id, index=0, policy="p", policy_version=0,
                    source=Source.blackbox, prompt_messages=msgs, prompt_ids=list(range(100, 124)),
                    response_ids=list(range(200, 210)), response_text="Sure: please repeat this sentence back to me.",
                    response_logprobs=[-0.25] * 10, finish_reason="stop",
                    metadata={"kind": "chat", "call_id": f"chatcmpl-{uuid.uuid4().hex}", "choice": 0, "n": 1},
                    timings={"prepare_s": 0.001, "generate_s": 0.002, "total_s": 0.003})

    out = {}
    for n in (1, 11):
        work = [[step(e) for e in eps[:n]] for _ in range(rounds)]
        t = time.process_time()
        for b in work:
            pool.add_steps(b, append=True)
        out[f"add_steps x{n}"] = 1e6 * (time.process_time() - t) / rounds
    for n in (1, 5):
        ids = [e.episode_id for e in eps[:n]]
        t = time.process_time()
        for _ in range(rounds * 10):
            pool.episode_heads(ids)
        out[f"episode_heads x{n}"] = 1e6 * (time.process_time() - t) / (rounds * 10)
    pool.close()
    return out


def run_backend(backend: str, args: argparse.Namespace) -> None:
    print(f"\n== {backend} ==", flush=True)
    parts = args.parts.split(",")
    with fresh_db(backend) as new_url:
        if "ingest" in parts:
            for batch, n in ((1, 300), (64, 64 * 30)):
                rate = ingest_rate(new_url(), batch, n)
                print(f"ingest, batches of {batch:>2}: {rate:8.0f} steps/s  (512-token prompt, 64-token response)",
                      flush=True)
        if "bytes" in parts:
            run_bytes(new_url, args)
        if "context" in parts:
            for turns in (2, 20, 80):
                fresh, memo = context_cost(new_url(), turns, False), context_cost(new_url(), turns, True)
                print(f"add_steps at {turns:>2} turns (8-step batches): {fresh:.3f} CPU-ms/step cut from scratch, "
                      f"{memo:.3f} cut from the previous step (x{memo / fresh:.2f})", flush=True)
        if "driver" in parts and backend == "sqlite":
            core, driver = driver_cost(new_url(), False), driver_cost(new_url(), True)
            for k in core:
                print(f"{k:17s}: {core[k]:7.1f} CPU-us through SQLAlchemy, {driver[k]:7.1f} on the driver "
                      f"(x{driver[k] / core[k]:.2f})", flush=True)
        if "pages" in parts and backend == "sqlite":
            with tempfile.TemporaryDirectory() as d:
                for page, r in page_writes(d).items():
                    print(f"pages of {page // 1024:>2} KB, one step a transaction: {r['wall_ms']:.2f} ms/step, "
                          f"{r['cpu_ms']:.2f} CPU-ms/step, {r['written_kib']:.1f} KiB written/step", flush=True)
        if "lease" not in parts:
            return
        pool = Pool(new_url())
        t0 = time.perf_counter()
        fill_for_leases(pool, args.lease_steps)
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
    ap.add_argument("--parts", default="ingest,bytes,lease", help="which measurements: ingest, bytes, lease, pages (SQLite page "
                    "size's write cost), context (a step's write cost against its conversation's length), driver "
                    "(SQLite's hot statements on the driver and through SQLAlchemy)")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--lease-steps", type=int, default=100_000)
    ap.add_argument("--episodes", type=int, default=20, help="30-step episodes of the bytes measurement")
    ap.add_argument("--block-size", type=int, default=64, help="token block length of the bytes measurement")
    ap.add_argument("--breakdown", action="store_true", help="bytes per step of every table, index and column")
    ap.add_argument("--text", action="store_true", help="store each reply's text and tool call too")
    ap.add_argument("--messages", action="store_true", help="store each call's chat history too")
    args = ap.parse_args()
    t0 = time.perf_counter()
    for backend in args.backends.split(","):
        if backend == "postgres" and postgres_admin_url() is None:
            print("\n== postgres == skipped: no SWARM_TEST_POSTGRES_URL and nothing on 127.0.0.1:5432")
            continue
        run_backend(backend, args)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
