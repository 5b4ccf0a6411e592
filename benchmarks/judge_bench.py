"""How well does a judge rank a group by an exact reward? Spearman per group on the math task.

For ``--groups`` math problems (experiments/math, deterministic in the seed) a group of
``--group-size`` answers is written to a pool as finished episodes: some correct, some wrong
(a near miss, a far miss, no number), in shuffled order, with at least one of each so the
exact reward (experiments.math.reward.math_reward) varies in every group. The judge
(:class:`swarm.judge.GroupJudge`, through a real gateway on loopback, constrained decoding on the
hf backend, temperature 0) scores each group; per group the Spearman rank correlation of its
scores with the exact rewards (0 when the judge gives one score to all), averaged over groups.
Also: how often its top score is a correct answer (chance: correct / group size), the mean score
per position (a position-biased judge favours one slot), failed groups and seconds per group.

The answers are written, not sampled: the tiny model hardly ever solves a problem, so its own
groups would have no exact-reward variance to rank. A tiny judge (3.4 M parameters, trained only
on a word chain) cannot read arithmetic: expect a correlation near 0, and report it as such.

Run: ``.venv/bin/python benchmarks/judge_bench.py [--judge-model tiny|smollm2] [--groups 24]
[--view final|transcript]``; ``--judge-model`` is a conf/model/<name>.yaml. Prints one line per
setting and a last ``judge:`` line; ``--json PATH`` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho with average ranks for ties; 0 when either side is constant."""
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return 0.0 if va == 0 or vb == 0 else cov / (va * vb) ** 0.5


def answers(answer: int, n: int, rng: random.Random) -> list[str]:
    """``n`` replies to one problem, at least one right and one wrong, shuffled."""
    right = [f"Answer: {answer}", f"{answer} in all. Answer: {answer}"]
    wrong = [f"Answer: {answer + rng.choice([1, 2, -1])}", f"Answer: {answer * 3 + 7}", "I am not sure.",
             f"It is {answer + 10}. Answer: {answer + 10}"]
    k = rng.randint(1, n - 1)
    out = [rng.choice(right) for _ in range(k)] + [rng.choice(wrong) for _ in range(n - k)]
    rng.shuffle(out)
    return out


def write_groups(pool: Any, groups: int, size: int, seed: int) -> dict[str, dict[str, float]]:
    """The groups as finished math episodes (group id ``math-<seed>``); returns episode -> exact reward per group."""
    from experiments.math import make_instance, math_reward
    from experiments.math.agent import SYSTEM_PROMPT
    from swarm.records import Episode, EpisodeStatus, Step

    rng = random.Random(seed)
    exact: dict[str, dict[str, float]] = {}
    for s in range(seed, seed + groups):
        inst = make_instance(s)
        gid = f"math-{s}"
        exact[gid] = {}
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": inst["question"]}]
        for text in answers(int(inst["answer"]), size, rng):
            ep = pool.add_episode(Episode(task="math", group_id=gid))
            pool.add_step(Step(episode_id=ep.episode_id, task="math", group_id=gid, prompt_messages=prompt,
                               response_text=text, source="whitebox"))
            pool.end_episode(ep.episode_id, EpisodeStatus.finished)
            exact[gid][ep.episode_id] = math_reward(text, inst["answer"])["reward"]
    return exact


def judge_backend(model_name: str) -> Any:
    """The conf/model/<name>.yaml backend serving the policy ``judge`` (no adapter, never trained)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from flows.components import make_backend
    from flows.config import model_section

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=[f"model={model_name}"])
    return make_backend(model_section(OmegaConf.to_container(cfg.model, resolve=True)), ["judge"], None)


def run(model_name: str, groups: int, size: int, view: str, seed: int) -> dict[str, Any]:
    from swarm.app import GatewaySettings, create_app
    from swarm.judge import GroupJudge, JudgeSpec
    from swarm.pool import Pool
    from swarm.stack import ServerThread

    t0 = time.perf_counter()
    backend = judge_backend(model_name)
    t_load = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        pool = Pool(f"sqlite:///{tmp}/pool.db")
        server = ServerThread(create_app(pool, backend, GatewaySettings(reward_authority={"math": "judge"}))).start()
        try:
            exact = write_groups(pool, groups, size, seed)
            judge = GroupJudge(pool, server.url, JudgeSpec(policy="judge", view=view, max_chars=600), "math", size)
            t1 = time.perf_counter()
            outcomes = {o.group_id: o for o in judge.poll()}
            t_judge = time.perf_counter() - t1
            judge.close()
        finally:
            server.stop()
            pool.close()
    rhos, top_hits, chance, flat = [], 0, [], 0
    by_pos: list[list[float]] = [[] for _ in range(size)]
    for gid, ex in exact.items():
        o = outcomes.get(gid)
        if o is None or o.status == "failed":
            continue
        eps = list(ex)  # creation order = the order the judge saw
        got = [o.rewards[e] for e in eps]
        want = [ex[e] for e in eps]
        rhos.append(spearman(got, want))
        flat += len(set(got)) == 1
        top_hits += want[max(range(size), key=lambda i: got[i])] > 0
        chance.append(sum(w > 0 for w in want) / size)
        for i, g in enumerate(got):
            by_pos[i].append(g)
    n = len(rhos)
    return {"judge_model": model_name, "view": view, "groups": groups, "group_size": size, "judged": n,
            "failed": sum(o.status == "failed" for o in outcomes.values()),
            "spearman_mean": statistics.fmean(rhos) if n else float("nan"),
            "spearman_sd": statistics.stdev(rhos) if n > 1 else 0.0,
            "flat_groups": flat, "top1_correct": top_hits / n if n else float("nan"),
            "top1_chance": statistics.fmean(chance) if chance else float("nan"),
            "mean_score_by_position": [round(statistics.fmean(p), 3) if p else None for p in by_pos],
            "calls": judge.stats["calls"], "bad_replies": judge.stats["bad_replies"],
            "s_per_group": t_judge / max(groups, 1), "load_s": t_load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--judge-model", default="tiny", help="conf/model/<name>.yaml serving the judge")
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--view", default="final", choices=["final", "transcript"])
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    r = run(args.judge_model, args.groups, args.group_size, args.view, args.seed)
    print(f"{r['judge_model']:>8} view={r['view']}: spearman {r['spearman_mean']:+.3f} +- {r['spearman_sd']:.3f} over "
          f"{r['judged']} groups ({r['flat_groups']} flat, {r['failed']} failed); top-1 correct {r['top1_correct']:.2f} "
          f"(chance {r['top1_chance']:.2f}); mean score by position {r['mean_score_by_position']}; "
          f"{r['s_per_group']:.2f} s/group, {r['bad_replies']} bad replies in {r['calls']} calls")
    print(f"judge: {r['judge_model']} spearman={r['spearman_mean']:.3f} top1={r['top1_correct']:.2f} "
          f"chance={r['top1_chance']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
