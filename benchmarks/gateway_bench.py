"""Gateway overhead with a null (echo) backend: what the gateway itself costs per call.

1. Added latency: p50 / p99 of one chat call through the real gateway (uvicorn on loopback in a
   separate process, SQLite pool, step stored before the answer) versus calling the same
   EchoBackend's ``generate`` in-process.
2. Recorded steps/s at 1, 8 and 32 concurrent clients (httpx async; each client runs 4-turn
   episodes, so the prefix-consistent path is exercised), checked against the pool's count.

Run: ``.venv/bin/python benchmarks/gateway_bench.py [--calls 300] [--duration 8]``. Prints a
table and ratios. Numbers depend on the machine (and on what else runs on it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.serve import spawn  # noqa: E402
from swarm.policy.base import GenerateRequest, SamplingParams  # noqa: E402
from swarm.policy.echo import EchoBackend  # noqa: E402
from swarm.pool import Pool  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Please repeat this sentence back to me."}]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_server(db: Path) -> tuple[subprocess.Popen, str]:
    gw = spawn("model=echo", f"pool.url=sqlite:///{db}")
    return gw.proc, gw.url


async def backend_latency(calls: int) -> list[float]:
    backend = EchoBackend()
    req = GenerateRequest(policy="default", messages=MESSAGES, sampling=SamplingParams(max_tokens=64))
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        await backend.generate(req)
        out.append(time.perf_counter() - t)
    return out


async def health_latency(url: str, calls: int) -> list[float]:
    """The HTTP floor: a route that touches neither the pool nor the backend."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            await http.get("/health")
            out.append(time.perf_counter() - t)
        return out


async def gateway_latency(url: str, calls: int) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        ep = (await http.post("/v1/episodes", json={"task": "bench"})).json()
        headers = {"Authorization": f"Bearer {ep['api_key']}"}
        body = {"model": "default", "messages": MESSAGES, "max_tokens": 64}
        for _ in range(10):  # warm up connections and caches
            await http.post("/v1/chat/completions", json=body, headers=headers)
        out = []
        for _ in range(calls):
            t = time.perf_counter()
            r = await http.post("/v1/chat/completions", json=body, headers=headers)
            out.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
        return out


async def throughput(url: str, clients: int, duration: float) -> tuple[int, float]:
    acked = 0
    stop_at = time.perf_counter() + duration

    async def client() -> None:
        nonlocal acked
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while time.perf_counter() < stop_at:
                ep = (await http.post("/v1/episodes", json={"task": "bench"})).json()
                headers = {"Authorization": f"Bearer {ep['api_key']}"}
                msgs = list(MESSAGES)
                for k in range(4):
                    r = await http.post("/v1/chat/completions", headers=headers,
                                        json={"model": "default", "messages": msgs, "max_tokens": 64})
                    assert r.status_code == 200, r.text
                    acked += 1
                    msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": f"turn {k}"}]
                await http.post(f"/v1/episodes/{ep['episode_id']}/end", headers=headers, json={"reward": 1.0})

    t = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(clients)])
    return acked, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="sequential calls for the latency numbers")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per concurrency level")
    ap.add_argument("--clients", type=int, nargs="*", default=[1, 8, 32])
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        proc, url = start_server(db)
        try:
            direct = asyncio.run(backend_latency(args.calls))
            via = asyncio.run(gateway_latency(url, args.calls))
            floor = asyncio.run(health_latency(url, args.calls))
            rows = []
            for n in args.clients:
                before = Pool(f"sqlite:///{db}").count_steps()
                acked, secs = asyncio.run(throughput(url, n, args.duration))
                stored = Pool(f"sqlite:///{db}").count_steps() - before
                assert stored == acked, f"{acked} calls acknowledged but {stored} steps stored"
                rows.append((n, acked, secs))
        finally:
            proc.terminate()
            proc.wait(timeout=20)

    d50, d99 = pct(direct, 0.5) * 1e3, pct(direct, 0.99) * 1e3
    g50, g99 = pct(via, 0.5) * 1e3, pct(via, 0.99) * 1e3
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} CPUs (load avg {load:.1f}), python {sys.version.split()[0]}, "
          "pool: SQLite file (WAL)")
    print(f"latency over {args.calls} sequential chat calls (echo backend, 1-turn prompt, ~45 reply tokens)")
    print(f"  backend in-process   p50 {d50:8.3f} ms   p99 {d99:8.3f} ms")
    print(f"  GET /health (HTTP)   p50 {pct(floor, 0.5) * 1e3:8.3f} ms   p99 {pct(floor, 0.99) * 1e3:8.3f} ms")
    print(f"  through the gateway  p50 {g50:8.3f} ms   p99 {g99:8.3f} ms   (HTTP + auth + prefix + SQLite write)")
    print(f"  added by the gateway p50 {g50 - d50:8.3f} ms   p99 {g99 - d99:8.3f} ms   "
          f"ratio p50 {g50 / d50:,.0f}x, mean {statistics.mean(via) / statistics.mean(direct):,.0f}x")
    print("recorded steps/s (4-turn episodes, every acknowledged call counted in the pool)")
    base = rows[0][1] / rows[0][2]
    for n, acked, secs in rows:
        rate = acked / secs
        print(f"  {n:3d} clients: {rate:8.1f} steps/s  ({acked} steps in {secs:.1f} s)  x{rate / base:.2f} vs 1 client")


if __name__ == "__main__":
    main()
