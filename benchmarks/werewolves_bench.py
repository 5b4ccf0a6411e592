"""Benchmark (the learning proof): eval win rate of the trained werewolves side before and after training.

Runs the CPU default of ``python -m flows.train +task=werewolves`` (composed from ``conf/``: the
tiny model on the hf backend, LoRA GRPO, the trained village against the heuristic wolves) with
the same pieces the flow uses (pool, backend, gateway on 127.0.0.1, client workers, Trainer) and the
flow's update (:func:`train_policy`: :func:`swarm.update.run_updates`), in three phases:

1. eval: ``--eval-games`` games on held-out seeds (``EVAL_SEED_BASE + i``, never used for
   training; their episodes are ``type=eval`` and never trained) at policy version 0;
2. train: workers play training seeds while the trainer waits, leases, updates, publishes and settles, for the
   run config's ``train.updates`` (100, what ``flows.train`` runs; ``--updates`` to change it;
   ``--minutes`` caps the wall time);
3. eval again on the same seeds with the trained policy.

Beside the games, the vote probe (``experiments/werewolves/probe.py``) reads the policy's probability
of naming a wolf on the fixed vote decisions of 100 heuristic games, before and after training: what
the vote shaping pays, computed rather than sampled, so it shows learning without the games' noise
(and exactly 0 when the policy did not change).

Printed: the baselines on the same seeds without any model (random-legal choices for the trained
decisions, the rest by the rules; every vote for the lowest-numbered living player, the ceiling of
agreeing without reading the prompt; and the all-heuristic side), the per-update training win
rate, then the eval win rates, the 95% CI of the gain (paired by seed: a normal interval over the
per-seed differences), the wall and process CPU minutes, and the eval format-error rate. A PNG
curve (training win rate per update, eval points, baselines) goes to ``--png``; ``--json`` writes
every number.

    .venv/bin/python benchmarks/werewolves_bench.py [--updates 100] [--minutes M] [--eval-games 128] [overrides ...]

Extra arguments are Hydra overrides of the run config (e.g. ``task.options.vote_shaping=0``).
The last line is ``werewolves: eval win rate <A>% -> <B>% (<n> games each, 95% CI of the gain
<lo>..<hi> points), <m> min, format errors <f>%``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EVAL_SEED_BASE = 900_000_000  # training seeds are seed * 1_000_000 + k (k < 1e6): disjoint
PROBE_GAMES, PROBE_SEED_BASE = 100, 10_000  # the vote probe's heuristic games (benchmarks/werewolves_reading.py's test set)


def compose(overrides: list[str], out_dir: str, task: str = "werewolves") -> dict[str, Any]:
    """The resolved run config of ``flows.train +task=<task> <overrides>``, its pool and files in ``out_dir``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = hydra_compose("train", overrides=[f"+task={task}", f"train.out_dir={out_dir}",
                                                f"pool.url=sqlite:///{out_dir}/pool.db", *overrides])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    return resolved


def worker_cfg(url: str, task: dict[str, Any], seed: int, workers: int, task_name: str = "werewolves",
               **kw: Any) -> Any:
    """The client workers' config for the run config's ``task`` section (``task_name``: the task package)."""
    from swarm.client import WorkerConfig

    return WorkerConfig(server=url, task=task_name, workers=workers, group_size=int(task["group_size"]),
                        temperature=float(task["temperature"]), max_tokens=int(task["max_tokens"]),
                        episode_timeout_s=float(task["episode_timeout_s"]), seed=seed,
                        options=dict(task.get("options") or {}), **kw)


def train_policy(run_cfg: Any, trainer: Any, pool: Any, updates: int, stop: threading.Event,
                 on_update: Callable[[dict[str, float], list[Any]], None]) -> int:
    """Up to ``updates`` updates of ``trainer`` as ``flows.train`` runs them: :func:`swarm.update.run_updates`
    (renew, quarantine, publish, checkpoint, settle) with the flow's settings (:func:`flows.run.update_settings`,
    the run's curation) and checkpoint cadence; ``on_update(metrics, trained steps)`` after each, which may set
    ``stop``. Returns how many ran."""
    import dataclasses

    from flows.run import update_settings
    from flows.session import resolve_curation
    from swarm.train import Ledger
    from swarm.update import run_updates

    ref, curated = resolve_curation(run_cfg, pool)
    settings = dataclasses.replace(update_settings(run_cfg), curation=ref, curated=curated)
    ledger = Ledger(trainer, pool, every=run_cfg.train.checkpoint_every, ttl_s=run_cfg.train.lease_ttl_s)
    return run_updates(ledger, settings, updates, stop, on_update)


def game_stats(pool: Any, episode_type: str, since: float, group_ids: set[str] | None = None
               ) -> dict[str, dict[str, float]]:
    """group id -> {win, format_errors, calls, votes, vote_hits, vote_kills} of the trainable seats, for
    finished episodes since ``since`` (``vote_hits``: votes that named a player of the other side,
    ``vote_kills``: those that eliminated that player)."""
    from swarm.pool import StepFilter
    from swarm.records import EpisodeStatus, EpisodeType

    eps = pool.query_episodes(StepFilter(episode_type=EpisodeType(episode_type), episode_status=EpisodeStatus.finished,
                                         since=since), limit=1_000_000)
    out: dict[str, dict[str, float]] = {}
    for ep in eps:
        if group_ids is not None and ep.group_id not in group_ids:
            continue
        m = (ep.metadata or {}).get("metrics") or {}
        g = out.setdefault(ep.episode_id if group_ids is None else ep.group_id,
                           {"win": float(m.get("win", 0.0)), "format_errors": 0.0, "calls": 0.0, "votes": 0.0,
                            "vote_hits": 0.0, "vote_kills": 0.0})
        for k in ("format_errors", "calls", "votes", "vote_hits", "vote_kills"):
            g[k] += float(m.get(k, 0.0))
    return out


def evaluate(url: str, pool: Any, task: dict[str, Any], games: int, workers: int) -> dict[str, Any]:
    """Play ``games`` eval games (one per held-out seed); per-seed wins and the format-error rate."""
    from swarm.client import run_worker

    t0 = time.time() - 1.0
    cfg = worker_cfg(url, {**task, "group_size": 1}, EVAL_SEED_BASE, workers, eval_every=1, max_groups=games)
    stats = run_worker(cfg)
    if stats["failed"]:
        raise RuntimeError(f"{stats['failed']} eval games failed")
    ids = {f"werewolves-{EVAL_SEED_BASE + i}" for i in range(games)}
    per = game_stats(pool, "eval", t0, ids)
    if len(per) != games:
        raise RuntimeError(f"expected {games} eval games, found {len(per)}")
    calls = sum(g["calls"] for g in per.values())
    votes = sum(g["votes"] for g in per.values())
    return {"wins": {gid: per[gid]["win"] for gid in sorted(per)},
            "hits": {gid: per[gid]["vote_hits"] / per[gid]["votes"] if per[gid]["votes"] else 0.0 for gid in sorted(per)},
            "kills": {gid: per[gid]["vote_kills"] / per[gid]["votes"] if per[gid]["votes"] else 0.0 for gid in sorted(per)},
            "games": {gid: tuple(sorted(per[gid].items())) for gid in per},  # what changes when the policy does
            "vote_accuracy": sum(g["vote_hits"] for g in per.values()) / votes if votes else 0.0,
            "vote_kill_rate": sum(g["vote_kills"] for g in per.values()) / votes if votes else 0.0,
            "win_rate": statistics.fmean(g["win"] for g in per.values()),
            "format_error_rate": sum(g["format_errors"] for g in per.values()) / calls if calls else 0.0,
            "calls_per_game": calls / games}


def paired_gain_ci(before: dict[str, float], after: dict[str, float], z: float = 1.96) -> tuple[float, float, float]:
    """(gain, lo, hi) in points: mean per-seed difference and its normal 95% interval."""
    diffs = [after[k] - before[k] for k in before]
    mean = statistics.fmean(diffs)
    half = z * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("inf")
    return 100 * mean, 100 * (mean - half), 100 * (mean + half)


def baselines(task: dict[str, Any], games: int) -> dict[str, float]:
    """Win rates of the trained side on the eval seeds with no model: random-legal trained decisions, every vote
    for the lowest-numbered living player (agreeing without reading), and all heuristic."""
    from experiments.werewolves import Game, HeuristicPlayer, WerewolvesOptions, deal_roles
    from experiments.werewolves.game import Action, side_of

    opts = WerewolvesOptions.from_options(task.get("options"))

    class RandomLegal(HeuristicPlayer):
        def act(self, d: Any) -> Action:
            if d.kind not in opts.llm_decisions or d.kind in ("speak", "last_words"):
                return super().act(d)
            kind = self.rng.choice(d.actions)
            return Action(kind, self.rng.choice(d.targets) if d.targets else None)

    class Agree(HeuristicPlayer):  # the ceiling of agreeing without reading: all vote the lowest number
        def act(self, d: Any) -> Action:
            if d.kind == "vote" and "vote" in opts.llm_decisions:
                return Action("vote", min(d.targets))
            return super().act(d)

    out = {}
    for name, cls in (("random_legal", RandomLegal), ("agree_lowest", Agree), ("heuristic", HeuristicPlayer)):
        wins = 0
        for i in range(games):
            seed = EVAL_SEED_BASE + i
            roles = deal_roles(seed)
            agents = [cls(p, seed) if side_of(r) == opts.trainable_side else HeuristicPlayer(p, seed)
                      for p, r in enumerate(roles)]
            wins += Game(roles, seed, opts.max_rounds, opts.day_discussion).play(agents).winner == opts.trainable_side
        out[name] = wins / games
    return out


def plot(path: Path, curve: list[dict[str, float]], evals: list[tuple[float, float]], base: dict[str, float]) -> None:
    """Training win rate per update (moving mean over 10), eval points and the baselines, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["minute"] for r in curve]
    wins = [r["win"] for r in curve]
    smooth = [statistics.fmean(wins[max(0, i - 9):i + 1]) for i in range(len(wins))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [100 * w for w in smooth], label="training games (moving mean of 10 updates)")
    ax.plot([m for m, _ in evals], [100 * w for _, w in evals], "o-", label="eval win rate (held-out seeds)")
    ax.axhline(100 * base["random_legal"], ls="--", c="gray", label="random-legal votes")
    ax.axhline(100 * base["agree_lowest"], ls="-.", c="tab:green", label="all vote the lowest number (no reading)")
    ax.axhline(100 * base["heuristic"], ls=":", c="black", label="heuristic village")
    ax.set_xlabel("minutes (wall, 2 shared CPU cores)")
    ax.set_ylabel("village win rate vs heuristic wolves (%)")
    ax.set_title("werewolves: tiny model (1.2M) trained village")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(minutes: float | None, updates: int | None, eval_games: int, workers: int, overrides: list[str],
        png: Path | None = None, json_path: Path | None = None, log: Any = print,
        out_dir: Path | None = None) -> dict[str, Any]:
    """The whole benchmark; returns every number (see the module docstring). ``out_dir`` holds the
    pool and checkpoints (default: a new temporary folder, kept for inspection)."""
    from flows.components import make_backend, make_pool, start_gateway, trainer_model_path
    from flows.config import make_train_config, validate
    from swarm.client import run_worker
    from swarm.train import Trainer

    t_start, cpu_start = time.time(), time.process_time()
    out_dir = str(out_dir) if out_dir is not None else tempfile.mkdtemp(prefix="werewolves-bench-")
    cfg = compose(overrides, out_dir)
    task, run_cfg = cfg["task"], validate(cfg)
    updates = int(cfg["train"]["updates"]) if updates is None else updates
    if cfg["model"].get("backend") == "hf":  # the tiny model ships (or is built once), a GGUF is converted once
        t_model = time.time()
        path = Path(trainer_model_path(run_cfg.model))  # for hf: the served checkpoint
        from swarm.policy.shipped import sha256_file

        digest = sha256_file(path / "model.safetensors")[:16]
        log(f"model ready in {time.time() - t_model:.0f}s "
            f"({cfg['model'].get('path') or cfg['model'].get('gguf') or 'tiny, warm-up ' + str(cfg['model'].get('warmup'))}; "
            f"model.safetensors sha256 {digest}, the same on every machine for a shipped or converted checkpoint)")
    base = baselines(task, eval_games)
    log(f"baselines on the {eval_games} eval seeds (no model): random-legal {100 * base['random_legal']:.1f}%, "
        f"all voting the lowest number {100 * base['agree_lowest']:.1f}%, heuristic {100 * base['heuristic']:.1f}%")
    pool = make_pool(run_cfg.pool)
    policy = cfg["policies"][0]
    backend = make_backend(run_cfg.model, [policy], run_cfg.algo.lora)
    pad = int(backend.tokenizer.pad_token_id or 0)
    tc = make_train_config(run_cfg.algo, float(task["temperature"]), pad_id=pad)
    trainer = Trainer.from_pretrained(trainer_model_path(run_cfg.model), tc, policy=policy, backend=backend,
                                      out_dir=Path(out_dir))
    from experiments.werewolves.probe import vote_items, wolf_shares

    probe_items = vote_items(backend.tokenizer, PROBE_GAMES, PROBE_SEED_BASE)
    probe_before = wolf_shares(trainer.model, pad, probe_items)
    stack = start_gateway(pool, backend, run_cfg.gateway)
    curve: list[dict[str, float]] = []
    evals: list[tuple[float, float]] = []
    stop = threading.Event()
    try:
        t0 = time.time()
        before = evaluate(stack.url, pool, task, eval_games, workers)
        evals.append((0.0, before["win_rate"]))
        log(f"eval before: {100 * before['win_rate']:.1f}% ({eval_games} games, {time.time() - t0:.0f}s, "
            f"{before['calls_per_game']:.1f} calls/game, format errors {100 * before['format_error_rate']:.1f}%)")
        wcfg = worker_cfg(stack.url, task, int(cfg["seed"]) * 1_000_000, workers)
        worker = threading.Thread(target=run_worker, args=(wcfg, stop), daemon=True)
        t_train = time.time()
        worker.start()
        deadline = t_train + 60 * minutes if minutes is not None else math.inf
        halt = threading.Event()  # set between updates once the wall-time cap passes

        def on_update(m: dict[str, float], steps: list[Any]) -> None:
            episodes = {s.episode_id for s in steps}
            wins = [float((pool.get_episode(e).metadata or {}).get("metrics", {}).get("win", 0.0)) for e in episodes]
            row = {"update": float(trainer.version), "minute": (time.time() - t_train) / 60,
                   "win": statistics.fmean(wins), "steps": float(len(steps)),
                   **{k: float(m.get(f"train/{k}", 0.0)) for k in ("loss", "entropy", "grad_norm", "clip_frac")}}
            curve.append(row)
            if trainer.version % 10 == 0:
                recent = statistics.fmean(r["win"] for r in curve[-10:])
                log(f"update {trainer.version}: {row['minute']:.1f} min, training win rate (last 10 updates) "
                    f"{100 * recent:.1f}%, {len(steps)} steps, token entropy {row['entropy']:.3f}")
            if time.time() >= deadline:
                halt.set()

        train_policy(run_cfg, trainer, pool, updates, halt, on_update)
        stop.set()
        worker.join(120)
        train_min = (time.time() - t_train) / 60
        t1 = time.time()
        after = evaluate(stack.url, pool, task, eval_games, workers)
        evals.append((train_min, after["win_rate"]))
        log(f"eval after {trainer.version} updates: {100 * after['win_rate']:.1f}% ({time.time() - t1:.0f}s, "
            f"format errors {100 * after['format_error_rate']:.1f}%)")
    finally:  # on an error too: stop the workers and the backend's thread, or the process outlives the bench
        stop.set()
        stack.stop()
        backend.close()
        pool.close()
    probe_after = wolf_shares(trainer.model, pad, probe_items)
    pgain, plo, phi = paired_gain_ci(dict(enumerate(probe_before)), dict(enumerate(probe_after)))
    log(f"vote probe ({len(probe_items)} fixed decisions): probability of naming a wolf "
        f"{statistics.fmean(probe_before):.3f} -> {statistics.fmean(probe_after):.3f} "
        f"(95% CI of the gain {plo:.2f}..{phi:.2f} points)")
    gain, lo, hi = paired_gain_ci(before["wins"], after["wins"])
    vgain, vlo, vhi = paired_gain_ci(before["hits"], after["hits"])
    kgain, klo, khi = paired_gain_ci(before["kills"], after["kills"])
    log(f"votes naming a wolf (trained seats, eval games): {100 * before['vote_accuracy']:.1f}% -> "
        f"{100 * after['vote_accuracy']:.1f}% (95% CI of the per-game gain {vlo:.1f}..{vhi:.1f} points)")
    log(f"votes that eliminated a wolf (the village agreeing on one): {100 * before['vote_kill_rate']:.1f}% -> "
        f"{100 * after['vote_kill_rate']:.1f}% (95% CI of the per-game gain {klo:.1f}..{khi:.1f} points)")
    result = {"before": before["win_rate"], "after": after["win_rate"], "games": eval_games, "gain": gain,
              "ci": [lo, hi], "minutes": (time.time() - t_start) / 60,
              "cpu_minutes": (time.process_time() - cpu_start) / 60, "train_minutes": train_min,
              "updates": trainer.version,
              "format_error_rate": (before["format_error_rate"] + after["format_error_rate"]) / 2,
              "vote_accuracy": [before["vote_accuracy"], after["vote_accuracy"]], "vote_gain": vgain,
              "vote_ci": [vlo, vhi], "vote_kill_rate": [before["vote_kill_rate"], after["vote_kill_rate"]],
              "kill_gain": kgain, "kill_ci": [klo, khi],
              "probe_wolf_share": [statistics.fmean(probe_before), statistics.fmean(probe_after)], "probe_gain": pgain,
              "probe_ci": [plo, phi],
              "games_changed": sum(before["games"][g] != after["games"][g] for g in before["games"]),
              "baselines": base, "curve": curve, "overrides": overrides, "seed": cfg["seed"],
              "load_avg": os.getloadavg()}
    if png is not None:
        plot(png, curve, evals, base)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=None, help="cap on the training wall time (default: none)")
    ap.add_argument("--updates", type=int, default=None,
                    help="stop after this many updates (default: the run config's train.updates, 100, like flows.train)")
    ap.add_argument("--eval-games", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8, help="concurrent games")
    ap.add_argument("--png", type=Path, default=REPO / "docs" / "img" / "werewolves_curve.png")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args, overrides = ap.parse_known_args()
    random.seed(args.seed)
    r = run(args.minutes, args.updates, args.eval_games, args.workers, [f"seed={args.seed}", *overrides],
            args.png, args.json)
    print(f"cpu {r['cpu_minutes']:.1f} min (process), load average {r['load_avg'][0]:.1f} at the end "
          f"(a 2-core machine shared with other work)")
    print(f"werewolves: eval win rate {100 * r['before']:.1f}% -> {100 * r['after']:.1f}% ({r['games']} games each, "
          f"95% CI of the gain {r['ci'][0]:.1f}..{r['ci'][1]:.1f} points), {r['minutes']:.1f} min, "
          f"format errors {100 * r['format_error_rate']:.1f}%")


if __name__ == "__main__":
    main()
