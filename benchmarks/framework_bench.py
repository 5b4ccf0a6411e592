"""Benchmark (framework-agnostic training): the echo task trained through four agent loops, curves side by side.

The same run, ``python -m flows.train +task=echo seed=0 task.seeded=true task.options.loop=<loop> train.updates=N`` (the
tiny warm model, the default CPU recipe), once per agent loop of ``experiments/echo/loops.py``: the OpenAI SDK
(``openai``), LangChain's ``ChatOpenAI`` (``langchain``), a LangGraph graph (``langgraph``) and raw ``httpx``,
one after another, each in a subprocess with its own out dir, pool and MLflow store. With ``task.seeded`` every
call carries a sampling seed of (instance seed, group member, call), so the loops draw the same tokens while the
weights are the same; ``--control`` adds a second ``openai`` run, the run-to-run floor of the same code.

Printed: the command and machine, each run's per-update ``reward/mean`` (from its MLflow run), how identical the
runs are (groups sampled at policy version 0 in two runs whose token ids agree exactly), and the gaps between
curves. The gap is the largest, over pairs of loops, of the mean over updates of ``|m_a(u) - m_b(u)|``, where
``m(u)`` is the trailing 5-update moving average of ``reward/mean``: the curves as plotted. One update's mean is
over only ``groups x group_size`` (32) episodes, so raw per-update differences mostly measure that sampling
noise (two runs of the same code differ by ~0.1 per update); the raw mean and maximum per-update differences
are printed beside it, and with ``--control`` the same gap between two runs of the same code. The last line is
``framework gap: <g> (max over loop pairs of the mean |difference| of 5-update moving averages ...)``.

    .venv/bin/python benchmarks/framework_bench.py [--updates 30] [--loops openai,langchain,langgraph,httpx]
                                                   [--control] [overrides ...]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOOPS = ("openai", "langchain", "langgraph", "httpx")


def train(loop: str, updates: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """One ``flows.train`` run through ``loop``: its per-update ``reward/mean``, wall seconds and pool path."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "flows.train", f"train.updates={updates}", f"train.out_dir={out / 'run'}",
           f"hydra.run.dir={out / 'hydra'}", "+task=echo", "seed=0", "task.seeded=true", f"task.options.loop={loop}",
           f"run_name=framework {loop}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false",
           "MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlruns.db'}", "PREFECT_HOME": str(out / "prefect")}
    t0 = time.time()
    with open(out / "train.log", "w") as log:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    if rc != 0:
        raise SystemExit(f"{loop}: flows.train failed (rc {rc}); {out / 'train.log'}:\n"
                         + (out / "train.log").read_text()[-3000:])
    db = sqlite3.connect(out / "mlruns.db")
    rows = db.execute("SELECT step, value FROM metrics WHERE key = 'reward/mean' ORDER BY step, timestamp").fetchall()
    db.close()
    rewards = dict(rows)  # step = policy version after the update; one value per update
    return {"loop": loop, "rewards": [rewards[k] for k in sorted(rewards)], "wall": wall, "cmd": cmd,
            "pool": out / "run" / "pool.db"}


def version0_tokens(pool_db: Path) -> dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """group id -> its sorted (prompt ids, response ids), for the groups whose every step the untrained policy
    (version 0) sampled: the steps that only the agent loop can make differ."""
    from swarm.pool import Pool, StepFilter

    pool = Pool(f"sqlite:///{pool_db}")
    try:
        out: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        later: set[str] = set()
        offset = 0
        while page := pool.query_steps(StepFilter(), limit=1000, offset=offset, with_tokens=True):
            for s in page:
                if s.group_id and s.policy_version == 0:
                    out.setdefault(s.group_id, []).append((tuple(s.prompt_ids), tuple(s.response_ids)))
                elif s.group_id:
                    later.add(s.group_id)
            offset += len(page)
        return {g: sorted(v) for g, v in out.items() if g not in later}
    finally:
        pool.close()


def moving_average(xs: list[float], k: int = 5) -> list[float]:
    """Trailing mean over the last ``k`` values (fewer at the start)."""
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1]) for i in range(len(xs))]


def gaps(curves: dict[str, list[float]]) -> dict[str, Any]:
    """Per pair: the mean |difference| of 5-update moving averages (``ma5``, the gap), of raw per-update values
    (``mean``) and the raw per-update max; ``gap`` is the largest ``ma5`` over pairs."""
    pairs = {}
    for a, b in itertools.combinations(curves, 2):
        n = min(len(curves[a]), len(curves[b]))
        if n == 0:
            continue
        ca, cb = curves[a][:n], curves[b][:n]
        diff = [abs(x - y) for x, y in zip(ca, cb, strict=True)]
        ma = [abs(x - y) for x, y in zip(moving_average(ca), moving_average(cb), strict=True)]
        pairs[(a, b)] = {"mean": sum(diff) / n, "ma5": sum(ma) / n, "max": max(diff), "n": n}
    worst = max(pairs.items(), key=lambda kv: kv[1]["ma5"])
    return {"pairs": pairs, "gap": worst[1]["ma5"], "worst": worst[0],
            "raw_mean": max(p["mean"] for p in pairs.values()), "raw_max": max(p["max"] for p in pairs.values())}


def identical(tokens: dict[str, dict[str, list[Any]]], base: str) -> dict[str, tuple[int, int, int]]:
    """Per run, over the version-0 groups it shares with ``base``: (groups whose prompt ids agree, groups whose
    prompt and response ids agree, shared groups)."""
    out = {}
    for name, groups in tokens.items():
        common = set(groups) & set(tokens[base])
        prompts = sum([p for p, _ in groups[g]] == [p for p, _ in tokens[base][g]] for g in common)
        out[name] = (prompts, sum(groups[g] == tokens[base][g] for g in common), len(common))
    return out


def run(loops: list[str], updates: int, out_dir: Path, overrides: list[str], control: bool = False,
        jobs: int = 1) -> dict[str, Any]:
    """Train through each loop (and the control), ``jobs`` runs at a time (1: one after another, as measured),
    then the curves, the identity of version-0 groups and the gaps."""
    names = [*loops, *(["openai#2"] if control else [])]
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        futures = {name: ex.submit(train, name.split("#")[0], updates, out_dir / name.replace("#", "_"), overrides)
                   for name in names}
        runs = {name: f.result() for name, f in futures.items()}
    curves = {name: r["rewards"] for name, r in runs.items()}
    tokens = {name: version0_tokens(r["pool"]) for name, r in runs.items()}
    return {"runs": runs, "curves": curves, "identical": identical(tokens, names[0]),
            **gaps({n: c for n, c in curves.items() if n in loops}),
            "control": gaps({n: curves[n] for n in ("openai", "openai#2")}) if control and "openai" in loops else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--loops", default=",".join(LOOPS), help="comma-separated, of " + ", ".join(LOOPS))
    ap.add_argument("--control", action="store_true", help="a second openai run: the run-to-run floor")
    ap.add_argument("overrides", nargs="*", help="extra flows.train overrides, the same for every loop")
    args = ap.parse_args()
    loops = [x for x in args.loops.split(",") if x]
    if bad := set(loops) - set(LOOPS):
        ap.error(f"unknown loops {sorted(bad)}; known: {', '.join(LOOPS)}")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        r = run(loops, args.updates, Path(d), args.overrides, args.control)
    print("command: python benchmarks/framework_bench.py " + " ".join(sys.argv[1:]))
    print("each run: python -m flows.train " + " ".join(r["runs"][loops[0]]["cmd"][3:]).replace(
        f"task.options.loop={loops[0]}", "task.options.loop=<loop>"))
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (1 min); "
          f"wall {(time.time() - t0) / 60:.1f} min")
    for name, run_ in r["runs"].items():
        c = run_["rewards"]
        prompts, same, common = r["identical"][name]
        print(f"  {name:9s} {run_['wall']:5.0f} s, {len(c)} updates, reward first-5 {sum(c[:5]) / max(len(c[:5]), 1):.3f}"
              f" last-5 {sum(c[-5:]) / max(len(c[-5:]), 1):.3f} final {c[-1] if c else float('nan'):.3f}; "
              f"version-0 groups as {loops[0]}'s: prompt ids {prompts}/{common}, all tokens {same}/{common}")
        print(f"  {name:9s} reward/mean per update: " + " ".join(f"{x:.3f}" for x in c))
    for (a, b), p in r["pairs"].items():
        print(f"  {a} vs {b}: moving-average-5 mean |diff| {p['ma5']:.4f}; raw per-update mean |diff| {p['mean']:.4f}, "
              f"max {p['max']:.4f}")
    control = ""
    if r["control"]:
        cp = next(iter(r["control"]["pairs"].values()))
        print(f"  control (openai vs openai#2, same code twice): moving-average-5 mean |diff| {cp['ma5']:.4f}; "
              f"raw per-update mean |diff| {cp['mean']:.4f}, max {cp['max']:.4f}")
        control = f"; same code twice {cp['ma5']:.4f}"
    a, b = r["worst"]
    print(f"framework gap: {r['gap']:.4f} (max over loop pairs of the mean |difference| of 5-update moving averages of "
          f"reward/mean over {args.updates} updates, {a} vs {b}{control}; raw per-update: mean |diff| "
          f"{r['raw_mean']:.4f}, max {r['raw_max']:.4f}; bar 0.025: {'under' if r['gap'] < 0.025 else 'OVER'})")


if __name__ == "__main__":
    main()
