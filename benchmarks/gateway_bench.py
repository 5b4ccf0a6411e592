"""Gateway overhead with a null (echo) backend: what recording a call costs, on SQLite and PostgreSQL.

1. Added latency at one client: p50 / p99 of one chat call through the real gateway (``python -m
   flows.serve`` on loopback, the step stored before the answer) versus the same EchoBackend
   served over HTTP *directly* (a bare uvicorn + FastAPI route that records nothing, same client).
2. Recorded steps/s at 1, 8, 32 and 128 concurrent clients, each running 4-turn episodes (begin,
   four chat calls extending the history, end), so the prefix-consistent path and the episode
   routes are exercised; and the gateway's CPU milliseconds per recorded step (user + system
   time of the server process tree over the run, episode begin/end included). The load comes
   from ``--client-procs`` separate processes (aiohttp), not from the server's process.
3. Every acknowledged step is verified in the pool afterwards: the same step ids, episode
   indices 0..3, and turns 2-4 prefix consistent.

Run: ``.venv/bin/python benchmarks/gateway_bench.py``;
``--pools sqlite postgres`` (PostgreSQL from ``SWARM_TEST_POSTGRES_URL``, a fresh database is
created and dropped), ``--clients 1 8 32 128``, ``--duration 6``. Prints a table and ratios.
Numbers depend on the machine and on what else runs on it: the load generator shares the
cores with the server, so on a 2-core machine steps/s is bounded by both together; the CPU
milliseconds per step are the server's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# the swarm imports are inside the functions that need them: the load generator processes
# re-import this module and should start in well under a second


MESSAGES = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Please repeat this sentence back to me."}]
TURNS = 4


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---------------------------------------------------------------- the null backend, served directly
def direct_server() -> tuple[Any, str]:
    """The EchoBackend behind a bare OpenAI-style route (no pool, no auth, no prefix logic)."""
    import uvicorn
    from fastapi import FastAPI

    from swarm.policy.base import GenerateRequest, SamplingParams
    from swarm.policy.echo import EchoBackend

    backend = EchoBackend()
    app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        req = GenerateRequest(policy="default", messages=body["messages"],
                              sampling=SamplingParams(max_tokens=body.get("max_tokens") or 64))
        g = (await backend.generate(req))[0]
        return {"object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": g.text}, "finish_reason": g.finish_reason}]}

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def latency(url: str, calls: int, with_key: bool) -> list[float]:
    """Sequential chat calls by one client; seconds each."""
    async with aiohttp.ClientSession(url) as http:
        headers = {}
        if with_key:
            async with http.post("/v1/episodes", json={"task": "bench-latency"}) as r:
                headers = {"Authorization": f"Bearer {(await r.json())['api_key']}"}
        body = {"model": "default", "messages": MESSAGES, "max_tokens": 64}
        out = []
        for i in range(calls + 10):
            t = time.perf_counter()
            async with http.post("/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                await r.read()
            if i >= 10:  # the first ten warm up connections and caches
                out.append(time.perf_counter() - t)
        return out


# ---------------------------------------------------------------- load
async def _agent(http: aiohttp.ClientSession, task: str, stop_at: float, acked: list[str]) -> None:
    while time.perf_counter() < stop_at:
        async with http.post("/v1/episodes", json={"task": task}) as r:
            ep = await r.json()
        headers = {"Authorization": f"Bearer {ep['api_key']}"}
        msgs = list(MESSAGES)
        for k in range(TURNS):
            async with http.post("/v1/chat/completions", headers=headers,
                                 json={"model": "default", "messages": msgs, "max_tokens": 64}) as r:
                assert r.status == 200, await r.text()
                out = await r.json()
            acked.append(out["swarm"]["step_id"])
            msgs += [out["choices"][0]["message"], {"role": "user", "content": f"turn {k}"}]
        async with http.post(f"/v1/episodes/{ep['episode_id']}/end", headers=headers, json={"reward": 1.0}) as r:
            assert r.status == 200, await r.text()


def _load_proc(url: str, task: str, clients: int, duration: float, ready: Any, q: Any) -> None:
    async def run() -> list[str]:
        acked: list[str] = []
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(url, connector=conn) as http:
            ready.wait()  # all load processes are up: the clock starts now
            stop = time.perf_counter() + duration
            await asyncio.gather(*[_agent(http, task, stop, acked) for _ in range(clients)])
        return acked

    q.put(asyncio.run(run()))


def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of a process and its children."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def load(url: str, server: psutil.Process, task: str, clients: int, duration: float,
         procs: int) -> tuple[list[str], float, float]:
    """(acknowledged step ids, wall seconds, server CPU seconds) for ``clients`` agents."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    n_procs = max(1, min(procs, clients))
    ready = ctx.Barrier(n_procs + 1)
    workers = [ctx.Process(target=_load_proc, args=(url, task, clients // n_procs + (i < clients % n_procs),
                                                    duration, ready, q)) for i in range(n_procs)]
    for w in workers:
        w.start()
    ready.wait()
    c0, t0 = cpu_s(server), time.perf_counter()
    acked = [sid for _ in workers for sid in q.get()]  # the last call ends a little after the duration
    secs, cpu = time.perf_counter() - t0, cpu_s(server) - c0
    for w in workers:
        w.join()
    return acked, secs, cpu


def verify(pool_url: str, task: str, acked: list[str]) -> None:
    """Every acknowledged step is stored, numbered 0..3 in its episode, turns after the first prefix consistent."""
    from swarm.pool import Pool, StepFilter

    pool = Pool(pool_url)
    try:
        steps = pool.query_steps(StepFilter(task=task), limit=10_000_000)
    finally:
        pool.close()
    assert sorted(s.step_id for s in steps) == sorted(acked), f"{len(acked)} acknowledged, {len(steps)} stored"
    by_ep: dict[str, list] = {}
    for s in steps:
        by_ep.setdefault(s.episode_id, []).append(s)
    for ep_steps in by_ep.values():
        ep_steps.sort(key=lambda s: s.index)
        assert [s.index for s in ep_steps] == list(range(len(ep_steps))), "episode indices not 0..n-1"
        assert all(s.prefix_consistent for s in ep_steps[1:]), "a later turn is not prefix consistent"


# ---------------------------------------------------------------- main
def bench_pool(name: str, pool_url: str, args: argparse.Namespace) -> dict[str, Any]:
    from flows.serve import spawn

    gw = spawn("model=echo", f"pool.url={pool_url}", env={"SWARM_POOL_URL": None}, timeout_s=60)
    server = psutil.Process(gw.proc.pid)
    try:
        via = asyncio.run(latency(gw.url, args.calls, with_key=True))
        rows = []
        for n in args.clients:
            task = f"bench-{name}-{n}-{uuid.uuid4().hex[:6]}"
            acked, secs, cpu = load(gw.url, server, task, n, args.duration, args.client_procs)
            verify(pool_url, task, acked)
            rows.append((n, len(acked), secs, cpu))
    finally:
        gw.stop()
    return {"via": via, "rows": rows}


def postgres_db(base: str) -> tuple[str, Any]:
    """A fresh database next to ``base``'s; returns its URL and a function that drops it."""
    import sqlalchemy as sa

    name = f"gwbench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f"CREATE DATABASE {name}")
    url = sa.engine.make_url(base).set(database=name).render_as_string(hide_password=False)

    def drop() -> None:
        with admin.connect() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()

    return url, drop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="sequential calls for the latency numbers")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per concurrency level")
    ap.add_argument("--clients", type=int, nargs="*", default=[1, 8, 32, 128])
    ap.add_argument("--client-procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--pools", nargs="*", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    args = ap.parse_args()

    server, direct_url = direct_server()
    direct = asyncio.run(latency(direct_url, args.calls, with_key=False))
    server.should_exit = True
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.pools:
            if name == "sqlite":
                results[name] = bench_pool(name, f"sqlite:///{Path(tmp) / 'bench.db'}", args)
                continue
            base = os.environ.get("SWARM_TEST_POSTGRES_URL")
            if not base:
                print("postgres: skipped (set SWARM_TEST_POSTGRES_URL)")
                continue
            url, drop = postgres_db(base)
            try:
                results[name] = bench_pool(name, url, args)
            finally:
                drop()

    load_avg = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs (load avg {load_avg:.1f}), python {sys.version.split()[0]}; "
          f"load from {args.client_procs} aiohttp process(es), {TURNS}-turn episodes")
    d50, d99 = pct(direct, 0.5) * 1e3, pct(direct, 0.99) * 1e3
    print(f"latency, one client, {args.calls} sequential chat calls (echo backend, ~45 reply tokens)")
    print(f"  null backend over HTTP   p50 {d50:7.3f} ms   p99 {d99:7.3f} ms")
    for name, res in results.items():
        g50, g99 = pct(res["via"], 0.5) * 1e3, pct(res["via"], 0.99) * 1e3
        print(f"  gateway, {name:8s}        p50 {g50:7.3f} ms   p99 {g99:7.3f} ms   added p50 {g50 - d50:+.3f} ms, "
              f"mean x{statistics.mean(res['via']) / statistics.mean(direct):.2f}")
    print("recorded steps/s (every acknowledged step verified in the pool) and gateway CPU per step")
    for name, res in results.items():
        for n, acked, secs, cpu in res["rows"]:
            print(f"  {name:8s} {n:4d} clients: {acked / secs:8.1f} steps/s  {1e3 * cpu / max(acked, 1):6.2f} CPU-ms/step"
                  f"  ({acked} steps in {secs:.1f} s, server CPU {cpu:.1f} s)")


if __name__ == "__main__":
    main()
