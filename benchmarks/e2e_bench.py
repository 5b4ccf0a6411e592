"""End to end: ``python -m flows.train`` (defaults) vs TRL's GRPOTrainer, same model, task and recipe.

Both train the warm-started tiny model (``conf/model/tiny.yaml``) on the echo task
(``experiments/echo``: reward = character similarity to the asked word) with one recipe: 4 prompts
x 8 samples per update, LoRA r16 / alpha 32 on every projection, lr 3e-3, temperature 1, at
most 8 new tokens, PPO-clip 0.2, group-normalised advantages, no KL. swarmpool runs its real
stack (Prefect flow, gateway on loopback, SQLite pool, client workers going through the OpenAI
SDK, MLflow run) as a subprocess; TRL runs in its own subprocess, in-process generation.

Per side, over N updates: wall seconds and CPU seconds (user + system of the process tree) per
update, measured between the first and the last update (start-up excluded), mean reward of the
first 5 and the last 10 updates, and bytes written to disk per update (the tree's write_bytes
over the same span: checkpoints, adapters, MLflow, pool).

Run: ``.venv/bin/python benchmarks/e2e_bench.py [--updates 30] [--trl-threads 1]`` (needs the ``bench``
extra: ``pip install -e '.[bench]'`` for trl; ``--trl-threads 1`` matches the flow's one torch thread and keeps
TRL from slowing down several-fold on a loaded machine). The last line is
``e2e: swarmpool <a> s/update, trl <b> s/update (ratio <a/b>), reward <r1> vs <r2>, disk <d> MB/update``.
Numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS, GROUP, MAX_TOKENS, LR, RANK, ALPHA = 4, 8, 8, 3e-3, 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TreeMonitor:
    """Samples (time, CPU seconds, bytes written) of a process tree every ``every`` seconds."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.root = psutil.Process(pid)
        self.every = every
        self.samples: list[tuple[float, float, int]] = []
        self._seen: dict[int, tuple[float, int]] = {}  # last reading of every process ever seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    t, io = p.cpu_times(), p.io_counters()
                    self._seen[p.pid] = (t.user + t.system + t.children_user + t.children_system, io.write_bytes)
                except psutil.Error:
                    pass
            cpu = sum(c for c, _ in self._seen.values())
            wb = sum(w for _, w in self._seen.values())
            self.samples.append((time.time(), cpu, wb))
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> tuple[float, int]:
        """(CPU seconds, bytes written) at the first sample at or after ``t``."""
        for ts, cpu, wb in self.samples:
            if ts >= t:
                return cpu, wb
        return self.samples[-1][1], self.samples[-1][2]


def _span(mon: TreeMonitor, times: list[float]) -> dict[str, float]:
    n = len(times) - 1
    c0, w0 = mon.at(times[0])
    c1, w1 = mon.at(times[-1])
    return {"wall": (times[-1] - times[0]) / n, "cpu": (c1 - c0) / n, "disk_mb": (w1 - w0) / n / 1e6}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}


# ---------------------------------------------------------------- swarmpool
def run_swarm(updates: int, tmp: Path, extra: list[str]) -> dict[str, Any]:
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    cmd = [sys.executable, "-m", "flows.train", f"train.updates={updates}", f"train.out_dir={tmp / 'out'}",
           f"hydra.run.dir={tmp / 'hydra'}", *extra]
    env = {**_env(), "MLFLOW_TRACKING_URI": uri, "PREFECT_HOME": str(tmp / "prefect")}
    with open(tmp / "swarm.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
        mon = TreeMonitor(proc.pid)
        rc = proc.wait()
        mon.stop()
    if rc != 0:
        raise SystemExit(f"flows.train failed (rc {rc}); see {tmp / 'swarm.log'}:\n" + (tmp / "swarm.log").read_text()[-3000:])
    db = sqlite3.connect(tmp / "mlruns.db")
    rows = db.execute("SELECT step, value, timestamp FROM metrics WHERE key = 'reward/mean' ORDER BY step").fetchall()
    stages = dict(db.execute("SELECT key, avg(value) FROM metrics WHERE key LIKE 'time/%' GROUP BY key").fetchall())
    db.close()
    rewards = [v for _, v, _ in rows]
    times = [ts / 1000 for _, _, ts in rows]
    return {"rewards": rewards, **_span(mon, times), "stages": stages}


# ---------------------------------------------------------------- TRL
TRL_SCRIPT = r'''
import json, random, sys, time
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from experiments.echo import VERBS, WORDS, echo_reward
from swarm.policy.hf import HFSettings

cfg = json.loads(sys.argv[1])
if cfg.get("threads"):
    torch.set_num_threads(cfg["threads"])
torch.manual_seed(0)
path = HFSettings(name="tiny", backend="hf", warmup="word_chain").weights()
tok = AutoTokenizer.from_pretrained(path)
rng = random.Random(0)
rows = [{"prompt": [{"role": "user", "content": f"{rng.choice(VERBS)} {w}"}], "word": w}
        for w in (rng.choice(WORDS) for _ in range(cfg["prompts"] * cfg["updates"] * 2))]

def reward(completions, word, **_):
    return [echo_reward(c[0]["content"], w)["reward"] for c, w in zip(completions, word)]

class Times(TrainerCallback):
    def __init__(self): self.times = []
    def on_step_end(self, args, state, control, **kw): self.times.append(time.time())

args = GRPOConfig(output_dir=cfg["out"], per_device_train_batch_size=cfg["prompts"] * cfg["group"],
                  num_generations=cfg["group"], max_completion_length=cfg["max_tokens"], temperature=1.0,
                  learning_rate=cfg["lr"], lr_scheduler_type="constant", warmup_steps=0, beta=0.0, epsilon=0.2,
                  max_steps=cfg["updates"], logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                  seed=0, max_grad_norm=1.0, weight_decay=0.0, disable_tqdm=True, dataloader_num_workers=0,
                  bf16=False, gradient_checkpointing=False)  # fp32 like ours; both default on in TRL
times = Times()
trainer = GRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                      processing_class=tok, callbacks=[times],
                      peft_config=LoraConfig(r=cfg["rank"], lora_alpha=cfg["alpha"], target_modules=cfg["targets"],
                                             lora_dropout=0.0, task_type="CAUSAL_LM"))
trainer.train()
rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
print("TRL_RESULT " + json.dumps({"rewards": rewards, "times": times.times}), flush=True)
'''


def run_trl_script(script: str, cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run a TRL script (its config as JSON in argv[1]) in a monitored subprocess; its ``TRL_RESULT`` line + timings."""
    with open(tmp / "trl.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(cfg)], cwd=tmp, env=_env(),
                                stdout=subprocess.PIPE, stderr=log, text=True)
        mon = TreeMonitor(proc.pid)
        out, _ = proc.communicate()
        mon.stop()
    if proc.returncode != 0:
        raise SystemExit(f"TRL failed (rc {proc.returncode}):\n" + (tmp / "trl.log").read_text()[-3000:])
    res = json.loads(next(line for line in out.splitlines() if line.startswith("TRL_RESULT "))[11:])
    return {"rewards": res["rewards"], **_span(mon, res["times"])}


def run_trl(updates: int, tmp: Path, threads: int | None = None) -> dict[str, Any]:
    cfg = {"updates": updates, "prompts": PROMPTS, "group": GROUP, "max_tokens": MAX_TOKENS, "lr": LR,
           "rank": RANK, "alpha": ALPHA, "targets": TARGETS, "out": str(tmp / "trl"), "threads": threads}
    return run_trl_script(TRL_SCRIPT, cfg, tmp)


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--only", choices=["swarm", "trl"], default=None)
    ap.add_argument("--trl-threads", type=int, default=None,
                    help="torch threads of the TRL side (default: torch's, all cores; the flow's tiny model uses 1, "
                         "model.torch_threads): on a loaded machine torch's spinning threads slow TRL down")
    ap.add_argument("overrides", nargs="*", help="extra flows.train overrides, e.g. train.checkpoint_every=10")
    args = ap.parse_args()
    res: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.only in (None, "swarm"):
            res["swarmpool"] = run_swarm(args.updates, tmp, args.overrides)
        if args.only in (None, "trl"):
            res["trl"] = run_trl(args.updates, tmp, args.trl_threads)
    print(f"machine: {os.cpu_count()} CPUs (load avg {os.getloadavg()[0]:.1f}); {args.updates} updates of "
          f"{PROMPTS} prompts x {GROUP} samples, LoRA r{RANK}, lr {LR}, T=1, {MAX_TOKENS} tokens; "
          f"TRL torch threads {args.trl_threads or 'default'}")
    for name, r in res.items():
        print(f"  {name:9s}: {r['wall']:.3f} s/update wall, {r['cpu']:.3f} CPU-s/update, "
              f"{r['disk_mb']:.2f} MB written/update, reward first-5 {_mean(r['rewards'][:5]):.3f} "
              f"last-10 {_mean(r['rewards'][-10:]):.3f}")
    if "swarmpool" in res:
        st = res["swarmpool"]["stages"]
        print("  swarmpool stages (mean s/update): " + ", ".join(f"{k[5:]} {v:.3f}" for k, v in sorted(st.items())))
    if len(res) == 2:
        a, b = res["swarmpool"], res["trl"]
        print(f"e2e: swarmpool {a['wall']:.2f} s/update, trl {b['wall']:.2f} s/update (ratio {a['wall'] / b['wall']:.2f}), "
              f"reward {_mean(a['rewards'][-10:]):.2f} vs {_mean(b['rewards'][-10:]):.2f}, "
              f"disk {a['disk_mb']:.2f} MB/update")


if __name__ == "__main__":
    main()
