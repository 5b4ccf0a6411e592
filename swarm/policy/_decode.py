"""The batched decode loop of the ``hf`` backend: one forward pass per token for a whole batch.

Rows (one per sample) are left-padded into one batch with an attention mask and per-row position
ids, prefilled once, then decoded one token per step with the KV cache. Sampling stays on the
device and runs on the whole batch at once (``sampling.py``): grammar masks, temperature, top-k
and top-p as ``(B, V)`` tensor operations, each row with its own parameters, and one counter-based
uniform number per row and step, so a seeded row's tokens do not depend on what else is in the
batch (up to float rounding of the batched matmuls). Only the chosen ids, their logprobs, the
asked top logprobs and a grammar check cross to the host, as one small tensor per step.

A row with a grammar (``Row.mask``, ``swarm.policy.constraint``) fills its row of a packed
bitmask on the host (xgrammar); the bitmask (``V / 32`` int32 per row) goes to the device and
sets the disallowed logits to ``-inf`` before the distribution is computed, so the recorded
logprob is that of the masked distribution. Text is decoded incrementally for rows that stream
or have stop strings: a row only emits text that can no longer change (no trailing partial UTF-8
character, no suffix that could still grow into a stop string), so the streamed pieces always
concatenate to the final text; other rows decode their text once, when they finish.

Runs in the backend's worker thread; knows nothing of asyncio, queues or adapters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from swarm.policy import _batch_cache
from swarm.policy.base import SamplingParams
from swarm.policy.sampling import BatchParams, batch_logprobs, sample, uniforms_at

__all__ = ["Row", "Sampler", "cache_kwarg", "decode_batch", "prefill", "record_step"]


@dataclass(eq=False)  # identity: rows are compared by `in` and `remove`, and two seeded twins are still two rows
class Row:
    """One sample being generated."""

    index: int  # sample index within its request (0..n-1)
    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int = 0  # with index and step, the only input of this row's random numbers
    owner: Any = None  # the request job this row belongs to
    mask: Any = None  # a constraint.TokenMask: the grammar this row's reply must follow
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # when sampling.top_logprobs > 0
    text: str = ""  # current full text (without eos, cut at a stop string)
    emitted: str = ""  # text already handed out as deltas
    finish_reason: str | None = None
    cancelled: bool = False
    stream: bool = True  # text is wanted token by token (else decoded once at the end, unless stop strings)

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


def _unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's packed int32 bitmask ``(B, ceil(V/32))`` -> bool ``(B, V)``, on the bitmask's device."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(bitmask.shape[0], -1)[:, :vocab].bool()


class Sampler:
    """A batch's sampling state on the device: parameters, random numbers and the grammar bitmask."""

    def __init__(self, rows: list[Row], device: torch.device) -> None:
        s = [r.sampling for r in rows]
        self.rows = rows
        self.device = device
        self.params = BatchParams.of([x.temperature for x in s], [x.top_p for x in s],
                                     [x.top_k for x in s], device=device)
        self.seeds, self.indices = [r.seed for r in rows], [r.index for r in rows]
        self.top_k = max(x.top_logprobs for x in s)
        self.masked = [b for b, r in enumerate(rows) if r.mask is not None]
        self.bitmask = None
        if self.masked:
            import xgrammar as xgr

            self.bitmask = xgr.allocate_token_bitmask(len(rows), rows[self.masked[0]].mask.vocab)

    def step(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[list[float]]]:
        """The chosen ids on the device, and per row ``[id, logprob, grammar-ok, top values..., top ids...]``
        on the host (one transfer)."""
        logits = logits.float()
        ok = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
        if self.bitmask is not None:
            self.bitmask.fill_(-1)
            for b in self.masked:
                if not self.rows[b].done:
                    self.rows[b].mask.fill(self.bitmask, b)
            allowed = _unpack(self.bitmask.to(logits.device, non_blocking=True), logits.shape[-1])
            ok = allowed.any(dim=-1)
            logits = logits.masked_fill(~allowed, float("-inf"))
        logp = batch_logprobs(logits, self.params)
        u = uniforms_at(self.seeds, self.indices, [len(r.ids) for r in self.rows])  # each row's own step
        ids = sample(logp, u.to(self.device, non_blocking=True), self.params)
        parts = [ids.double()[:, None], logp.gather(-1, ids[:, None]).double(), ok.double()[:, None]]
        if self.top_k:
            vals, idx = logp.topk(min(self.top_k, logp.shape[-1]), dim=-1)
            parts += [vals.double(), idx.double()]
        return ids, torch.cat(parts, dim=-1).cpu().tolist()


def cache_kwarg(model: Any) -> str:
    """The forward's name for the KV cache: transformers >= 5.2x renamed ``past_key_values`` to ``cache``."""
    params = inspect.signature(model.get_base_model().forward if hasattr(model, "get_base_model") else model.forward)
    return "cache" if "cache" in params.parameters else "past_key_values"


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.inference_mode()
def prefill(model: Any, extra: dict[str, Any], rows: list[Row], pad_id: int,
             device: torch.device) -> tuple[Any, Any, torch.Tensor]:
    """One forward pass over the rows' left-padded prompts: (last-position logits, cache, attention mask)."""
    batch, width = len(rows), max(len(r.prompt_ids) for r in rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        mask[b, width - len(r.prompt_ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    input_ids, mask, positions = input_ids.to(device), mask.to(device), positions.to(device)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                **extra)
    return out.logits[:, -1, :], _cache_of(out), mask


def _finish_token(r: Row, tok: int, lp: float, result: list[float], top_k: int, tokenizer: Any,
                  eos_ids: set[int]) -> str:
    """Record one sampled token on its row (ids, logprob, top logprobs, finish); returns the text to emit."""
    s = r.sampling
    if not result[2]:
        raise RuntimeError("the grammar allows no next token")
    if r.mask is not None and not r.mask.accept(tok):
        raise RuntimeError(f"sampled token {tok} outside the grammar's mask")
    r.ids.append(tok)
    r.logprobs.append(lp)
    if s.top_logprobs > 0:
        pairs = zip(result[3 + top_k : 3 + top_k + s.top_logprobs], result[3 : 3 + s.top_logprobs], strict=True)
        r.top.append([(int(i), v) for i, v in pairs if v > float("-inf")])
    if tok in eos_ids:
        r.finish_reason = "stop"
    delta = ""
    if r.stream or s.stop:
        delta = _update_text(r, tokenizer, eos_ids)  # may set finish_reason on a stop string
    if r.finish_reason is None and len(r.ids) >= s.max_tokens:
        r.finish_reason = "length"
    if r.finish_reason is not None:
        delta += _update_text(r, tokenizer, eos_ids)  # the final text; flush held-back text
    return delta


def record_step(rows: list[Row], results: list[list[float]], top_k: int, tokenizer: Any, eos_ids: set[int],
                on_token: Callable[[Row, int, float, str], None], on_finish: Callable[[Row], None]) -> None:
    """Record one step's sampled token on every live row (``results[b]`` from :meth:`Sampler.step`)."""
    for b, r in enumerate(rows):
        if r.done:  # cancelled by its caller
            continue
        tok, lp = int(results[b][0]), results[b][1]
        delta = _finish_token(r, tok, lp, results[b], top_k, tokenizer, eos_ids)
        on_token(r, tok, lp, delta)
        if r.finish_reason is not None:
            on_finish(r)


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
    admit: Callable[[int], list[Row]] | None = None,
    max_rows: int | None = None,
    weights: Callable[[list[Row]], tuple[Any, dict[str, Any]]] | None = None,
) -> None:
    """Generate every row to completion, calling ``on_token`` per sampled token and ``on_finish`` per row.

    Continuous batching: a finished row leaves the batch at once; ``admit(free)`` is asked between
    steps for up to ``free`` new rows (``max_rows`` in all), which are prefilled and join the next step.
    ``weights(rows)`` is called before every forward over ``rows``: it selects their weights and
    returns the model to run and extra forward kwargs (a merged sampling copy for one policy, or
    ``model`` with peft's per-row ``adapter_names`` when policies mix); the KV cache carries over.
    """
    max_rows = max_rows or len(rows)
    weights = weights or (lambda _rows: (model, {}))
    cache_kw = cache_kwarg(model)
    logits, past, mask = prefill(*weights(rows), rows, pad_id, device)
    valid = [len(r.prompt_ids) for r in rows]  # KV positions each row attends to (its next position id)
    next_pos = torch.tensor(valid, device=device)
    sampler = Sampler(rows, device)
    while rows:
        chosen, results = sampler.step(logits)
        record_step(rows, results, sampler.top_k, tokenizer, eos_ids, on_token, on_finish)
        keep = [b for b, r in enumerate(rows) if not r.done]
        if len(keep) < len(rows):  # finished rows leave now
            rows, valid = [rows[b] for b in keep], [valid[b] for b in keep]
            if keep:
                index = torch.tensor(keep, device=device)
                _batch_cache.select_rows(past, index)
                mask, next_pos, chosen = mask[index], next_pos[index], chosen[index]
                unused = mask.shape[1] - max(valid)  # leading columns only finished rows used
                if unused > 0:
                    _batch_cache.trim_left(past, unused)
                    mask = mask[:, unused:]
        if rows:
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=device)], dim=1)
            step_model, extra = weights(rows)
            out = step_model(input_ids=chosen.unsqueeze(1), attention_mask=mask, position_ids=next_pos.unsqueeze(1),
                             use_cache=True, **{cache_kw: past}, **extra)
            logits, past = out.logits[:, -1, :], _cache_of(out)
            next_pos, valid = next_pos + 1, [v + 1 for v in valid]
        # an emptied batch ends here: the worker's next batch collects what waits (and other policies get a turn)
        room = admit is not None and 0 < len(rows) < max_rows and _batch_cache.mergeable(past)
        joined = admit(max_rows - len(rows)) if room else []
        if joined:
            new_logits, new_past, new_mask = prefill(*weights(joined), joined, pad_id, device)
            new_valid = [len(r.prompt_ids) for r in joined]
            mask = _batch_cache.merge(past, mask, new_past, new_mask)
            logits = torch.cat([logits, new_logits], dim=0)
            next_pos = torch.cat([next_pos, torch.tensor(new_valid, device=device)])
            rows, valid = rows + joined, valid + new_valid
        if rows and (joined or len(keep) < len(sampler.rows)):
            sampler = Sampler(rows, device)  # the batch changed: its parameters, seeds and bitmask rows
