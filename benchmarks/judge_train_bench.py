"""What training on a judge reward does to the task's exact score (docs/judge.md, issue: judge rewards).

Runs ``python -m flows.train +task=<task>`` twice with the same budget and seed: once on the task's
own exact reward, once with ``+reward=judge`` (the judge's group scores are the reward; the task's
own reward is still reported by the agent and kept in the reward history, not applied). Both runs
are the real stack (Prefect flow, gateway on loopback, SQLite pool, client workers) in subprocesses.

Afterwards the exact reward of every trained episode is read back from each run's pool (the
agent's report in the reward history), keyed by the policy version that played it, and the bench
prints the mean exact reward of the first and the last ``--window`` versions for both runs, and
for the judged run how its judge reward agreed with the exact one (Spearman per group, averaged).

A judge that cannot tell a better reply from a worse one (the tiny judge; SmolLM2-135M on math:
``benchmarks/judge_bench.py``) gives GRPO noise, and the exact score should stay where it started
while the exact-reward run climbs; a judge that can read the task would make it follow.

    python benchmarks/judge_train_bench.py [--task echo] [--updates 60] [--judge-model tiny] [overrides ...]

Extra arguments are Hydra overrides for both runs. The last line is ``judge training: exact reward
<a> -> <b> on the exact reward, <c> -> <d> on the judge reward (<judge>), <n> updates``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from judge_bench import spearman  # noqa: E402  (one Spearman for both judge benchmarks)


def train(out: Path, task: str, updates: int, judge: str | None, overrides: list[str]) -> float:
    """One ``flows.train`` run into ``out`` (its pool, MLflow and checkpoints); its wall seconds."""
    cmd = [sys.executable, "-m", "flows.train", f"+task={task}", f"train.updates={updates}", f"train.out_dir={out}",
           f"mlflow.tracking_uri=sqlite:///{out}/mlruns.db", *overrides]
    if judge is not None:
        cmd += ["+reward=judge", f"model@frozen_policies.judge={judge}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.time()
    with open(out.parent / f"{out.name}.log", "w") as log:
        done = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}); see {out.parent / (out.name + '.log')}")
    return time.time() - t0


def exact_by_version(pool_url: str, task: str) -> tuple[dict[int, list[float]], list[float]]:
    """Version -> exact rewards of the trained episodes played at it, and the judged groups' Spearman
    (judge reward against exact reward; empty when no judge rewarded them)."""
    from swarm.pool import Pool, StepFilter
    from swarm.records import EpisodeStatus, EpisodeType

    pool = Pool(pool_url)
    try:
        flt = StepFilter(task=task, episode_type=EpisodeType.train, episode_status=EpisodeStatus.finished)
        version: dict[str, int] = {}
        for s in pool.query_steps(flt, limit=1_000_000):
            version[s.episode_id] = min(version.get(s.episode_id, s.policy_version), s.policy_version)
        by_version: dict[int, list[float]] = {}
        groups: dict[str, list[tuple[float, float]]] = {}
        for ep in pool.query_episodes(flt, limit=1_000_000):
            if ep.episode_id not in version:
                continue
            hist = pool.reward_history(ep.episode_id)  # kept where a higher source may override (the judge's task)
            agent = [h["value"] for h in hist if h["source"] == "agent" and h.get("step_id") is None]
            judged = [h["value"] for h in hist if h["source"] == "judge" and h.get("applied")]
            exact = agent[-1] if agent else ep.reward if not judged else None  # no history: the agent's reward applied
            if exact is None:
                continue
            by_version.setdefault(version[ep.episode_id], []).append(float(exact))
            if judged and ep.group_id:
                groups.setdefault(ep.group_id, []).append((float(judged[-1]), float(exact)))
        rhos = [spearman([j for j, _ in g], [e for _, e in g]) for g in groups.values() if len(g) > 1]
        return by_version, rhos
    finally:
        pool.close()


def window_mean(by_version: dict[int, list[float]], first: bool, window: int) -> float:
    """Mean exact reward over the episodes of the first (or last) ``window`` versions."""
    versions = sorted(by_version)
    chosen = versions[:window] if first else versions[-window:]
    return statistics.fmean(r for v in chosen for r in by_version[v])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="echo")
    ap.add_argument("--updates", type=int, default=60)
    ap.add_argument("--judge-model", default="tiny", help="the judge's conf/model/<name>.yaml (tiny, smollm2, ...)")
    ap.add_argument("--window", type=int, default=10, help="versions averaged at the start and at the end")
    ap.add_argument("--json", type=Path, default=None)
    args, overrides = ap.parse_known_args()
    root = Path(tempfile.mkdtemp(prefix="judge-train-bench-"))
    out: dict[str, Any] = {"task": args.task, "updates": args.updates, "judge": args.judge_model,
                           "overrides": overrides, "load_avg": None}
    for name, judge in (("exact", None), ("judge", args.judge_model)):
        wall = train(root / name, args.task, args.updates, judge, overrides)
        by_version, rhos = exact_by_version(f"sqlite:///{root / name}/pool.db", args.task)
        first, last = window_mean(by_version, True, args.window), window_mean(by_version, False, args.window)
        out[name] = {"first": first, "last": last, "wall_s": wall, "versions": len(by_version),
                     "episodes": sum(len(v) for v in by_version.values()),
                     "spearman": statistics.fmean(rhos) if rhos else None, "groups_judged": len(rhos)}
        rho = f", judge vs exact Spearman {out[name]['spearman']:.3f} over {len(rhos)} groups" if rhos else ""
        print(f"{name} reward: exact reward {first:.3f} (first {args.window} versions) -> {last:.3f} "
              f"(last {args.window}), {out[name]['episodes']} episodes, {wall / 60:.1f} min{rho}", flush=True)
    out["load_avg"] = os.getloadavg()
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    print(f"cpu cores {os.cpu_count()}, load average {out['load_avg'][0]:.1f} at the end; runs kept in {root}")
    print(f"judge training: exact reward {out['exact']['first']:.3f} -> {out['exact']['last']:.3f} on the exact reward, "
          f"{out['judge']['first']:.3f} -> {out['judge']['last']:.3f} on the judge reward ({args.judge_model}), "
          f"{args.updates} updates")


if __name__ == "__main__":
    main()
