"""xgrammar vs llguidance on the tiny tokenizer: grammar compile time and per-token mask time.

What the ``hf`` backend pays for ``response_format`` / ``tool_choice``: building the
tokenizer's grammar index once, compiling one grammar per distinct schema (an enum of legal
targets, as a game decision sends), and one mask per sampled token. Each library walks the
same valid JSON reply token by token (fill the next-token bitmask, accept the token); the two
masks are compared at every position. CPU seconds (``time.process_time``) next to wall time,
medians over ``--reps`` distinct schemas (no compile cache hit).

Then, end to end on the ``hf`` backend with the tiny model (``--e2e``, default on): the same
game-like vote prompt, 8 samples per call, with and without the enum ``json_schema``; CPU
seconds per sampled token, and the share of constrained replies that validate.

Run: ``.venv/bin/python benchmarks/constraint_bench.py [--reps 20] [--calls 10]`` (the tiny model
and tokenizer are built locally). Prints one line per measurement and a last ``constraint:``
line with the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _schema(k: int) -> dict:
    names = [f"player{i}_{k}" for i in range(9)]
    return {"type": "object", "properties": {"target": {"type": "string", "enum": names}},
            "required": ["target"], "additionalProperties": False}


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--calls", type=int, default=10, help="end-to-end hf calls (8 samples each) per variant")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from swarm.policy.tiny import ensure_tiny_model

    model_path = str(ensure_tiny_model(cache_dir=REPO / ".cache" / "models"))
    tok = AutoTokenizer.from_pretrained(model_path)
    vocab = len(tok)
    stop = [tok.eos_token_id]

    import llguidance
    import llguidance.hf
    import llguidance.torch as lltorch
    import xgrammar as xgr

    xinfo, xw, xc = _timed(lambda: xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=stop))
    lltok, lw, lc = _timed(lambda: llguidance.hf.from_tokenizer(tok, n_vocab=vocab, eos_token=stop[0]))
    print(f"tokenizer index ({vocab} tokens): xgrammar {xw * 1e3:.1f} ms wall / {xc * 1e3:.1f} ms cpu, "
          f"llguidance {lw * 1e3:.1f} ms wall / {lc * 1e3:.1f} ms cpu")
    compiler = xgr.GrammarCompiler(xinfo, max_threads=1, cache_enabled=False)

    res = {"xgr_compile": [], "llg_compile": [], "xgr_mask": [], "llg_mask": []}
    mismatches = 0
    for k in range(args.reps):
        schema = _schema(k)
        reply = json.dumps({"target": f"player{k % 9}_{k}"}, separators=(",", ":"))
        ids = tok.encode(reply, add_special_tokens=False) + stop

        cg, _, c = _timed(lambda s=schema: compiler.compile_json_schema(json.dumps(s), any_whitespace=False,
                                                                         separators=(",", ":")))
        res["xgr_compile"].append(c)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m, _, c = _timed(lambda g=grammar: llguidance.LLMatcher(lltok, g, log_level=0))
        res["llg_compile"].append(c)
        assert not m.is_error(), m.get_error()

        xm = xgr.GrammarMatcher(cg)
        xmask = xgr.allocate_token_bitmask(1, vocab)
        lmask = lltorch.allocate_token_bitmask(1, vocab)
        tx = tl = 0.0
        for t in ids:
            c0 = time.process_time()
            xm.fill_next_token_bitmask(xmask)
            tx += time.process_time() - c0
            c0 = time.process_time()
            lltorch.fill_next_token_bitmask(m, lmask)
            tl += time.process_time() - c0
            mismatches += int(not torch.equal(xmask, lmask))
            assert xm.accept_token(t), (k, t)
            assert m.consume_token(t), (k, t, m.get_error())
        res["xgr_mask"].append(tx / len(ids))
        res["llg_mask"].append(tl / len(ids))

    med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
    print(f"compile enum schema (9 values), median of {args.reps}: xgrammar {med['xgr_compile']:.2f} ms cpu, "
          f"llguidance {med['llg_compile']:.2f} ms cpu")
    print(f"mask per token, median: xgrammar {med['xgr_mask'] * 1e3:.0f} us cpu, "
          f"llguidance {med['llg_mask'] * 1e3:.0f} us cpu; positions where the masks differ: {mismatches}")
    e2e = _end_to_end(model_path, args.calls)
    print(f"constraint: compile llguidance/xgrammar = {med['llg_compile'] / med['xgr_compile']:.2f}x, "
          f"mask llguidance/xgrammar = {med['llg_mask'] / med['xgr_mask']:.2f}x, "
          f"hf decode constrained/free = {e2e:.2f}x cpu per token")


def _end_to_end(model_path: str, calls: int) -> float:
    """CPU seconds per sampled token on the hf backend, constrained vs free; returns the ratio."""
    import asyncio

    from swarm.policy.base import GenerateRequest, SamplingParams
    from swarm.policy.constraint import request_constraint
    from swarm.policy.hf import HFBackend

    backend = HFBackend(model_path, torch_threads=1)
    schema = _schema(0)
    c = request_constraint({"type": "json_schema", "json_schema": {"name": "vote", "strict": True, "schema": schema}})
    msgs = [{"role": "system", "content": "You are player3, a villager."},
            {"role": "user", "content": "Day 1. Alive: " + ", ".join(schema["properties"]["target"]["enum"])
             + ". Vote for one player."}]
    per_token = {}
    try:
        for name, constraint in (("free", None), ("json_schema", c)):
            tokens, valid, cpu = 0, 0, 0.0
            for k in range(calls):
                req = GenerateRequest("default", messages=msgs, constraint=constraint,
                                      sampling=SamplingParams(max_tokens=32, n=8, seed=k))
                gens, _, c_s = _timed(lambda r=req: asyncio.run(backend.generate(r)))
                cpu += c_s
                tokens += sum(len(g.response_ids) for g in gens)
                for g in gens:
                    try:
                        valid += json.loads(g.text)["target"] in schema["properties"]["target"]["enum"]
                    except (ValueError, KeyError, TypeError):
                        pass
            per_token[name] = cpu / tokens
            print(f"hf decode {name}: {calls} calls x 8 samples, {tokens} tokens, {per_token[name] * 1e3:.2f} ms cpu "
                  f"per token, valid votes {valid}/{calls * 8}")
    finally:
        backend.close()
    return per_token["json_schema"] / per_token["free"]


if __name__ == "__main__":
    main()
