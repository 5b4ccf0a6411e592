"""Benchmark: one sampling step for a batch, per row on the host (the old loop) vs batched on the device.

The per-row path is what ``_decode.py`` did before on-device sampling: copy the ``(B, V)`` logits
to the host, then per row ``processed_logprobs`` + ``torch.multinomial`` with the row's
``torch.Generator`` and read the chosen logprob. The batched path is ``_decode._Sampler.step``
(one ``(B, V)`` pass, counter-based uniforms, one small tensor back). Logits: a Zipf law of
exponent ``--zipf`` over the vocabulary in a random order per row (1.5: the top 512 tokens hold
~98% of the mass, as in a chat model's typical next-token distribution; ``--zipf 0`` gives
``3 * randn`` logits, so flat that a top-p 0.9 nucleus has thousands of tokens and the batched
top-p path falls back to a full sort), vocabulary ``--vocab`` (SmolLM2's 49,152 by default), mean
of ``--reps`` steps after one warm-up:

    .venv/bin/python benchmarks/sampler_bench.py [--device cpu] [--vocab 49152] [--threads 1]

The last line is ``sampler: batched / per-row = <x> at <B> rows, top_p 1.0``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from swarm.policy._decode import Row, _Sampler  # noqa: E402
from swarm.policy.base import SamplingParams  # noqa: E402
from swarm.policy.sampling import processed_logprobs, sample_from  # noqa: E402


def per_row(logits: torch.Tensor, top_p: float, gens: list[torch.Generator]) -> None:
    host = logits.float().cpu()
    for b in range(host.shape[0]):
        logp = processed_logprobs(host[b], 1.0, top_p)
        float(logp[sample_from(logp, 1.0, gens[b])])


def logits_for(rows: int, vocab: int, zipf: float) -> torch.Tensor:
    """``(rows, vocab)`` logits: Zipf-distributed probabilities in a random token order, or ``3 * randn``."""
    g = torch.Generator().manual_seed(0)
    if zipf <= 0:
        return torch.randn(rows, vocab, generator=g) * 3
    law = -zipf * torch.arange(1, vocab + 1, dtype=torch.float32).log()
    return torch.stack([law[torch.randperm(vocab, generator=g)] for _ in range(rows)])


def ms(fn: object, reps: int, device: torch.device) -> float:
    fn()  # type: ignore[operator]
    t = time.perf_counter()
    for _ in range(reps):
        fn()  # type: ignore[operator]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", default="8,32,64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--zipf", type=float, default=1.5)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"vocab {args.vocab}, zipf {args.zipf}, {device}, torch threads {args.threads}\n"
          "| rows | top_p | per-row host ms/step | batched ms/step | batched / per-row |\n|---:|---:|---:|---:|---:|")
    last = ""
    for top_p in (1.0, 0.9):
        for b in (int(x) for x in args.rows.split(",")):
            logits = logits_for(b, args.vocab, args.zipf).to(device)
            rows = [Row(index=0, prompt_ids=[1], sampling=SamplingParams(top_p=top_p), seed=i) for i in range(b)]
            gens = [torch.Generator().manual_seed(i) for i in range(b)]
            sampler = _Sampler(rows, device)
            old = ms(lambda lg=logits, g=gens, p=top_p: per_row(lg, p, g), args.reps, device)
            new = ms(lambda lg=logits, s=sampler: s.step(lg), args.reps, device)
            print(f"| {b} | {top_p} | {old:.1f} | {new:.1f} | {new / old:.2f} |", flush=True)
            if top_p == 1.0:
                last = f"sampler: batched / per-row = {new / old:.2f} at {b} rows, top_p 1.0"
    print(last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
