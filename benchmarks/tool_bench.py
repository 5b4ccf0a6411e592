"""Benchmark (the multi-turn learning proof): SmolLM2-135M-Instruct learns to use a calculator, swarmpool vs TRL.

The task is ``math`` with ``task.options.problems=calc`` ("What is 47 * 38 + 15?": too hard to do in one's
head for a 135M model, one tool call away) run by the task's unmodified LangChain agent
(``experiments/math/agent.py``): the model calls ``calculator(expression)``, reads the result in a ``tool``
message and answers; reward 1 for the right final number, +0.1 for a well-formed call. The agent's first call
names the calculator in ``tool_choice`` (``task.options.first_tool_call=true``, what a user whose agent always
computes first would set; constrained decoding, recorded with the step), so the model still has to write the
right expression and then answer with the result. Held-out problems (a fixed quarter by hash, seeds from
``EVAL_SEED_BASE``) are never trained on.

1. **swarmpool** (``hf``): ``python -m flows.train +task=math model=smollm2`` with the recipe below as a
   subprocess (gateway, SQLite pool, client workers running the LangChain agent, prefix merging, GRPO + LoRA).
2. **TRL** (``trl``): ``GRPOTrainer(tools=[calculator])`` on the same converted model, our chat template (TRL's
   hermes parser set on it), problems, reward and recipe (``benchmarks/tool_bench_trl.py``). TRL cannot force a
   first call, and unforced SmolLM2 never called the tool (0 of 48 samples), so its first prompt ends with the
   call's opening ``<tool_call>\n{"name": "calculator", "arguments": {"expression": "`` (not trained; the model
   writes the expression and closes the call itself, without our grammar); the other differences are listed
   in that module.
3. **held-out eval** of the base model and of each side's final adapter, the same way for all: the agent
   through our gateway on the ``hf`` backend, ``--eval-problems`` problems x ``--samples`` samples at T=1;
   accuracy with the 95% CI of the gain paired by problem, tool-call rate and turns per episode.

Recipe: 4 problems x 8 samples per update, LoRA r16 / alpha 32 on every projection, ``--lr``, T=1, at most
48 new tokens a turn, up to 4 turns, PPO-clip 0.2, group-normalised advantages, no KL, float32.
Per side: wall and CPU seconds per update (start-up excluded), reward of the first and last updates, and
for swarmpool ``merge/token_ratio`` (tokens before / after prefix merging: what the shared-prefix merge
saves on these episodes). The last line:
``tool: held-out accuracy <A>% -> <B>% (<n> problems x <k> samples, 95% CI of the gain <lo>..<hi> points),
tool calls <t>/episode, <u> turns, merge ratio <m>, swarmpool <s> s/update <c> CPU-s/update[, trl ...]``.

    .venv/bin/python benchmarks/tool_bench.py [--updates 10] [--backends hf,trl] [--eval-problems 48]

Measured (``--updates 8 --eval-problems 32 --samples 2 --backends hf``, 2-core x86_64, AVX2, load 2-9 with other
jobs): held-out 7.8% -> 95.3% (CI of the gain 79.9..95.1), tool calls 1.00 an episode (100% well-formed), 2.00 turns,
merge ratio 8.23, 310.8 s/update, 140.7 CPU-s/update, reward 0.26 -> 0.80; 58 min in all (docs/numbers.md has TRL's
side and the earlier run).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from arithmetic_bench import paired_ci  # noqa: E402
from e2e_bench import run_swarm  # noqa: E402

PROMPTS, GROUP, MAX_TOKENS, MAX_TURNS, RANK, ALPHA = 4, 8, 48, 4, 16, 32
TASK = ["+task=math_calc"]  # conf/task/math_calc.yaml: problems=calc, first_tool_call=true


def recipe(lr: float) -> list[str]:
    """The flows.train overrides of the bench's recipe (the slow test runs it too)."""
    return [*TASK, "model=smollm2", f"algo.lr={lr}", f"task.group_size={GROUP}", f"batching.min_groups={PROMPTS}",
            f"task.max_tokens={MAX_TOKENS}", "train.checkpoint_every=1000"]


def evaluate(model_dir: str, adapter: str | None, problems: int, samples: int, workers: int = 16) -> dict[str, Any]:
    """Held-out episodes of the agent through our gateway on the hf backend (base + ``adapter``): per problem the
    mean correct over ``samples``, and the tool-call and turn counts per episode."""
    import httpx

    from experiments import math as task
    from swarm.app import GatewaySettings, create_app
    from swarm.client.task import AgentLLM
    from swarm.policy.fleet import load_adapter_dir, load_adapter_spec
    from swarm.policy.hf import HFBackend
    from swarm.pool import Pool
    from swarm.stack import ServerThread

    task.Options(problems="calc", first_tool_call=True).use()
    spec = load_adapter_spec(adapter) if adapter else None
    backend = HFBackend(model_dir, policies={"default": spec}, chat_template="smollm2", torch_threads=1,
                        max_batch_size=workers)
    if adapter:
        backend.load_weights("default", load_adapter_dir(adapter), 1)
    with tempfile.TemporaryDirectory() as d:
        pool = Pool(f"sqlite:///{Path(d) / 'eval.db'}")
        server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
        try:
            def episode(job: tuple[int, int]) -> tuple[int, dict[str, float]]:
                k, _ = job
                ep = httpx.post(f"{server.url}/v1/episodes", json={"task": "math", "type": "eval"}).json()
                llm = AgentLLM(ep["base_url"], ep["api_key"], temperature=1.0, max_tokens=MAX_TOKENS)
                return k, task.run_episode(task.make_instance(task.EVAL_SEED_BASE + k), llm)

            with ThreadPoolExecutor(workers) as ex:
                runs = list(ex.map(episode, [(k, s) for k in range(problems) for s in range(samples)]))
        finally:
            server.stop()
            backend.close()
            pool.close()
    correct = [statistics.mean(r["correct"] for k2, r in runs if k2 == k) for k in range(problems)]
    return {"correct": correct, "tool_calls": statistics.mean(r["tool_calls"] for _, r in runs),
            "tool_ok": statistics.mean(float(r["tool_ok"] > 0) for _, r in runs),
            "turns": statistics.mean(r["turns"] for _, r in runs)}


def _flow_metrics(tmp: Path) -> dict[str, float]:
    db = sqlite3.connect(tmp / "mlruns.db")
    out = dict(db.execute("SELECT key, avg(value) FROM metrics WHERE key IN ('merge/token_ratio', "
                          "'episodes/tool_calls', 'episodes/turns') GROUP BY key").fetchall())
    db.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--backends", default="hf,trl", help="comma list of hf (the flow) and trl")
    ap.add_argument("--eval-problems", type=int, default=48)
    ap.add_argument("--samples", type=int, default=2, help="T=1 samples per held-out problem")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="extra flows.train overrides")
    args = ap.parse_args()
    from swarm.policy.gguf import ensure_gguf_model

    t0 = time.time()
    model = str(ensure_gguf_model("smollm2"))
    res: dict[str, Any] = {"base": evaluate(model, None, args.eval_problems, args.samples)}
    base = res["base"]
    print(f"base model: held-out {100 * statistics.mean(base['correct']):.1f}%, tool calls {base['tool_calls']:.2f}"
          f"/episode, {base['turns']:.2f} turns", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for side in [b.strip() for b in args.backends.split(",") if b.strip()]:
            (tmp / side).mkdir()
            if side == "hf":
                r = run_swarm(args.updates, tmp / side, [*recipe(args.lr), *args.overrides])
                r.update(_flow_metrics(tmp / side))
                adapter = str(sorted((tmp / side / "out" / "adapters" / "default").glob("v*"))[-1])
            elif side == "trl":
                from tool_bench_trl import run_trl_tools

                try:
                    r = run_trl_tools(model, args.updates, args.lr, tmp / side, prompts=PROMPTS, group=GROUP,
                                      max_tokens=MAX_TOKENS, max_turns=MAX_TURNS, rank=RANK, alpha=ALPHA,
                                      prefill_first_call=True)
                except SystemExit as e:  # keep the sides that ran
                    print(f"trl: skipped, it failed: {str(e).strip().splitlines()[-1]}", flush=True)
                    continue
                adapter = r["adapter"]
            else:
                raise SystemExit(f"--backends: {side}: pick from hf, trl")
            r["eval"] = evaluate(model, adapter, args.eval_problems, args.samples)
            res[side] = r
            print(f"{side}: {len(r['rewards'])} updates, {r['wall']:.1f} s/update, {r['cpu']:.1f} CPU-s/update, "
                  f"held-out {100 * statistics.mean(r['eval']['correct']):.1f}%", flush=True)
    minutes = (time.time() - t0) / 60
    print(f"machine: {os.cpu_count()} CPUs (load avg {os.getloadavg()[0]:.1f}); {args.updates} updates of {PROMPTS} "
          f"problems x {GROUP} samples, LoRA r{RANK}, lr {args.lr}, T=1, {MAX_TOKENS} tokens a turn")
    line = ""
    for side in ("hf", "trl"):
        if side not in res:
            continue
        r, ev = res[side], res[side]["eval"]
        gain, lo, hi = paired_ci(base["correct"], ev["correct"])
        r.update(gain=gain, ci=[lo, hi])
        rw = r["rewards"]
        print(f"  {side:3s}: {r['wall']:.1f} s/update, {r['cpu']:.1f} CPU-s/update, reward first-3 "
              f"{statistics.mean(rw[:3]):.3f} last-3 {statistics.mean(rw[-3:]):.3f}; held-out "
              f"{100 * statistics.mean(base['correct']):.1f}% -> {100 * statistics.mean(ev['correct']):.1f}% "
              f"(CI {lo:.1f}..{hi:.1f}), tool calls {ev['tool_calls']:.2f}/episode (well-formed "
              f"{100 * ev['tool_ok']:.0f}%), {ev['turns']:.2f} turns")
        if side == "hf":
            line = (f"tool: held-out accuracy {100 * statistics.mean(base['correct']):.1f}% -> "
                    f"{100 * statistics.mean(ev['correct']):.1f}% ({args.eval_problems} problems x {args.samples} "
                    f"samples, 95% CI of the gain {lo:.1f}..{hi:.1f} points), tool calls {ev['tool_calls']:.2f}"
                    f"/episode, {ev['turns']:.2f} turns, merge ratio {r.get('merge/token_ratio', float('nan')):.2f}, "
                    f"swarmpool {r['wall']:.1f} s/update {r['cpu']:.1f} CPU-s/update")
        else:
            line += (f", trl {r['wall']:.1f} s/update {r['cpu']:.1f} CPU-s/update, held-out "
                     f"{100 * statistics.mean(ev['correct']):.1f}% (CI {lo:.1f}..{hi:.1f})")
    if args.json is not None:
        args.json.write_text(json.dumps({**res, "minutes": minutes}, indent=1, default=str))
    print(line + f", {minutes:.1f} min")


if __name__ == "__main__":
    main()
