"""The batched decode loop of the ``hf`` backend: one forward pass per token for a whole batch.

Rows (one per sample) are left-padded into one batch with an attention mask and per-row position
ids, prefilled once, then decoded one token per step with the KV cache. Each row samples with its
own temperature, top_p and seeded ``torch.Generator``, so a row's tokens do not depend on what
else is in the batch (up to float rounding of the batched matmuls). Text is decoded incrementally:
a row only emits text that can no longer change (no trailing partial UTF-8 character, no suffix
that could still grow into a stop string), so the streamed pieces always concatenate to the final
text. A row with a grammar (``Row.mask``, ``swarm.policy.constraint``) samples from its logits with
the disallowed tokens at ``-inf``, and records the logprob under that masked distribution.

Runs in the backend's worker thread; knows nothing of asyncio, queues or adapters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from swarm.policy.base import SamplingParams
from swarm.policy.sampling import processed_logprobs, sample_from

__all__ = ["Row", "decode_batch"]


@dataclass
class Row:
    """One sample being generated."""

    index: int  # sample index within its request (0..n-1)
    prompt_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator
    owner: Any = None  # the request job this row belongs to
    mask: Any = None  # a constraint.TokenMask: the grammar this row's reply must follow
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # when sampling.top_logprobs > 0
    text: str = ""  # current full text (without eos, cut at a stop string)
    emitted: str = ""  # text already handed out as deltas
    finish_reason: str | None = None
    cancelled: bool = False

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.cancelled


def _stable_text(row: Row) -> str:
    """The part of ``row.text`` that further tokens cannot change."""
    text = row.text
    if row.finish_reason is not None:
        return text
    text = text.rstrip("\ufffd")  # a partial multi-byte character may still complete
    for stop in row.sampling.stop:  # hold back a suffix that may become a stop string
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                text = text[:-k]
                break
    return text


def _update_text(row: Row, tokenizer: Any, eos_ids: set[int]) -> str:
    """Recompute the row's text after a new token; returns the new stable piece to emit."""
    ids = row.ids[:-1] if row.ids and row.ids[-1] in eos_ids else row.ids
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if row.sampling.stop:
        hits = [i for i in (text.find(s) for s in row.sampling.stop if s) if i >= 0]
        if hits:
            text = text[: min(hits)]
            row.finish_reason = "stop"
    row.text = text
    stable = _stable_text(row)
    if not stable.startswith(row.emitted):  # cannot happen with byte-level BPE; never emit twice
        return ""
    delta = stable[len(row.emitted) :]
    row.emitted = stable
    return delta


def _masked(logits: torch.Tensor, mask: Any) -> torch.Tensor:
    """Logits with the tokens the grammar forbids next at ``-inf``."""
    allowed = mask.allowed()
    if not bool(allowed.any()):
        raise RuntimeError("the grammar allows no next token")
    return logits.masked_fill(~allowed, float("-inf"))


def _top(logp: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of a processed distribution (never one it cannot sample)."""
    vals, idx = logp.topk(min(k, logp.numel()))
    return [(int(i), float(v)) for v, i in zip(vals.tolist(), idx.tolist(), strict=True) if v > float("-inf")]


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.inference_mode()
def decode_batch(
    model: Any,
    tokenizer: Any,
    rows: list[Row],
    *,
    pad_id: int,
    eos_ids: set[int],
    device: torch.device,
    on_token: Callable[[Row, int, float, str], None],
    on_finish: Callable[[Row], None],
) -> None:
    """Generate every row to completion, calling ``on_token`` per sampled token and ``on_finish`` per row."""
    batch = len(rows)
    width = max(len(r.prompt_ids) for r in rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        mask[b, width - len(r.prompt_ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    input_ids, mask, positions = input_ids.to(device), mask.to(device), positions.to(device)
    next_pos = torch.tensor([len(r.prompt_ids) for r in rows], device=device)

    # transformers >= 5.2x renamed past_key_values to cache (the old name still works, with a warning)
    params = inspect.signature(model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward)
    cache_kw = "cache" if "cache" in params.parameters else "past_key_values"
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    past = _cache_of(out)
    steps = max(r.sampling.max_tokens for r in rows)
    for step in range(steps):
        logits = out.logits[:, -1, :].float().cpu()
        chosen = [pad_id] * batch
        for b, r in enumerate(rows):
            if r.done:
                continue
            s = r.sampling
            row_logits = logits[b] if r.mask is None else _masked(logits[b], r.mask)
            logp = processed_logprobs(row_logits, s.temperature, s.top_p)
            tok = sample_from(logp, s.temperature, r.generator)
            if r.mask is not None and not r.mask.accept(tok):
                raise RuntimeError(f"sampled token {tok} outside the grammar's mask")
            chosen[b] = tok
            r.ids.append(tok)
            r.logprobs.append(float(logp[tok]))
            if s.top_logprobs > 0:
                r.top.append(_top(logp, s.top_logprobs))
            if tok in eos_ids:
                r.finish_reason = "stop"
            delta = _update_text(r, tokenizer, eos_ids)  # may set finish_reason on a stop string
            if r.finish_reason is None and len(r.ids) >= s.max_tokens:
                r.finish_reason = "length"
                delta += _update_text(r, tokenizer, eos_ids)  # flush held-back text
            on_token(r, tok, r.logprobs[-1], delta)
            if r.finish_reason is not None:
                on_finish(r)
        if all(r.done for r in rows) or step == steps - 1:
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=1)
        out = model(
            input_ids=torch.tensor(chosen, device=device).unsqueeze(1),
            attention_mask=mask,
            position_ids=next_pos.unsqueeze(1),
            use_cache=True,
            **{cache_kw: past},
        )
        past = _cache_of(out)
        next_pos = next_pos + 1
