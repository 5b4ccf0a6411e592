"""The ``hf`` backend's decode loop on a static KV cache of fixed slots: one shape for every step, so CUDA graphs apply.

Same contract as :func:`swarm.policy._decode.decode_batch` (rows sampled on the device with
per-row counter-based randomness, grammar masks, rows leaving at once and joining between
steps), but the decode step always runs the full ``[slots, 1]`` batch against a
:class:`~swarm.policy._slots.SlotCache` with a 4D mask: inactive slots compute a throwaway token.
A fixed shape is what lets ``torch.compile(mode="reduce-overhead")`` capture the step once as a
CUDA graph (``step_fn``); on a CPU the eager step is the same computation (the tests' reference).

Prefill stays eager and dynamic (one left-padded forward per admission, as in ``_decode``); each
prefilled row is copied into a free slot right-aligned before the shared write column; a row
whose prompt is longer than the columns before it waits (pending) until the column reaches its
length or the batch drains; no new row is admitted meanwhile, so it cannot wait forever. When the
write column reaches the end, the slots shift left by the leading columns no row uses
(:meth:`SlotCache.compact`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from swarm.policy._decode import Row, Sampler, cache_kwarg, prefill, record_step
from swarm.policy._slots import SlotCache

__all__ = ["decode_static"]


@torch.inference_mode()
def decode_static(
    model: Any,
    tokenizer: Any,
    rows: list[Row],
    *,
    slots: SlotCache,
    pad_id: int,
    eos_ids: set[int],
    device: torch.device,
    on_token: Callable[[Row, int, float, str], None],
    on_finish: Callable[[Row], None],
    admit: Callable[[int], list[Row]] | None = None,
    weights: Callable[[list[Row]], tuple[Any, dict[str, Any]]] | None = None,
    step_fn: Callable[[Any], Callable[..., Any]] | None = None,
) -> None:
    """Generate every row to completion on ``slots`` (at most ``slots.slots`` rows at once).

    ``weights(rows)`` gives the model and extra kwargs for a forward over ``rows`` (as in
    ``decode_batch``; a decode step passes one row per slot); ``step_fn(model)`` the callable that runs
    a decode step of that model (a compiled one on CUDA; the model itself by default). Extra kwargs
    (mixed policies) run eagerly.
    """
    weights = weights or (lambda _rows: (model, {}))
    step_fn = step_fn or (lambda m: m)
    cache_kw = cache_kwarg(model)
    active: list[Row] = []
    slot_of: list[int] = []
    free = list(range(slots.slots - 1, -1, -1))
    pos = torch.zeros(slots.slots, dtype=torch.long, device=device)
    pending: list[Row] = []

    def place(new: list[Row]) -> torch.Tensor:
        """Prefill ``new`` and put each row in a free slot; their last-position logits."""
        m, extra = weights(new)
        logits, dyn, _ = prefill(m, extra, new, pad_id, device)
        layers = list(dyn.layers)
        for j, r in enumerate(new):
            p, s = len(r.prompt_ids), free.pop()
            slots.place(s, [x.keys[j, :, -p:] for x in layers], [x.values[j, :, -p:] for x in layers])
            pos[s] = p
            active.append(r)
            slot_of.append(s)
        return logits

    slots.reset(start=max(len(r.prompt_ids) for r in rows))
    logits = place(rows)
    sampler = Sampler(active, device)
    while active:
        chosen, results = sampler.step(logits)
        record_step(active, results, sampler.top_k, tokenizer, eos_ids, on_token, on_finish)
        done = [r.done for r in active]  # read once: a caller may cancel its row from another thread meanwhile
        keep = [b for b, d in enumerate(done) if not d]
        changed = len(keep) < len(active)
        for b, d in enumerate(done):
            if d:
                slots.free(slot_of[b])
                free.append(slot_of[b])
        active[:], slot_of[:] = [active[b] for b in keep], [slot_of[b] for b in keep]
        if active:
            chosen = chosen[torch.tensor(keep, device=device)] if changed else chosen
            if slots.col >= slots.length:  # shifts > 0: a live row that began at column 0 would need
                slots.compact()  # more than length columns, and the backend refuses prompt + max_tokens > length
            index = torch.tensor(slot_of, device=device)
            input_ids = torch.full((slots.slots, 1), pad_id, dtype=torch.long, device=device)
            input_ids[index, 0] = chosen
            positions = torch.zeros((slots.slots, 1), dtype=torch.long, device=device)
            positions[index, 0] = pos[index]
            mask = slots.step_mask(index)
            by_slot = dict(zip(slot_of, active, strict=True))  # a free slot runs as any live row (output unused)
            m, extra = weights([by_slot.get(s, active[0]) for s in range(slots.slots)])
            run = step_fn(m) if not extra else m
            out = run(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                      **{cache_kw: slots}, **extra)
            logits = out.logits[index, -1, :]
            slots.col += 1
            pos[index] += 1
        # admissions: what waited first, then new arrivals, while slots are free
        if admit is not None and (active or pending):
            pending = [r for r in pending if not r.done]  # cancelled while waiting
            # new rows only while every waiting row fits: else the batch drains and the long prompt gets in at reset
            if len(free) > len(pending) and all(len(r.prompt_ids) <= slots.col for r in pending):
                pending += admit(len(free) - len(pending))
            if not active and pending:  # drained: start over with the waiting rows
                slots.reset(start=max(len(r.prompt_ids) for r in pending))
            joined = [r for r in pending if len(r.prompt_ids) <= slots.col][: len(free)]
            if joined:
                placed = {id(r) for r in joined}
                pending = [r for r in pending if id(r) not in placed]
                new_logits = place(joined)
                logits = torch.cat([logits, new_logits], dim=0) if len(active) > len(joined) else new_logits
                changed = True
        if active and changed:
            sampler = Sampler(active, device)  # the batch changed: its parameters, seeds and bitmask rows
