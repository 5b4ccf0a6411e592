"""The TRL side of the multi-turn tool benchmark (issue 45): ``GRPOTrainer(tools=[calculator])`` on ``math`` ``calc``.

TRL 1.16's ``GRPOTrainer`` runs its own tool loop in plain transformers ``generate`` (CPU, float32): it parses each
reply with the tokenizer's ``response_template``, calls the tool, appends ``{"role": "tool", ...}``, renders the
tool turn with the chat template and generates again, at most ``max_tool_calling_iterations`` times; the tool-result
tokens are left out of the loss (``tool_mask``). Here it trains SmolLM2-135M-Instruct (the converted GGUF,
:func:`swarm.policy.gguf.ensure_gguf_model`) on the ``math`` task's ``calc`` problems ("What is 47 * 38 + 15?",
train split) with the swarmpool side's system prompt, calculator and reward.

The fair setup (what both sides see):

- **Chat template: ours.** SmolLM2's own template has no tools (TRL's ``supports_tool_calling`` refuses it), so
  TRL gets ``FAMILIES["smollm2"].text()``, the hermes template the swarmpool side renders: tools listed in the
  system turn, calls as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, results as a user turn
  of ``<tool_response>`` blocks. It is prefix-preserving, so TRL keeps it (no training-template swap). TRL's own
  ``qwen2_5_chat_template`` renders these prompts byte for byte the same (a system message is always given).
- **Parser: TRL's.** TRL attaches a ``response_template`` only to templates it recognises; ours is set by hand to
  ``trl.chat_template_utils.qwen3_template``, the hermes JSON parser TRL itself attaches to
  ``qwen2_5_chat_template`` (``<|im_start|>assistant\\n`` anchor, ``<tool_call>`` JSON blocks, ``<|im_end|>``).
- **Budget:** ``max_tokens`` new tokens per model turn (``generation_kwargs.max_new_tokens``, as each of our calls
  has ``max_tokens``), ``max_turns`` model turns (``max_tool_calling_iterations = max_turns - 1``); TRL also caps
  the whole multi-turn completion (``max_completion_length``), set to leave room for every turn and tool result.

What differs from the swarmpool side: (1) our first turn is forced to call the calculator (``tool_choice``,
constrained decoding); TRL has no ``tool_choice``, so by default its model must choose to call (SmolLM2-135M, unforced,
wrote no ``<tool_call>`` in 48 samples at T=1 here). ``prefill_first_call=True`` is the nearest TRL can do: the first
prompt ends with the call's opening, ``<tool_call>\n{"name": "calculator", "arguments": {"expression": "`` (a
template variable, ``chat_template_kwargs``, written after the generation prompt only when the last message is the
user's, so tool turns are untouched); the model writes the expression and must close the call itself (no pattern,
no grammar), and the opening is prompt, not trained. (2) The tool schema in the system
prompt comes from the function's type hints and docstring (TRL takes callables): the same name, description and
``expression`` description, but no ``pattern`` on ``expression`` and an added ``"return": {"type": "string"}``.
(3) A malformed call (bad JSON) is plain text to TRL's parser: the episode ends there, with no error result turn,
where our agent answers it with an error and goes on. (4) TRL's last allowed turn's calls are not run (ours are,
and their results are dropped); both count them in the reward's ``tool_calls`` / ``tool_ok``. (5) TRL runs
``calculator(**arguments)``, so an argument besides ``expression`` makes the call an error (our agent passes the dict
to ``run_calculator``, which ignores extra keys); :func:`score_completion` judges calls as TRL ran them. (6) TRL
takes the logits of the whole batch at once: at 32 sequences a step its process passed 20 GB and was OOM-killed on
a 24 GB machine, so it trains in micro-batches of :data:`MICRO_BATCH` accumulated into one optimizer step (same
generation batch and update count; ours chunks the LM head at the trained positions instead).

Not here: the held-out evaluation and the swarmpool side (``benchmarks/tool_bench.py``), or anything but CPU.

    .venv/bin/python benchmarks/tool_bench_trl.py --updates 1 --prompts 2 --group 2 --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from arithmetic_bench import TARGETS  # noqa: E402
from e2e_bench import run_trl_script  # noqa: E402

from experiments.math.calculator import run_calculator  # noqa: E402
from experiments.math.reward import math_reward  # noqa: E402

__all__ = ["FIRST_CALL_PREFILL", "TOOL_RESULT_TOKENS", "prefill_template", "TRL_TOOLS_SCRIPT", "calculator", "score_completion", "run_trl_tools"]

# TRL computes the whole batch's logits at once (32 x ~730 tokens x a 49k vocabulary in float32): at 32 sequences a
# step its process grew past 20 GB and was OOM-killed on a 24 GB machine (at 8 a step it held ~10 GB), so it trains 4
# at a time and accumulates the 8 micro-batches into one optimizer step (one generation batch of 32, as on our side)
MICRO_BATCH = 4
TOOL_RESULT_TOKENS = 64  # room per tool turn in TRL's whole-completion cap (a result turn renders ~20 tokens)
FIRST_CALL_PREFILL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
SETUP = ("template: swarmpool smollm2 (hermes <tool_call> JSON, same text as TRL's qwen2_5_chat_template here); "
         "parser: TRL's qwen3_template response_template (what TRL attaches to qwen2_5); tool schema from the "
         "calculator's docstring; first call: {}")


def prefill_template(template: str) -> str:
    """``template`` with its generation prompt followed by ``first_call_prefill`` (a template variable) when the last
    message is the user's: the first turn opens a calculator call, tool-result turns are rendered as before."""
    gen = "{{- '<|im_start|>assistant\\n' }}"
    if template.count(gen) != 1:
        raise ValueError("the template has no single generation prompt to prefill after")
    hook = ("{%- if first_call_prefill is defined and first_call_prefill and messages[-1].role == 'user' %}"
            "{{- first_call_prefill }}{%- endif %}")
    return template.replace(gen, gen + hook)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: e.g. 12 + 7 * 3
    """
    return run_calculator({"expression": expression})[0]


def score_completion(messages: list[dict[str, Any]], answer: float) -> dict[str, float]:
    """``math_reward`` of one TRL completion (its assistant and tool messages), plus ``turns``.

    The final text is the last assistant message's content; every call in every assistant message counts. A call is
    well-formed when TRL's ``calculator(**arguments)`` would succeed: the name ``calculator``, arguments exactly
    ``{"expression": ...}`` (TRL answers an extra argument with a TypeError result, where our agent ignores it) and
    an expression ``run_calculator`` evaluates."""
    calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    ok = 0
    for call in calls:
        fn = call.get("function", call)
        args = fn.get("arguments")
        ok += (fn.get("name") == "calculator" and isinstance(args, dict) and set(args) == {"expression"}
               and run_calculator(args)[1])
    final = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
    turns = sum(m.get("role") == "assistant" for m in messages)
    return {**math_reward(final, answer, ok, len(calls) - ok, len(calls)), "turns": float(turns)}


TRL_TOOLS_SCRIPT = r'''
import json, sys, time
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["bench_dir"])
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_template
from experiments.math.agent import SYSTEM_PROMPT
from experiments.math.problems import make_calc_problem
from swarm.policy.templates import FAMILIES
from tool_bench_trl import FIRST_CALL_PREFILL, calculator, prefill_template, score_completion

torch.manual_seed(0)
torch.set_num_threads(1)
tok = AutoTokenizer.from_pretrained(cfg["model"])
tok.chat_template = FAMILIES["smollm2"].text()  # what the swarmpool side renders
kwargs = None
if cfg["prefill"]:
    tok.chat_template = prefill_template(tok.chat_template)
    kwargs = {"first_call_prefill": FIRST_CALL_PREFILL}
tok.response_template = qwen3_template  # hermes <tool_call> JSON; TRL would attach it to qwen2_5_chat_template
rows = [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p["question"]}],
         "answer": p["answer"]}
        for p in (make_calc_problem(s, "train") for s in range(cfg["prompts"] * cfg["updates"] * 2))]
episodes, examples = [], []

def reward(completions, answer, **_):
    parts = [score_completion(c, a) for c, a in zip(completions, answer)]
    episodes.extend(parts)
    examples.extend(c for c in completions[:max(0, 4 - len(examples))])
    return [p["reward"] for p in parts]

class Times(TrainerCallback):
    def __init__(self): self.begin, self.times = None, []
    def on_step_begin(self, args, state, control, **kw): self.begin = self.begin or time.time()
    def on_step_end(self, args, state, control, **kw): self.times.append(time.time())

total = cfg["max_turns"] * cfg["max_tokens"] + (cfg["max_turns"] - 1) * cfg["tool_tokens"]
micro = cfg["micro_batch"] or cfg["prompts"] * cfg["group"]  # one generation batch, one optimizer step either way
args = GRPOConfig(output_dir=cfg["out"], per_device_train_batch_size=micro,
                  gradient_accumulation_steps=cfg["prompts"] * cfg["group"] // micro,
                  num_generations=cfg["group"], max_completion_length=total,
                  generation_kwargs={"max_new_tokens": cfg["max_tokens"]}, max_tool_calling_iterations=cfg["max_turns"] - 1,
                  temperature=cfg["temperature"], top_p=1.0, top_k=0, learning_rate=cfg["lr"],
                  lr_scheduler_type="constant", warmup_steps=0, beta=0.0, epsilon=0.2, max_steps=cfg["updates"],
                  logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0, max_grad_norm=1.0,
                  weight_decay=0.0, disable_tqdm=True, dataloader_num_workers=0, bf16=False,
                  gradient_checkpointing=False, chat_template_kwargs=kwargs)
times = Times()
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                      processing_class=tok, tools=[calculator], callbacks=[times],
                      peft_config=LoraConfig(r=cfg["rank"], lora_alpha=cfg["alpha"], target_modules=cfg["targets"],
                                             lora_dropout=0.0, task_type="CAUSAL_LM"))
assert trainer.chat_template is None, "TRL swapped the chat template"  # ours is prefix-preserving: kept as is
trainer.train()
trainer.model.save_pretrained(cfg["out"] + "/adapter")
logs = trainer.state.log_history
n = len(episodes)
extra = {"tool_call_rate": sum(e["tool_calls"] > 0 for e in episodes) / max(n, 1),
         "tool_ok_rate": sum(e["tool_ok"] > 0 for e in episodes) / max(n, 1),
         "correct": sum(e["correct"] for e in episodes) / max(n, 1),
         "turns": sum(e["turns"] for e in episodes) / max(n, 1), "episodes": n, "examples": examples,
         "call_frequency": [h["tools/call_frequency"] for h in logs if "tools/call_frequency" in h]}
with open(cfg["out"] + "/tools.json", "w") as f:
    json.dump(extra, f)
# one update has no span between step ends: measure it from its step's start
span = times.times if len(times.times) > 1 else [times.begin] + times.times
print("TRL_RESULT " + json.dumps({"rewards": [h["reward"] for h in logs if "reward" in h], "times": span}), flush=True)
'''


def run_trl_tools(model: str, updates: int, lr: float, tmp: Path, *, prompts: int = 4, group: int = 8,
                  max_tokens: int = 48, max_turns: int = 4, rank: int = 16, alpha: int = 32,
                  targets: list[str] | None = None, temperature: float = 1.0,
                  prefill_first_call: bool = False, micro_batch: int | None = MICRO_BATCH) -> dict[str, Any]:
    """TRL's GRPOTrainer with its tool loop on ``calc`` problems: per-step mean rewards, s and CPU-s per update
    (over the span of step ends; one update: its own step), the saved adapter, the tool-call rate, the setup line.

    ``prefill_first_call``: every first turn opens with :data:`FIRST_CALL_PREFILL` (the module docstring says why).
    ``micro_batch``: sequences per forward/backward (gradient accumulation up to ``prompts * group``; None: all)."""
    micro_batch = min(micro_batch or prompts * group, prompts * group)
    if (prompts * group) % micro_batch:
        raise ValueError(f"micro_batch {micro_batch} must divide prompts x group = {prompts * group}")
    out = tmp / "trl_tools"
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"model": model, "updates": updates, "lr": lr, "prompts": prompts, "group": group, "max_tokens": max_tokens,
           "max_turns": max_turns, "rank": rank, "alpha": alpha, "targets": targets or TARGETS,
           "temperature": temperature, "tool_tokens": TOOL_RESULT_TOKENS, "out": str(out), "prefill": prefill_first_call,
           "micro_batch": micro_batch,
           "bench_dir": str(Path(__file__).resolve().parent)}
    res = run_trl_script(TRL_TOOLS_SCRIPT, cfg, tmp)
    extra = json.loads((out / "tools.json").read_text())
    return {"rewards": res["rewards"], "wall": res["wall"], "cpu": res["cpu"], "adapter": str(out / "adapter"),
            "tool_call_rate": extra["tool_call_rate"],
            "setup": SETUP.format("prefilled call opening" if prefill_first_call else "the model's choice (no forcing)"),
            **{k: extra[k] for k in ("tool_ok_rate", "correct", "turns", "episodes", "call_frequency", "examples")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--prefill-first-call", action="store_true", help="open every first turn with a calculator call")
    args = ap.parse_args()
    from swarm.policy.gguf import ensure_gguf_model

    model = str(ensure_gguf_model("smollm2"))
    with tempfile.TemporaryDirectory() as d:
        res = run_trl_tools(model, args.updates, args.lr, Path(d), prompts=args.prompts, group=args.group,
                            max_tokens=args.max_tokens, max_turns=args.max_turns,
                            prefill_first_call=args.prefill_first_call)
    print(res["setup"])
    print(f"trl tools: rewards {[round(r, 3) for r in res['rewards']]}, tool-call rate {res['tool_call_rate']:.2f} "
          f"(well-formed {res['tool_ok_rate']:.2f}), correct {res['correct']:.2f}, {res['turns']:.2f} turns/episode, "
          f"{res['wall']:.1f} s/update, {res['cpu']:.1f} CPU-s/update")


if __name__ == "__main__":
    main()
