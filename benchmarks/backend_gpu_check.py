"""GPU check of the ``hf`` backend (not a test): exact logprobs in bf16, seeds across batches, speed vs ``generate``.

One prepared run for a bare single-GPU machine (torch, transformers, peft preinstalled; no
network), under 10 minutes on one H200. Before it, here (a machine with the package registries),
fetch the wheels the project's code needs there, into an ignored folder that travels with the run::

    .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .cache/gpu-wheels \\
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5

and on the device (``run`` with ``carry: [".cache/gpu-wheels"]``)::

    pip install --no-index --no-deps --target /tmp/site .cache/gpu-wheels/*.whl >/dev/null; \\
    PYTHONPATH=/tmp/site timeout 560 python benchmarks/backend_gpu_check.py

Stages, on the random 153M Llama of ``benchmarks/gpu_check.py`` in bfloat16 with one LoRA r8 policy:

1. ``recompute``: 64 sampled calls (mixed temperature / top-p / greedy) through the backend, on
   the peft model, on the merged-LoRA sampling copy, and on that copy with static slots and the
   compiled (CUDA-graph) step; each reply's recorded logprobs
   against one forward pass of the peft model (the trainer's) over prompt + reply, same dtype,
   ``processed_logprobs``: the largest absolute error, apart for rows without and with top-p (bf16
   on CUDA; the CPU tests hold float32 to 1e-4).
2. ``seeds``: 16 seeded calls alone, then the same calls inside a batch of 128 with other
   parameters: the fraction of replies whose tokens are identical (bf16 batched matmuls may
   round differently with the batch shape, which can flip a near-tie).
3. ``bench``: ``benchmarks/generation_bench.py --device cuda --model random153m --calls 8,64,256
   --tokens 64 --dtype bfloat16 --cb --static --slots 256`` (the backend on the peft model, on the
   merged copy, and on the merged copy with a static cache and a CUDA-graph step; plain eager
   ``generate`` with the same LoRA, transformers' ``generate_batch``, and compiled static-cache
   ``generate`` without LoRA), side by side.

The last line is ``backend_gpu_check: recompute max err <x>, seeds <a>/<b> identical, <bench line>``.
``--cpu-smoke`` runs the same stages on the CPU with a small random model (float32) to check the script.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from swarm.policy.base import GenerateRequest, SamplingParams  # noqa: E402
from swarm.policy.sampling import processed_logprobs  # noqa: E402
from swarm.train import LoraSpec  # noqa: E402

MIXED = [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0), (1.3, 0.8)]


def _req(i: int, seed: int | None, temperature: float, top_p: float, tokens: int = 32) -> GenerateRequest:
    msgs = [{"role": "user", "content": f"player {i}: who is the wolf tonight, and why?" + " really" * (i % 7)}]
    return GenerateRequest("p", messages=msgs, sampling=SamplingParams(max_tokens=tokens, seed=seed,
                                                                      temperature=temperature, top_p=top_p))


async def _gather(backend: object, reqs: list[GenerateRequest]) -> list:
    return await asyncio.gather(*(backend.generate(r) for r in reqs))  # type: ignore[attr-defined]


def recompute_error(backend: object) -> tuple[float, float]:
    """Largest |recorded - recomputed| logprob over 64 mixed-parameter calls: (rows without top-p, top-p rows).

    Top-p rows can differ by more: when the batched and the single forward pass round a logit
    differently, a token at the nucleus edge may be in one and out of the other, which moves the
    renormalisation by that token's mass.
    """
    reqs = [_req(i, i, *MIXED[i % len(MIXED)]) for i in range(64)]
    outs = asyncio.run(_gather(backend, reqs))
    worst = [0.0, 0.0]
    model = backend.model  # type: ignore[attr-defined]
    with torch.inference_mode(), backend.paused(), backend._adapter_context("p"):  # type: ignore[attr-defined]
        for r, [g] in zip(reqs, outs, strict=True):
            ids = torch.tensor([g.prompt_ids + g.response_ids], device=backend.device)  # type: ignore[attr-defined]
            logits = model(input_ids=ids).logits[0, len(g.prompt_ids) - 1 : -1]
            ref = processed_logprobs(logits, r.sampling.temperature, r.sampling.top_p)
            ref = ref.gather(-1, torch.tensor(g.response_ids, device=ref.device)[:, None])[:, 0].cpu()
            k = int(r.sampling.top_p < 1 and r.sampling.temperature > 0)
            worst[k] = max(worst[k], (torch.tensor(g.logprobs) - ref).abs().max().item())
    return worst[0], worst[1]


def seeds_identical(backend: object) -> tuple[int, int]:
    """(identical, total): 16 seeded calls alone vs inside a batch of 128 with other parameters."""
    mine = [_req(i, 1000 + i, 0.8, 0.95) for i in range(16)]
    alone = [asyncio.run(_gather(backend, [r]))[0][0] for r in mine]
    others = [_req(100 + i, None, *MIXED[i % len(MIXED)]) for i in range(112)]
    outs = asyncio.run(_gather(backend, others[:56] + mine + others[56:]))[56:72]
    same = sum(a.response_ids == b[0].response_ids for a, b in zip(alone, outs, strict=True))
    return same, len(mine)


class _Tee(io.StringIO):
    """A text buffer that also writes through to ``out``."""

    def __init__(self, out: io.TextIOBase) -> None:
        super().__init__()
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(text)
        self._out.flush()
        return super().write(text)


def main(argv: list[str] | None = None) -> int:
    smoke = "--cpu-smoke" in (sys.argv[1:] if argv is None else argv)
    if not smoke and not torch.cuda.is_available():
        print("no CUDA GPU: backend_gpu_check skipped")
        return 0
    from gpu_check import build_model_dir

    from swarm.policy.hf import HFBackend

    t0 = time.perf_counter()
    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model_dir(Path(tmp), *((128, 2, 4, 2, 2000) if smoke else (1024, 8, 16, 4, 32000)), dtype)
        backend = HFBackend(str(path), policies={"p": LoraSpec(rank=8)}, device=device, dtype=str(dtype).split(".")[-1],
                            max_batch_size=256, batch_wait_ms=50)
        try:
            errs = {}
            paths = {"peft model": (False, None), "merged LoRA copy": (True, None),
                     "merged copy on static slots, compiled step": (True, 256)}
            for name, (merge, slots) in paths.items():  # the recompute is the trainer's: the unmerged peft model
                backend.merge_lora, backend.static_cache_len, backend.max_batch_size = merge, slots, 64
                errs[name] = recompute_error(backend)
                print(f"recompute ({name}): max |recorded - recomputed| logprob {errs[name][0]:.2e} without top-p, "
                      f"{errs[name][1]:.2e} with ({dtype}, {time.perf_counter() - t0:.0f}s)", flush=True)
            backend.static_cache_len, backend.max_batch_size = None, 256
            err, err_p = max(e[0] for e in errs.values()), max(e[1] for e in errs.values())
            same, total = seeds_identical(backend)
            print(f"seeds: {same}/{total} replies identical alone and in a mixed batch of 128", flush=True)
        finally:
            backend.close()
    import generation_bench

    buf = _Tee(sys.stdout)  # printed as it comes (a run cut by its timeout keeps its rows), and kept
    with redirect_stdout(buf):
        if smoke:
            generation_bench.main(["--calls", "8,16", "--tokens", "8", "--reps", "1", "--cb", "--slots", "96"])
        else:
            generation_bench.main(["--device", "cuda", "--model", "random153m", "--calls", "8,64,256", "--tokens", "64",
                                   "--dtype", "bfloat16", "--reps", "1", "--cb", "--static", "--slots", "256"])
    last = buf.getvalue().strip().splitlines()[-1]
    print(f"backend_gpu_check: recompute max err {err:.2e} ({err_p:.2e} top-p), seeds {same}/{total} identical, {last} "
          f"({time.perf_counter() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
