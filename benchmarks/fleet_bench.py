"""Several gateways, one pool: recorded steps/s through 1 vs 2 gateway processes on PostgreSQL.

N simulated clients (httpx async, spread over client processes) each run episodes of ``--turns``
chat calls against a null (echo) policy backend, so what is measured is the gateway and the
pool: request parsing, prefix-consistent tokenization keyed on the stored previous step, one
PostgreSQL transaction per step. With two gateways, client *i* talks to gateway *i mod 2*, and
every other episode switches gateway half-way (the key and the prefix still hold there).
Every gateway is its own ``python -m flows.serve`` process sharing one PostgreSQL database and
``SWARM_GATEWAY_SECRET``, as on separate hosts. Steps are checked against the pool's count.

Run: ``SWARM_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test
.venv/bin/python benchmarks/fleet_bench.py [--clients 32] [--duration 10] [--client-procs 2]``.
A fresh database is created and dropped. Numbers depend on the machine: on a host with fewer
cores than gateways + clients + PostgreSQL need, a second gateway cannot add much (it prints
the core count and load average next to the ratio).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import secrets
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.serve import spawn  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a relay agent in a benchmark."}


def start_gateway(pool_url: str, secret: str) -> tuple[subprocess.Popen, str]:
    gw = spawn("model=echo", f"pool.url={pool_url}", env={"SWARM_GATEWAY_SECRET": secret, "SWARM_POOL_URL": None},
               timeout_s=20)
    return gw.proc, gw.url


async def _client(urls: list[str], idx: int, turns: int, t_start: float, t_end: float,
                  out: dict[str, list[float]]) -> None:
    home = urls[idx % len(urls)]
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        ep_no = 0
        while time.perf_counter() < t_end:
            ep = (await http.post(home + "/v1/episodes", json={"task": "bench", "group_id": f"g{idx}-{ep_no}"})).json()
            auth = {"Authorization": f"Bearer {ep['api_key']}"}
            switch = len(urls) > 1 and ep_no % 2 == 1
            messages = [SYSTEM]
            for t in range(turns):
                url = urls[(idx + 1) % len(urls)] if switch and t >= turns // 2 else home
                messages.append({"role": "user", "content": f"client {idx} episode {ep_no} turn {t}: relay this"})
                t0 = time.perf_counter()
                r = await http.post(url + "/v1/chat/completions", headers=auth,
                                    json={"model": "default", "messages": messages, "max_tokens": 64})
                t1 = time.perf_counter()
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
                body = r.json()
                if t > 0 and body["swarm"]["prefix_consistent"] is not True:
                    raise RuntimeError(f"turn {t} was not prefix consistent: {body['swarm']}")
                messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
                if t_start <= t0 and t1 <= t_end:
                    out["lat"].append(t1 - t0)
                out["all"].append(1.0)
            await http.post(f"{home}/v1/episodes/{ep['episode_id']}/end", json={"reward": 1.0}, headers=auth)
            ep_no += 1


def client_proc(urls: list[str], first: int, n: int, turns: int, warmup: float, duration: float,
                t0_wall: float) -> dict[str, object]:
    """One client process: ``n`` async clients; returns latencies of calls inside the window."""
    async def main() -> dict[str, object]:
        # all client processes share one wall-clock window
        now = time.perf_counter()
        t_start = now + (t0_wall - time.time()) + warmup
        t_end = t_start + duration
        out: dict[str, list[float]] = {"lat": [], "all": []}
        await asyncio.gather(*(_client(urls, first + i, turns, t_start, t_end, out) for i in range(n)))
        return {"lat": out["lat"], "calls": len(out["all"])}

    return asyncio.run(main())


def measure(urls: list[str], clients: int, procs: int, turns: int, warmup: float, duration: float) -> dict:
    t0_wall = time.time() + 2.0  # time for the client processes to start
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    firsts = [sum(per[:i]) for i in range(procs)]
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        res = pool.starmap(client_proc, [(urls, f, n, turns, warmup, duration, t0_wall)
                                         for f, n in zip(firsts, per, strict=True)])
    lat = [x for r in res for x in r["lat"]]
    calls = sum(r["calls"] for r in res)
    return {"steps_per_s": len(lat) / duration, "p50_ms": 1000 * statistics.median(lat),
            "p99_ms": 1000 * sorted(lat)[int(0.99 * (len(lat) - 1))], "calls": calls}


def run_config(base_url: str, gateways: int, args: argparse.Namespace) -> dict:
    import sqlalchemy as sa

    from swarm.pool import Pool, StepFilter

    name = f"swarm_fleet_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(base_url).set(database=name).render_as_string(hide_password=False)
    Pool(url).close()  # the schema, before the gateways race for it
    secret = secrets.token_hex(32)
    servers = []
    try:
        for _ in range(gateways):
            servers.append(start_gateway(url, secret))
        result = measure([u for _, u in servers], args.clients, args.client_procs, args.turns, args.warmup,
                         args.duration)
        pool = Pool(url)
        stored = pool.count_steps(StepFilter())
        pool.close()
        if stored < result["calls"]:
            raise RuntimeError(f"pool has {stored} steps, clients got {result['calls']} answers")
        result["stored"] = stored
        return result
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(15)
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pg-url", default=os.environ.get("SWARM_TEST_POSTGRES_URL"),
                   help="PostgreSQL server URL (a database is created and dropped on it)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--gateways", default="1,2", help="gateway counts to compare")
    args = p.parse_args()
    if not args.pg_url:
        sys.exit("set SWARM_TEST_POSTGRES_URL or pass --pg-url (a PostgreSQL server)")
    counts = [int(x) for x in args.gateways.split(",")]
    print(f"fleet_bench: {args.clients} clients in {args.client_procs} processes, {args.turns}-turn episodes, "
          f"echo backend, PostgreSQL pool, {args.duration:.0f} s window after {args.warmup:.0f} s warm-up")
    rows = {}
    for g in counts:
        rows[g] = run_config(args.pg_url, g, args)
        r = rows[g]
        print(f"  gateways={g}: {r['steps_per_s']:8.1f} steps/s   p50 {r['p50_ms']:6.1f} ms   "
              f"p99 {r['p99_ms']:7.1f} ms   (stored {r['stored']} steps, all answers accounted for)", flush=True)
    if len(counts) >= 2:
        a, b = counts[0], counts[-1]
        ratio = rows[b]["steps_per_s"] / rows[a]["steps_per_s"]
        load = os.getloadavg()
        print(f"scaling ratio {b} vs {a} gateways: {ratio:.2f}x   "
              f"(machine: {os.cpu_count()} CPU cores shared by {b} gateways + {args.client_procs} client processes "
              f"+ PostgreSQL; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})")


if __name__ == "__main__":
    main()
