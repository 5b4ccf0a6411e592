"""Dashboard API latency on a large pool: ``python tests/dashboard/bench_dashboard.py --steps 1000000``.

Bulk-fills a SQLite pool (tests/dashboard/bulk.py), serves it through the real gateway on
loopback and times every dashboard endpoint over HTTP: the first call (cold caches: it includes
the one blocking aggregate snapshot) and the median of warm calls, next to what a naive
dashboard would run per poll (``Pool.stats()``: full grouped scans) and an exact
``count_steps``. Prints a table; asserts nothing (tests/dashboard/test_dashboard_scale.py does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bulk import fill  # noqa: E402

from swarm.gateway import GatewaySettings  # noqa: E402
from swarm.policy.echo import EchoBackend  # noqa: E402
from swarm.pool import Pool, StepFilter  # noqa: E402
from swarm.stack import start_stack  # noqa: E402


def endpoints(pool: Pool) -> dict[str, str]:
    step = pool.query_steps(StepFilter(), limit=1, order="-created")[0]
    lease = pool.query_steps(StepFilter(consumed=True), limit=1, order="-created")[0]
    return {
        "collection": "/dashboard/api/collection",
        "collection (24h window)": "/dashboard/api/collection?window_s=86400",
        "steps page": "/dashboard/api/steps?limit=50",
        "steps page, task=math": "/dashboard/api/steps?limit=50&task=math",
        "steps page, offset 5000": "/dashboard/api/steps?limit=50&offset=5000",
        "step detail": f"/dashboard/api/steps/{step.step_id}",
        "count (no filter, capped)": "/dashboard/api/count",
        "count (trainer filter, capped)": "/dashboard/api/count?policy=default&reward_status=final"
                                          "&episode_status=finished&consumed=false",
        "curation": "/dashboard/api/curation?policy=default",
        "merging": "/dashboard/api/merging",
        "merging (group)": f"/dashboard/api/merging?group_id={lease.group_id}",
        "consumption": "/dashboard/api/consumption",
    }


def measure(url: str, paths: dict[str, str], warm: int = 5) -> dict[str, tuple[float, float]]:
    out = {}
    with httpx.Client(base_url=url, timeout=600) as h:
        for name, path in paths.items():
            t = time.perf_counter()
            r = h.get(path)
            first = time.perf_counter() - t
            r.raise_for_status()
            times = []
            for _ in range(warm):
                t = time.perf_counter()
                h.get(path).raise_for_status()
                times.append(time.perf_counter() - t)
            out[name] = (first * 1e3, statistics.median(times) * 1e3 if times else float("nan"))
    return out


def naive(pool: Pool) -> dict[str, float]:
    t = time.perf_counter()
    pool.stats()
    stats_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    pool.count_steps(StepFilter())
    return {"Pool.stats() (full scans)": stats_ms, "exact count_steps()": (time.perf_counter() - t) * 1e3}


def run(n_steps: int, db: Path) -> tuple[dict[str, tuple[float, float]], dict[str, float], float]:
    """Fill ``db`` with ``n_steps`` (unless it already holds steps), serve it, time every endpoint."""
    pool = Pool(f"sqlite:///{db}")
    t = time.perf_counter()
    if not pool.query_steps(StepFilter(), limit=1):
        fill(pool, n_steps)
    fill_s = time.perf_counter() - t
    stack = start_stack(pool, EchoBackend(), GatewaySettings())
    try:
        res = measure(stack.url, {"collection (cold: starts the snapshot)": "/dashboard/api/collection"}, warm=0)
        t = time.perf_counter()
        while httpx.get(stack.url + "/dashboard/api/collection", timeout=600).json()["snapshot"]["warming"]:
            time.sleep(0.2)
        ready_ms = (time.perf_counter() - t) * 1e3 + res["collection (cold: starts the snapshot)"][0]
        res.update(measure(stack.url, endpoints(pool)))
        snap = httpx.get(stack.url + "/dashboard/api/collection").json()["snapshot"]
        res["(background snapshot: scan / ready after)"] = (snap["took_s"] * 1e3, ready_ms)
    finally:
        stack.stop()
    base = naive(pool)
    pool.close()
    return res, base, fill_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--dir", type=Path, default=None, help="keep the pools here (re-used when present)")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = args.dir or Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        for n in args.steps:
            res, base, fill_s = run(n, d / f"pool-{n}.db")
            results[n] = (res, base)
            print(f"filled {n:,} steps in {fill_s:.0f} s", flush=True)
    names = list(next(iter(results.values()))[0])
    head = "".join(f" | {n:>9,} first / warm ms" for n in results)
    print(f"\n{'endpoint':<34}{head}")
    for name in names:
        print(f"{name:<34}" + "".join(f" | {results[n][0][name][0]:>10.1f} / {results[n][0][name][1]:>8.1f}"
                                      for n in results))
    for name in next(iter(results.values()))[1]:
        print(f"{name:<34}" + "".join(f" | {results[n][1][name]:>10.1f} {'':>10}" for n in results))


if __name__ == "__main__":
    main()
