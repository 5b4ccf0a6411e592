"""Benchmark: torch intra-op threads for sampling from the tiny model (the ``model.torch_threads`` default).

Times ``generate`` (a 160-token prompt, 10 new tokens, the warm-started tiny model) with 1 and
with 2 torch threads, side by side, first on an otherwise idle machine, then while
``--busy`` other processes spin on the CPU (what the flow's own gateway, workers and trainer,
or anything else on a 2-core machine, do to the sampler):

    .venv/bin/python benchmarks/threads_bench.py [--calls 20] [--busy 2]

The last line is ``threads: 2 threads / 1 thread = <idle ratio>x idle, <busy ratio>x busy``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _spin(stop: mp.Event) -> None:  # type: ignore[valid-type]
    x = 0
    while not stop.is_set():
        x += 1


def ms_per_call(model: object, ids: object, threads: int, calls: int) -> float:
    """Mean wall milliseconds of one sampled call with ``threads`` torch threads."""
    import torch

    torch.set_num_threads(threads)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=True, pad_token_id=0)  # type: ignore[attr-defined]
        t = time.perf_counter()
        for _ in range(calls):
            model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=True, pad_token_id=0)  # type: ignore[attr-defined]
    return (time.perf_counter() - t) * 1000 / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--busy", type=int, default=2, help="spinning processes for the busy measurement")
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from swarm.policy.tiny import ensure_tiny_model
    from swarm.policy.warmup import word_chain_warmup

    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(seed=0, warmup=word_chain_warmup)).eval()
    ids = torch.randint(5, 1000, (1, 160), generator=torch.Generator().manual_seed(0))
    print(f"cpu cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.1f}")
    ratios = {}
    for label in ("idle", "busy"):
        stop, procs = mp.Event(), []
        if label == "busy":
            procs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
            for p in procs:
                p.start()
        try:
            one = ms_per_call(model, ids, 1, args.calls)
            two = ms_per_call(model, ids, 2, args.calls)
        finally:
            stop.set()
            for p in procs:
                p.join(5)
        ratios[label] = two / one
        print(f"{label} ({len(procs)} spinning processes): 1 thread {one:.1f} ms/call, 2 threads {two:.1f} ms/call")
    print(f"threads: 2 threads / 1 thread = {ratios['idle']:.2f}x idle, {ratios['busy']:.2f}x busy")


if __name__ == "__main__":
    main()
