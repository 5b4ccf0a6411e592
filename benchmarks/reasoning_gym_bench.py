"""Benchmark (the learning check): held-out score of a reasoning-gym generator before and after GRPO.

Runs the CPU default of ``python -m flows.train +task=reasoning_gym`` (composed from ``conf/``: the tiny
model on the hf backend, LoRA GRPO, ``spell_backward`` on 3-5 letter words) with the pieces the flow
uses (pool, backend, gateway on 127.0.0.1, client workers, Trainer) and the flow's update
(``werewolves_bench.train_policy``: :func:`swarm.update.run_updates`), in three phases:

1. eval: ``--eval-entries`` entries of the held-out split (episodes of kind ``eval``, which the task
   draws from seeds ``[2**31, 2**32)``, never reached by training), one reply each, at version 0;
2. train: workers play training entries while the trainer waits, leases, updates, publishes and settles, ``--updates``
   times (``--minutes`` caps the wall time);
3. eval again on the same held-out entries with the trained policy.

Printed: the training reward per 10 updates, the eval mean score and exact rate before and after, four
held-out replies before and after, the
95% CI of the score gain (paired by entry; one sampled reply per entry at the task's temperature, with a
sampling seed per entry, so the same weights give the same reply: before and after share their
randomness, and a policy that did not change gains exactly 0), and the wall minutes. Extra arguments are Hydra overrides
(``task.options.dataset=...``). The last line is ``reasoning_gym <generator>: held-out score <A> -> <B>
(<n> entries, 95% CI of the gain <lo>..<hi>), exact <a>% -> <b>%, <m> min``.

    .venv/bin/python benchmarks/reasoning_gym_bench.py [--updates 60] [--eval-entries 256] [overrides ...]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from werewolves_bench import compose, train_policy, worker_cfg  # noqa: E402  (one run-config, worker and update recipe)

TASK = "reasoning_gym"
EVAL_SEED = 900_000_000  # eval worker seeds (group ids apart from training's seed * 1_000_000 + k); kind eval: held-out entries


def evaluate(url: str, pool: Any, task: dict[str, Any], entries: int, workers: int) -> dict[str, dict[str, float]]:
    """One reply to each of ``entries`` held-out entries: entry seed -> {score, exact}."""
    from swarm.client import run_worker
    from swarm.pool import StepFilter
    from swarm.records import EpisodeType

    t0 = time.time() - 1.0
    stats = run_worker(worker_cfg(url, {**task, "group_size": 1}, EVAL_SEED, workers, TASK, eval_every=1,
                                max_groups=entries, seeded=True))
    if stats["failed"]:
        raise RuntimeError(f"{stats['failed']} eval episodes failed")
    flt = StepFilter(episode_type=EpisodeType.eval, since=t0)
    eps = pool.query_episodes(flt, limit=1_000_000)
    replies = {s.episode_id: s.response_text or "" for s in pool.query_steps(flt, limit=1_000_000)}
    out = {str(ep.metadata["entry_seed"]): {"score": float(ep.reward or 0.0),
                                           "exact": float(ep.metadata["metrics"]["exact"]),
                                           "reply": replies.get(ep.episode_id, "")} for ep in eps}
    if len(out) != entries or any(ep.metadata["split"] != "eval" for ep in eps):
        raise RuntimeError(f"expected {entries} held-out episodes, found {len(out)}")
    return out


def paired_gain_ci(before: dict[str, float], after: dict[str, float], z: float = 1.96) -> tuple[float, float, float]:
    """(gain, lo, hi): mean per-entry difference and its normal 95% interval."""
    diffs = [after[k] - before[k] for k in before]
    mean = statistics.fmean(diffs)
    half = z * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("inf")
    return mean, mean - half, mean + half


def run(updates: int, minutes: float | None, entries: int, workers: int, overrides: list[str],
        log: Any = print) -> dict[str, Any]:
    """The whole benchmark; returns every number (see the module docstring)."""
    from flows.components import make_backend, make_pool, start_gateway, trainer_model_path
    from flows.config import make_train_config, validate
    from swarm.client import run_worker
    from swarm.train import Trainer

    t_start = time.time()
    out_dir = tempfile.mkdtemp(prefix="reasoning-gym-bench-")
    cfg = compose(overrides, out_dir, TASK)
    task, run_cfg = cfg["task"], validate(cfg)
    pool = make_pool(run_cfg.pool)
    policy = cfg["policies"][0]
    backend = make_backend(run_cfg.model, [policy], run_cfg.algo.lora)
    tc = make_train_config(run_cfg.algo, float(task["temperature"]), pad_id=int(backend.tokenizer.pad_token_id or 0))
    trainer = Trainer.from_pretrained(trainer_model_path(run_cfg.model), tc, policy=policy, backend=backend,
                                      out_dir=Path(out_dir))
    stack = start_gateway(pool, backend, run_cfg.gateway)
    curve: list[float] = []
    stop = threading.Event()
    try:
        before = evaluate(stack.url, pool, task, entries, workers)
        log(f"eval before: score {statistics.fmean(v['score'] for v in before.values()):.3f} ({entries} held-out "
            f"entries, {time.time() - t_start:.0f}s)")
        worker = threading.Thread(target=run_worker, daemon=True,
                                  args=(worker_cfg(stack.url, task, int(cfg["seed"]) * 1_000_000, workers, TASK), stop))
        t_train = time.time()
        worker.start()
        deadline = t_train + 60 * minutes if minutes is not None else math.inf
        halt = threading.Event()  # set between updates once the wall-time cap passes

        def on_update(_: dict[str, float], steps: list[Any]) -> None:
            curve.append(statistics.fmean(float(s.reward or 0.0) for s in steps))
            if trainer.version % 10 == 0:
                log(f"update {trainer.version}: {(time.time() - t_train) / 60:.1f} min, training reward (last 10) "
                    f"{statistics.fmean(curve[-10:]):.3f}")
            if time.time() >= deadline:
                halt.set()

        train_policy(run_cfg, trainer, pool, updates, halt, on_update)
        stop.set()
        worker.join(120)
        after = evaluate(stack.url, pool, task, entries, workers)
    finally:  # on an error too: stop the workers and the backend's thread, or the process outlives the bench
        stop.set()
        stack.stop()
        backend.close()
        pool.close()
    score = {k: v["score"] for k, v in before.items()}, {k: after[k]["score"] for k in before}
    gain, lo, hi = paired_gain_ci(*score)
    return {"dataset": task["options"]["dataset"], "entries": entries, "updates": trainer.version,
            "before": statistics.fmean(score[0].values()), "after": statistics.fmean(score[1].values()),
            "gain": gain, "ci": [lo, hi],
            "exact": [statistics.fmean(v["exact"] for v in before.values()),
                      statistics.fmean(after[k]["exact"] for k in before)],
            "examples": [(before[k]["reply"], after[k]["reply"]) for k in sorted(before)[:4]],
            "train_first10": statistics.fmean(curve[:10]) if curve else 0.0,
            "train_last10": statistics.fmean(curve[-10:]) if curve else 0.0,
            "minutes": (time.time() - t_start) / 60}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=60)
    ap.add_argument("--minutes", type=float, default=None, help="cap on the training wall time (default: none)")
    ap.add_argument("--eval-entries", type=int, default=256)
    ap.add_argument("--workers", type=int, default=8, help="concurrent episodes")
    args, overrides = ap.parse_known_args()
    r = run(args.updates, args.minutes, args.eval_entries, args.workers, overrides)
    for b, a in r["examples"]:
        print(f"held-out reply before {b!r} -> after {a!r}")
    print(f"training reward: first 10 updates {r['train_first10']:.3f}, last 10 {r['train_last10']:.3f} "
          f"({r['updates']} updates)")
    print(f"reasoning_gym {r['dataset']}: held-out score {r['before']:.3f} -> {r['after']:.3f} ({r['entries']} entries, "
          f"95% CI of the gain {r['ci'][0]:+.3f}..{r['ci'][1]:+.3f}), exact {100 * r['exact'][0]:.1f}% -> "
          f"{100 * r['exact'][1]:.1f}%, {r['minutes']:.1f} min")


if __name__ == "__main__":
    main()
