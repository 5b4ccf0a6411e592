"""The tiny offline model: a small Llama-type causal LM and a locally trained tokenizer.

:func:`ensure_tiny_model` builds, deterministically from a seed, a ~1 M-parameter Llama-type
model (hidden 128, 4 layers, init std 0.08) and a byte-level BPE tokenizer (vocab 1024)
trained with ``tokenizers`` on a fixed built-in synthetic corpus (English-ish words, digits,
JSON punctuation, tool-call syntax). The tokenizer carries ChatML special tokens and a chat
template with tools (``templates/tiny_chatml.jinja``). The result is a normal Hugging Face
checkpoint folder, cached under ``<cache_dir>/<name>-<config hash>`` and reused when present.

The same bytes on every machine: the initial weights come from integer random streams
(:func:`exact_normal_`), not from torch's float RNG kernels (whose rounding differs between CPU
instruction sets), so a model without warm-up is bit-identical everywhere. A warm-up trains with
floats and is not; the warm-ups the tests and CPU defaults use therefore ship as checkpoints
(``swarm/policy/shipped.py``), installed into the cache and checked by sha256 instead of built.

Only the model weights depend on ``seed``; the tokenizer is the same for every seed, so models
built with different seeds can play against each other. It does not download anything, and it
does not train the model: a random model produces gibberish. A supervised warm-up (e.g. for the
default RL task) plugs in through the ``warmup`` hook, which is part of the cache key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["TinySpec", "ensure_tiny_model", "ensure_family_model", "default_cache_dir", "TEMPLATES_DIR", "load_template",
           "SPECIAL_TOKENS", "exact_normal_", "tiny_key", "warmup_key_of"]

log = logging.getLogger(__name__)
TEMPLATES_DIR = Path(__file__).parent / "templates"
# ids 0..4, in this order: the first three are special (skipped by skip_special_tokens), the
# tool-call markers are ordinary added tokens (kept in decoded text, as Qwen2.5 does).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
_CORPUS_VERSION = 1  # bump when the corpus or tokenizer recipe changes (part of the cache key)
_INIT = "exact-v1"  # how the initial weights are drawn (exact_normal_); part of the cache key
STALE_BUILD_S = 6 * 3600  # a build takes minutes; a .build-* folder this old was left by a killed process

Warmup = Callable[["PreTrainedModel", "PreTrainedTokenizerBase"], object]  # trains the model in place


@dataclass(frozen=True)
class TinySpec:
    """Architecture of the tiny model; every field is part of the cache key."""

    vocab_size: int = 1024  # trained BPE vocab incl. the 5 added tokens
    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    initializer_range: float = 0.08  # 0.02 learns ~5x slower at this width (ENVIRONMENT.md)
    rope_theta: float = 10000.0


def _sweep_stale_builds(cache: Path) -> None:
    """Remove ``.build-*`` folders older than :data:`STALE_BUILD_S`: a build killed hard (SIGKILL, a
    second Ctrl-C) cannot clean up after itself; a build in progress is younger and stays."""
    cutoff = time.time() - STALE_BUILD_S
    for p in cache.glob(".build-*"):
        try:
            if p.stat().st_mtime < cutoff:
                shutil.rmtree(p, ignore_errors=True)
        except FileNotFoundError:  # another process swept it first
            continue


def default_cache_dir() -> Path:
    """``$SWARM_CACHE`` or ``~/.cache/swarmpool``, plus ``models/``."""
    root = os.environ.get("SWARM_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "swarmpool") / "models"


def load_template(name: str) -> str:
    """A chat template shipped in ``swarm/policy/templates``: a file stem or a family name (``llama3``, ...)."""
    from swarm.policy.templates import FAMILIES

    if name in FAMILIES:
        return FAMILIES[name].text()
    return (TEMPLATES_DIR / f"{name.removesuffix('.jinja')}.jinja").read_text()


def ensure_tiny_model(
    cache_dir: Path | str | None = None,
    seed: int = 0,
    spec: TinySpec | None = None,
    warmup: Warmup | None = None,
    warmup_key: str | None = None,
    rebuild: bool = False,
) -> Path:
    """Path of the tiny checkpoint for ``seed``: the shipped one when it ships, else built and cached if absent.

    ``warmup(model, tokenizer)`` may train the freshly initialised model before it is saved;
    ``warmup_key`` (default: the function's ``cache_key`` attribute, else its qualified name) goes
    into the cache key, so change it whenever the warm-up changes. A checkpoint that ships
    (``swarm/policy/shipped.py``) is copied into the cache and checked by sha256, never built, unless
    ``rebuild`` (how the shipped ones are made, and checked against a fresh build). The folder is
    written to a temporary directory and renamed into place, so a concurrent or interrupted build
    never leaves a half-written checkpoint.
    """
    from swarm.policy import shipped

    spec = spec or TinySpec()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if warmup is not None and warmup_key is None:
        warmup_key = warmup_key_of(warmup)
    key = tiny_key(spec, seed, warmup_key)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    final = cache / f"tiny-llama-s{seed}-{digest}"
    if not rebuild and shipped.shipped_entry(final.name) is not None:
        return shipped.install(final.name, cache)
    if (final / "config.json").exists() and not rebuild:
        return final
    cache.mkdir(parents=True, exist_ok=True)
    _sweep_stale_builds(cache)
    if warmup is not None:  # minutes for some warm-ups: say what the wait is for
        log.warning("building the tiny model with warm-up %s (once; cached as %s)", warmup_key, final)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        t0 = time.perf_counter()
        tokenizer = build_tokenizer(spec.vocab_size)
        model = build_model(spec, tokenizer, seed)
        if warmup is not None:
            warmup(model, tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "swarm_tiny.json").write_text(
            json.dumps({**key, "build_s": round(time.perf_counter() - t0, 2)}, indent=1, sort_keys=True)
        )
        if rebuild and final.exists():
            shutil.rmtree(final)
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first: keep theirs
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def warmup_key_of(warmup: Warmup) -> str:
    """A warm-up's default cache key: its ``cache_key`` attribute, else its qualified name."""
    return getattr(warmup, "cache_key", None) or f"{warmup.__module__}.{warmup.__qualname__}"


def tiny_key(spec: TinySpec, seed: int, warmup_key: str | None) -> dict[str, object]:
    """What a tiny checkpoint is a function of: its cache key (hashed into the folder name)."""
    return {"spec": asdict(spec), "seed": seed, "corpus": _CORPUS_VERSION, "init": _INIT, "warmup": warmup_key}


def exact_normal_(t: torch.Tensor, key: str, std: float) -> None:
    """Fill ``t`` in place with bell-shaped noise of standard deviation ``std``, the same bits on every machine.

    Each value is the centred sum of four uniform 20-bit integers from Python's Mersenne Twister seeded
    with ``key`` (an Irwin-Hall(4) draw: near-normal, bounded at 3.46 std), exact in float32, times one
    float32 scale: integer steps and one correctly rounded multiply, so no CPU's vector kernels or
    transcendental approximations enter (torch's ``normal_`` gives other bits under ``ATEN_CPU_CAPABILITY=default``).
    """
    import numpy as np
    import torch

    n = t.numel()
    raw = np.frombuffer(random.Random(key).randbytes(16 * n), dtype="<u4").reshape(4, n) >> np.uint32(12)
    ints = 2 * raw.astype(np.int64).sum(axis=0) - 4 * (2**20 - 1)  # odd integers in (-2^22, 2^22), mean 0
    # each 20-bit uniform has variance (2^40 - 1) / 12, so 2 * (sum of four) has std ~ 2^21 / sqrt(3)
    vals = ints.astype(np.float32) * np.float32(std * math.sqrt(3) / 2**21)
    with torch.no_grad():
        t.copy_(torch.from_numpy(vals).view(t.shape))


def ensure_family_model(family: str, seed: int = 0, cache_dir: Path | str | None = None) -> Path:
    """The tiny model speaking chat-template ``family`` (``llama3``, ``qwen3``, ``mistral``, ...).

    A copy of :func:`ensure_tiny_model` whose tokenizer has the family's control tokens as
    special tokens (single ids; the embedding matrix grows by one random row each), the family's
    template as its chat template, and the family's end-of-turn token as its eos token (in the
    generation config too). For testing a family's chat format end to end without a download.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarm.policy.templates import get_family

    fam = get_family(family)
    src = ensure_tiny_model(cache_dir, seed=seed)
    final = src.with_name(f"{src.name}-{fam.name}-{_CORPUS_VERSION}")
    if (final / "config.json").exists():
        return final
    _sweep_stale_builds(src.parent)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=src.parent))
    try:
        tok = AutoTokenizer.from_pretrained(src)
        new = [t for t in fam.special_tokens if t not in tok.get_vocab()]
        tok.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
        tok.eos_token = fam.end_of_turn
        tok.chat_template = fam.text()
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        old = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(len(tok), mean_resizing=False)
        rows = model.get_input_embeddings().weight[old:]  # tied: the output rows too
        exact_normal_(rows, f"family:{fam.name}:{seed}", model.config.initializer_range)
        eos = tok.convert_tokens_to_ids(fam.end_of_turn)
        model.config.eos_token_id = eos
        model.generation_config.eos_token_id = [eos, tok.pad_token_id]
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def build_tokenizer(vocab_size: int = 1024):
    """A ``PreTrainedTokenizerFast``: byte-level BPE trained on :func:`synthetic_corpus`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[AddedToken(t, special=i < 3, normalized=False) for i, t in enumerate(SPECIAL_TOKENS)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        padding_side="left",  # must be a constructor argument to be saved (ENVIRONMENT.md)
        clean_up_tokenization_spaces=False,
        model_max_length=TinySpec.max_position_embeddings,
        chat_template=load_template("tiny_chatml"),
    )


def build_model(spec: TinySpec, tokenizer, seed: int):
    """A randomly initialised ``LlamaForCausalLM``, identical for identical (spec, seed)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
                         intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
                         num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
                         max_position_embeddings=spec.max_position_embeddings, initializer_range=spec.initializer_range,
                         rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos, pad_token_id=pad)
    model = LlamaForCausalLM(config).float().eval()
    for name, p in model.named_parameters():  # tied embeddings are listed once
        if p.dim() == 2:  # linear and embedding weights; the norms' ones stay
            exact_normal_(p, f"tiny:{seed}:{name}", spec.initializer_range)
    with torch.no_grad():
        model.get_input_embeddings().weight[pad].zero_()  # as transformers' init does for the padding row
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=None)
    return model


# ---------------------------------------------------------------------------------------------
# The synthetic corpus: fixed (its own seed), so the tokenizer never depends on the model seed.

_WORDS = (
    "the a an and or but if then else when while for to of in on at by with from up down out over "
    "under is are was were be been being have has had do does did can could will would should may "
    "might must say said tell ask answer reply repeat echo word words number numbers list item "
    "name value key true false null none yes no ok done error result results call function tool "
    "tools user assistant system message content text query search find get set add sum total "
    "count move play vote kill save guess check weather city time date day night today tomorrow "
    "player players game round turn wolf wolves villager seer doctor witch hunter town people "
    "red green blue black white apple banana cherry grape lemon mango orange peach pear plum "
    "cat dog bird fish horse mouse lion tiger bear wolf fox owl one two three four five six seven "
    "eight nine ten hundred thousand math problem solve step steps think thought final please "
    "thanks hello hi good bad new old big small first last next previous left right north south "
    "east west open close start stop begin end run read write file path data json api request "
    "response status score reward agent agents train policy model token tokens sample batch"
).split()
_TOOLS = ("get_weather", "search", "calculator", "lookup", "vote", "move", "read_file", "say")
_ARGS = ("city", "query", "expression", "key", "target", "direction", "path", "text")


def synthetic_corpus(lines: int = 4000) -> Iterator[str]:
    """Deterministic English-ish lines, numbers, JSON objects and ChatML/tool-call snippets."""
    rng = random.Random(1234)

    def words(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(k))

    def number() -> str:
        return rng.choice([str(rng.randint(0, 9)), str(rng.randint(10, 999)), f"{rng.uniform(-100, 100):.2f}"])

    for i in range(lines):
        kind = i % 6
        if kind == 0:
            s = words(rng.randint(3, 14))
            yield (s[0].upper() + s[1:] + rng.choice([".", "?", "!", ":", ","])) if s else s
        elif kind == 1:
            yield f"{number()} {rng.choice('+-*/=')} {number()} = {number()}"
        elif kind == 2:
            obj = {rng.choice(_ARGS): rng.choice([words(2), int(number().split(".")[0]), True, None])}
            yield json.dumps({"name": rng.choice(_TOOLS), "arguments": obj})
        elif kind == 3:
            args = json.dumps({rng.choice(_ARGS): words(rng.randint(1, 3))})
            yield f'<|im_start|>assistant\n<tool_call>\n{{"name": "{rng.choice(_TOOLS)}", "arguments": {args}}}\n</tool_call><|im_end|>\n'
        elif kind == 4:
            role = rng.choice(["system", "user", "assistant", "tool"])
            yield f"<|im_start|>{role}\n{words(rng.randint(1, 10))}<|im_end|>\n"
        else:
            yield json.dumps([rng.randint(0, 100) for _ in range(rng.randint(1, 6))]) + " " + words(3).title()
