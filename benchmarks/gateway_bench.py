"""Gateway overhead with a null (echo) backend: what recording a call costs, on SQLite and PostgreSQL.

1. Added latency at one client: p50 / p99 of one chat call through the real gateway (``python -m
   flows.serve`` on loopback, the step stored before the answer) versus the same EchoBackend
   served over HTTP *directly* (a bare uvicorn + FastAPI route that records nothing, same client).
2. Recorded steps/s at 1, 8, 32 and 128 concurrent clients, each running 4-turn episodes (``--turns``: begin,
   four chat calls extending the history, end), so the prefix-consistent path and the episode
   routes are exercised; and the gateway's CPU milliseconds per recorded step (user + system
   time of the server process tree over the run, episode begin/end included). The load comes
   from ``--client-procs`` separate processes (aiohttp), not from the server's process.
3. Every acknowledged step is verified in the pool afterwards: the same step ids, episode
   indices 0..n-1, and every turn after the first prefix consistent.

Run: ``.venv/bin/python benchmarks/gateway_bench.py``;
``--pools sqlite postgres`` (PostgreSQL from ``SWARM_TEST_POSTGRES_URL``, a fresh database is
created and dropped), ``--clients 1 8 32 128``, ``--duration 6``. Prints a table and ratios.
``--turns 10 --system-chars 2000``: longer episodes with an agent's long instructions (issue 46's workload).
``--profile PATH``: py-spy samples the server at the largest level (raw stacks to PATH) and a table of its CPU
per recorded step by area is printed (routing, auth, body parsing, hostile-input checks, template, prefix check,
pool, serialization, HTTP, thread hops, event loop; docs/gateway.md "What a request costs").
``--against REF [--this REF2] --rounds N``: the gateway as committed at REF (and REF2, else this working tree),
SQLite, alternated N times so the machine's load falls on both; the last line is the ratio.
Numbers depend on the machine and on what else runs on it: the load generator shares the
cores with the server, so on a 2-core machine steps/s is bounded by both together; the CPU
milliseconds per step are the server's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
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
TURNS = 4  # chat calls per episode (--turns)


def messages(system_chars: int) -> list[dict[str, str]]:
    """The first turn's messages; ``system_chars`` > 0: a system prompt that long (an agent's long instructions)."""
    if system_chars <= 0:
        return list(MESSAGES)
    words = ("You are a careful agent. Follow the rules, use the tools when they help, and answer briefly. " * (
        system_chars // 90 + 1))[:system_chars]
    return [{"role": "system", "content": words}, MESSAGES[1]]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


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
async def _agent(http: aiohttp.ClientSession, task: str, stop_at: float, acked: list[str], turns: int,
                 first: list[dict[str, str]]) -> None:
    while time.perf_counter() < stop_at:
        async with http.post("/v1/episodes", json={"task": task}) as r:
            ep = await r.json()
        headers = {"Authorization": f"Bearer {ep['api_key']}"}
        msgs = list(first)
        for k in range(turns):
            async with http.post("/v1/chat/completions", headers=headers,
                                 json={"model": "default", "messages": msgs, "max_tokens": 64}) as r:
                assert r.status == 200, await r.text()
                out = await r.json()
            acked.append(out["swarm"]["step_id"])
            msgs += [out["choices"][0]["message"], {"role": "user", "content": f"turn {k}"}]
        async with http.post(f"/v1/episodes/{ep['episode_id']}/end", headers=headers, json={"reward": 1.0}) as r:
            assert r.status == 200, await r.text()


def _load_proc(url: str, task: str, clients: int, duration: float, ready: Any, q: Any, turns: int,
               first: list[dict[str, str]]) -> None:
    async def run() -> list[str]:
        acked: list[str] = []
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(url, connector=conn) as http:
            ready.wait()  # all load processes are up: the clock starts now
            stop = time.perf_counter() + duration
            await asyncio.gather(*[_agent(http, task, stop, acked, turns, first) for _ in range(clients)])
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


def load(url: str, server: psutil.Process, task: str, clients: int, duration: float, procs: int, turns: int = TURNS,
         first: list[dict[str, str]] | None = None, profile: str | None = None) -> tuple[list[str], float, float]:
    """(acknowledged step ids, wall seconds, server CPU seconds) for ``clients`` agents.

    ``profile``: a path where py-spy writes the server's stacks (raw, collapsed) sampled during the load."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    n_procs = max(1, min(procs, clients))
    ready = ctx.Barrier(n_procs + 1)
    workers = [ctx.Process(target=_load_proc, args=(url, task, clients // n_procs + (i < clients % n_procs),
                                                    duration, ready, q, turns, first or MESSAGES))
               for i in range(n_procs)]
    for w in workers:
        w.start()
    ready.wait()
    with py_spy(server.pid, duration, profile):
        c0, t0 = cpu_s(server), time.perf_counter()
        acked = [sid for _ in workers for sid in q.get()]  # the last call ends a little after the duration
        secs, cpu = time.perf_counter() - t0, cpu_s(server) - c0
        for w in workers:
            w.join()
    return acked, secs, cpu


@contextlib.contextmanager
def py_spy(pid: int, duration: float, path: str | Path | None) -> Iterator[None]:
    """py-spy samples ``pid`` (GIL-held samples, 200 Hz, raw collapsed stacks to ``path``) for ``duration`` seconds
    from the block's start: the load's duration, not its tail (the last calls finishing). Nothing when ``path`` is
    None; a failed py-spy raises once the block is done."""
    if path is None:
        yield
        return
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking", "-r", "200", "--gil",
                            "-f", "raw", "-d", str(max(1, int(duration))), "-p", str(pid), "-o", str(path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    yield
    _, err = spy.communicate(timeout=60)
    if spy.returncode != 0:
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.decode()[-2000:]}")


def verify(pool_url: str, task: str, acked: list[str]) -> None:
    """Every acknowledged step is stored, numbered 0..n-1 in its episode, turns after the first prefix consistent."""
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


# ---------------------------------------------------------------- profile areas
# Each sampled stack (py-spy, GIL holder only: the Python CPU work) goes to one area: the innermost frame that names
# one of ours or a library's entry point for that work; stacks with none of them go to the generic layer they are in.
AREAS: list[tuple[str, str]] = [  # (area, regex over "function (file)" frames), most specific first
    ("hostile-input checks", r"\(swarm/web/limits\.py|\(swarm/policy/textguard\.py|_check_prompt_vocab|"
                             r"\(swarm/gateway/hosts\.py|BodyLimit|\(swarm/gateway/connections\.py|\(swarm/pool/checks\.py"),
    ("auth (episode key)", r"\(swarm/web/auth\.py|episode_caller|client_caller|any_caller|fastapi/security"),
    ("tokenize / chat template", r"render_chat|EchoBackend\.encode|EchoBackend\.decode|\(swarm/policy/templates"),
    ("backend generate (null)", r"EchoBackend\.|\(swarm/policy/"),
    ("prefix-consistency check", r"\(swarm/gateway/prefix\.py|\(swarm/gateway/episodes\.py"),
    ("pool write (SQLite)", r"\(swarm/pool/|\(sqlalchemy/|\(sqlite3/|_write_steps|add_steps|add_episodes|end_episodes"),
    ("response serialization", r"\(starlette/responses\.py|\(swarm/gateway/openai_format\.py|fastapi/encoders|"
                               r"serialize_response|_answer|\(orjson"),
    ("body parsing / validation", r"request_body_to_args|_validate_value|\(fastapi/_compat|Request\.json|Request\.body|"
                                  r"FastLane\._prepare|FastLane\._read|_messages \(swarm/gateway/calls|normalize_messages"),
    ("step record + handler", r"\(swarm/"),
    ("routing / deps (FastAPI)", r"\(fastapi/|\(starlette/"),
    ("HTTP server (uvicorn)", r"\(uvicorn/|\(h11/|\(httptools/"),
    ("thread hops (anyio)", r"\(anyio/|\(concurrent/|\(queue\.py|\(threading\.py"),
    ("event loop, sockets", r"\(asyncio/|\(selectors\.py|\(socket\.py"),
]
_IDLE = re.compile(r"^(Condition\.wait|EpollSelector\.select|Thread\._wait_for_tstate_lock|Queue\.get|sleep) ")


def _area(frames: list[str], areas: list[tuple[str, str]]) -> str:
    """The innermost frame that matches an area wins; the list's order breaks ties within one frame."""
    for f in reversed(frames):
        for area, pattern in areas:
            if re.search(pattern, f):
                return area
    return "other"


def area_table(raw: str, cpu_ms_per_step: float, areas: list[tuple[str, str]] | None = None, unit: str = "step") -> str:
    """A table of py-spy raw (collapsed) stacks by area (``areas``, default :data:`AREAS`): samples, share, and ms per
    ``unit`` (a recorded step; the proxy bench's request)."""
    areas = AREAS if areas is None else areas
    counts: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        if not frames or _IDLE.match(frames[-1]):
            continue
        area = _area(frames, areas)
        counts[area] = counts.get(area, 0) + int(n)
    total = sum(counts.values()) or 1
    order = [a for a, _ in areas] + ["other"]
    lines = [f"  {'area':30s} {'samples':>8s} {'share':>6s} {'ms/' + unit:>8s}"]
    for area in order:
        if counts.get(area):
            c = counts[area]
            lines.append(f"  {area:30s} {c:8d} {100 * c / total:5.1f}% {cpu_ms_per_step * c / total:8.3f}")
    lines.append(f"  {'total (GIL-held samples)':30s} {total:8d} 100.0% {cpu_ms_per_step:8.3f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def spawn_gateway(repo: Path, pool_url: str) -> Any:
    """``python -m flows.serve model=echo`` of the tree at ``repo`` (this one, or ``--against``'s export) on loopback;
    a loaded 2-core machine can take a minute to start it."""
    from flows.serve import spawn

    return spawn("model=echo", f"pool.url={pool_url}", env={"SWARM_POOL_URL": None}, timeout_s=240, repo=repo)


def bench_pool(name: str, pool_url: str, args: argparse.Namespace, repo: Path = REPO,
               profile: str | None = None) -> dict[str, Any]:
    """Latency at one client, then steps/s per clients level; ``profile``: py-spy at the largest level."""
    gw = spawn_gateway(repo, pool_url)
    server = psutil.Process(gw.proc.pid)
    first = messages(args.system_chars)
    try:
        via = asyncio.run(latency(gw.url, args.calls, with_key=True)) if args.calls else []
        rows = []
        for n in args.clients:
            task = f"bench-{name}-{n}-{uuid.uuid4().hex[:6]}"
            prof = profile if n == max(args.clients) else None
            acked, secs, cpu = load(gw.url, server, task, n, args.duration, args.client_procs, args.turns, first, prof)
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


def export_tree(ref: str, dest: Path) -> Path:
    """The project as committed at ``ref`` (``git archive``), for ``--against``; the working tree is not touched."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], check=True,
                             capture_output=True).stdout
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def print_rows(label: str, res: dict[str, Any]) -> None:
    for n, acked, secs, cpu in res["rows"]:
        print(f"  {label:14s} {n:4d} clients: {acked / secs:8.1f} steps/s  {1e3 * cpu / max(acked, 1):6.2f} "
              f"CPU-ms/step  ({acked} steps in {secs:.1f} s, server CPU {cpu:.1f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="sequential calls for the latency numbers")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per concurrency level")
    ap.add_argument("--clients", type=int, nargs="*", default=[1, 8, 32, 128])
    ap.add_argument("--client-procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--pools", nargs="*", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    ap.add_argument("--turns", type=int, default=TURNS, help="chat calls per episode")
    ap.add_argument("--system-chars", type=int, default=0,
                    help="a system prompt this long (0: one short sentence); e.g. 2000 for an agent's instructions")
    ap.add_argument("--profile", metavar="PATH", help="py-spy the server at the largest clients level: raw stacks to "
                    "PATH (and PATH.against with --against) and a CPU table by area (AREAS below)")
    ap.add_argument("--against", metavar="REF", help="also run the gateway as committed at this git ref (sqlite), "
                    "alternating with this tree's, and print this tree's steps/s over REF's")
    ap.add_argument("--this", metavar="REF", help="with --against: this side is the tree as committed at REF, not the "
                    "working tree (uncommitted edits of other files then cannot leak into the comparison)")
    ap.add_argument("--rounds", type=int, default=1, help="with --against: alternations of the two gateways")
    args = ap.parse_args()

    server, direct_url = direct_server()
    direct = asyncio.run(latency(direct_url, args.calls, with_key=False)) if args.calls else []
    server.should_exit = True
    results: dict[str, dict[str, Any]] = {}
    against: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            ref_tree = export_tree(args.against, Path(tmp) / "against")
            this_tree = export_tree(args.this, Path(tmp) / "this") if args.this else REPO
            for r in range(args.rounds):  # alternated, so that the machine's load falls on both alike
                prof = r == args.rounds - 1 and args.profile
                sides = [(against, "against", ref_tree, f"{args.profile}.against"), (ours, "ours", this_tree, args.profile)]
                for out, name, tree, path in sides if r % 2 == 0 else sides[::-1]:  # neither side always goes first
                    out.append(bench_pool(name, f"sqlite:///{Path(tmp) / f'{name}{r}.db'}", args, tree,
                                          path if prof else None))
        for name in [] if args.against else args.pools:
            if name == "sqlite":
                results[name] = bench_pool(name, f"sqlite:///{Path(tmp) / 'bench.db'}", args,
                                           profile=args.profile)
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

    load_avg = os.getloadavg()
    this = f"at {args.this}" if args.this else "this tree"
    print(f"machine: {os.cpu_count()} CPUs (load avg {load_avg[0]:.1f} {load_avg[1]:.1f} {load_avg[2]:.1f}), "
          f"python {sys.version.split()[0]}; load from {args.client_procs} aiohttp process(es), {args.turns}-turn "
          f"episodes, system prompt {len(messages(args.system_chars)[0]['content'])} chars")
    if direct:
        d50, d99 = pct(direct, 0.5) * 1e3, pct(direct, 0.99) * 1e3
        print(f"latency, one client, {args.calls} sequential chat calls (echo backend, ~45 reply tokens)")
        print(f"  null backend over HTTP   p50 {d50:7.3f} ms   p99 {d99:7.3f} ms")
        both = {f"at {args.against}": against, this: ours} if against else {}
        sides = {**results, **{k: {"via": [t for r in v for t in r["via"]]} for k, v in both.items()}}  # all rounds
        for name, res in sides.items():
            g50, g99 = pct(res["via"], 0.5) * 1e3, pct(res["via"], 0.99) * 1e3
            print(f"  gateway, {name:14s}  p50 {g50:7.3f} ms   p99 {g99:7.3f} ms   added p50 {g50 - d50:+.3f} ms, "
                  f"mean x{statistics.mean(res['via']) / statistics.mean(direct):.2f}")
    print("recorded steps/s (every acknowledged step verified in the pool) and gateway CPU per step")
    for name, res in results.items():
        print_rows(name, res)
    for r, (a, o) in enumerate(zip(against, ours, strict=True)):
        print(f" round {r + 1}")
        print_rows(f"at {args.against}", a)
        print_rows(this, o)
    if args.profile:
        for path, res in ([(f"{args.profile}.against", against[-1]), (args.profile, ours[-1])] if against
                          else [(args.profile, next(iter(results.values())))]):
            n, acked, _, cpu = max(res["rows"])
            print(f"profile {path} ({n} clients; ms per recorded step = share x {1e3 * cpu / max(acked, 1):.2f} "
                  f"CPU-ms/step)")
            print(area_table(Path(path).read_text(), 1e3 * cpu / max(acked, 1)))
    if against:
        for i, n in enumerate(args.clients):
            a = [x["rows"][i][1] / x["rows"][i][2] for x in against]
            o = [x["rows"][i][1] / x["rows"][i][2] for x in ours]
            ca = [1e3 * x["rows"][i][3] / max(x["rows"][i][1], 1) for x in against]
            co = [1e3 * x["rows"][i][3] / max(x["rows"][i][1], 1) for x in ours]
            print(f"{n} clients: {this} {statistics.mean(o):.0f} steps/s ({statistics.mean(co):.2f} CPU-ms/step), "
                  f"{args.against} {statistics.mean(a):.0f} ({statistics.mean(ca):.2f}): "
                  f"x{statistics.mean(o) / statistics.mean(a):.2f} steps/s, CPU per step x{statistics.mean(co) / statistics.mean(ca):.2f}")


if __name__ == "__main__":
    main()
