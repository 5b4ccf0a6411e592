"""What one update of the default flow costs, phase by phase: ``python -m flows.train`` (tiny model, echo
task, real gateway, pool, client workers, Prefect and MLflow) for N updates, then the mean of every
``time/*`` metric it logged (:func:`swarm.update.run_update`, ``flows/run.py``) as a table.

The first ``--skip`` updates are left out (warm-up). Per update:

- ``loop wall``: seconds between consecutive MLflow rows (the flow's whole update, logging included);
- ``wait``: waiting for the batching strategy to fire (clients still collecting);
- ``train (trainer)``: the trainer's own optimizer step (``time/update_s``: merge, forward, backward, optimizer);
- **fixed cost outside training** = loop wall - wait - train (trainer): everything else the loop does;
- ``collect/steps_during_update``: steps the clients recorded while the trainer was busy after its lease
  (train, publish, checkpoint): the overlap of generation and training (0 would mean collection stops).

``--repo DIR`` (repeatable) measures another checkout of the project too (a ``git worktree`` of an older
commit), interleaved with this one (A B A B ... for ``--rounds``), so both see the same machine load.

Run: ``.venv/bin/python benchmarks/update_bench.py [--updates 25] [--rounds 1] [--repo DIR] [overrides...]``.
The last line is ``update: fixed cost <s> s/update outside training (loop <s>, wait <s>, train <s>)`` for
this checkout. Numbers depend on the machine and what else runs on it (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the phases in the order an update runs them: (metric, label); anything else logged under time/ follows
PHASES = [
    ("time/fill_s", "fill rewards from ratings"),
    ("time/plan_s", "lease plan write"),
    ("time/wait_s", "wait for the batch"),
    ("time/renew_s", "renew pending leases"),
    ("time/lease_s", "lease"),
    ("time/quarantine_s", "quarantine"),
    ("time/feedback_read_s", "feedback reads (ratings, corrections)"),
    ("time/items_s", "items (advantages)"),
    ("time/train_s", "train stage"),
    ("time/update_s", "  trainer step (in train stage)"),
    ("time/merge_s", "    merge"),
    ("time/forward_s", "    forward"),
    ("time/backward_s", "    backward"),
    ("time/optimizer_s", "    optimizer"),
    ("time/publish_stage_s", "publish stage"),
    ("time/publish_s", "  weights to backend (in publish)"),
    ("time/journal_s", "journal line"),
    ("time/checkpoint_s", "checkpoint + settle"),
    ("time/served_version_s", "served-version read"),
    ("time/feedback_write_s", "feedback_uses write"),
    ("time/collect_count_s", "overlap count (measurement)"),
    ("time/overhead_s", "= run_update outside wait + trainer step"),
    ("time/update_wall_s", "run_update wall"),
    ("time/samples_s", "sample trajectories (MLflow artifact)"),
    ("time/episode_metrics_s", "episode metrics read"),
    ("time/eval_writes_s", "eval writes"),
    ("time/mlflow_s", "MLflow log_metrics (previous row)"),
]


def run_flow(repo: Path, updates: int, tmp: Path, overrides: list[str]) -> dict[str, list[float]]:
    """``flows.train`` from ``repo`` for ``updates`` updates; every logged metric per step, plus ``loop/wall_s``."""
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    py = repo / ".venv" / "bin" / "python"
    cmd = [str(py if py.exists() else sys.executable), "-m", "flows.train", f"train.updates={updates}",
           f"train.out_dir={tmp / 'out'}", f"hydra.run.dir={tmp / 'hydra'}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(repo), "TOKENIZERS_PARALLELISM": "false", "MLFLOW_TRACKING_URI": uri,
           "PREFECT_HOME": str(tmp / "prefect")}
    with open(tmp / "flow.log", "w") as log:
        rc = subprocess.call(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise SystemExit(f"flows.train failed (rc {rc}):\n" + (tmp / "flow.log").read_text()[-3000:])
    db = sqlite3.connect(tmp / "mlruns.db")
    rows = db.execute("SELECT key, step, value, timestamp FROM metrics WHERE key LIKE 'time/%' OR key LIKE 'collect/%'"
                      " OR key = 'reward/mean'").fetchall()
    db.close()
    by: dict[str, dict[int, float]] = defaultdict(dict)
    stamps: dict[int, float] = {}
    for key, step, value, ts in rows:
        by[key][step] = value
        if key == "reward/mean":
            stamps[step] = ts / 1000
    steps = sorted(stamps)
    out = {k: [v[s] for s in steps if s in v] for k, v in by.items()}
    out["loop/wall_s"] = [stamps[b] - stamps[a] for a, b in zip(steps, steps[1:], strict=False)]
    out["loop/steps"] = [float(s) for s in steps]
    return out


def summarize(m: dict[str, list[float]], skip: int) -> dict[str, float]:
    """Means over the updates after the first ``skip`` (``loop/wall_s`` is aligned with the later update)."""
    out = {}
    for k, vs in m.items():
        vs = vs[max(skip - 1, 0):] if k == "loop/wall_s" else vs[skip:]
        if vs:
            out[k] = statistics.fmean(vs)
    loop = out.get("loop/wall_s", 0.0)
    out["fixed"] = loop - out.get("time/wait_s", 0.0) - out.get("time/update_s", 0.0)
    return out


def table(names: list[str], res: list[dict[str, float]]) -> str:
    keys = [k for k, _ in PHASES] + sorted({k for r in res for k in r if k.startswith("time/")} - {k for k, _ in PHASES})
    labels = dict(PHASES)
    w = max(len(n) for n in names) + 2
    lines = [f"{'phase (mean s/update)':44s}" + "".join(f"{n:>{max(w, 10)}s}" for n in names)]

    def row(label: str, vals: list[float | None]) -> str:
        return f"{label:44s}" + "".join(f"{v:>{max(w, 10)}.4f}" if v is not None else f"{'-':>{max(w, 10)}s}"
                                        for v in vals)
    for k in keys:
        if any(k in r for r in res):
            lines.append(row(labels.get(k, k[5:]), [r.get(k) for r in res]))
    lines.append(row("loop wall (between MLflow rows)", [r.get("loop/wall_s") for r in res]))
    lines.append(row("FIXED COST = loop wall - wait - trainer step", [r.get("fixed") for r in res]))
    lines.append(row("steps recorded while the trainer was busy", [r.get("collect/steps_during_update") for r in res]))
    lines.append(row("reward/mean", [r.get("reward/mean") for r in res]))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=25)
    ap.add_argument("--skip", type=int, default=3, help="first updates left out of the means (warm-up)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per checkout, interleaved")
    ap.add_argument("--repo", action="append", default=[], type=Path, help="another checkout to measure beside this one")
    ap.add_argument("overrides", nargs="*", help="extra flows.train overrides, e.g. train.checkpoint_every=5")
    args = ap.parse_args()
    repos = [*[r.resolve() for r in args.repo], REPO]
    names = [("this" if r == REPO else r.name) for r in repos]
    runs: dict[Path, list[dict[str, float]]] = defaultdict(list)
    t0 = time.time()
    for _ in range(args.rounds):
        for repo in repos:
            with tempfile.TemporaryDirectory() as d:
                runs[repo].append(summarize(run_flow(repo, args.updates, Path(d), args.overrides), args.skip))
    res = [{k: statistics.fmean(r[k] for r in runs[repo] if k in r) for k in set().union(*runs[repo])}
           for repo in repos]
    print(f"machine: {os.cpu_count()} CPUs, load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{args.rounds} x {args.updates} updates per checkout (first {args.skip} skipped), {time.time() - t0:.0f} s; "
          f"overrides: {' '.join(args.overrides) or '-'}")
    print(table(names, res))
    r = res[-1]
    print(f"update: fixed cost {r['fixed']:.3f} s/update outside training (loop {r.get('loop/wall_s', 0):.3f}, "
          f"wait {r.get('time/wait_s', 0):.3f}, train {r.get('time/update_s', 0):.3f})")


if __name__ == "__main__":
    main()
