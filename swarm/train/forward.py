"""Run packed rows through a causal LM and gather each target's logprob.

Calls the model's decoder (``get_decoder()``) directly with the tree mask and depth position
ids, then applies the LM head only at the *predicting* positions (each distinct one once), so
the full ``(B, L, vocab)`` logits are never materialised, and with a large vocabulary the
predicting positions are scored in chunks whose logits are recomputed in the backward pass.
Logits are divided by the sampling temperature before the softmax, so logprobs match what the
backend sampled from; targets sampled under a grammar (``allowed``, see
``swarm.train.constraint``) are normalised over the tokens the grammar allowed there, as the
backend's masked sampling was.

Works for peft-wrapped models (LoRA layers live inside the decoder) and plain ones. The tree
mask takes the form the model's attention implementation needs:

- ``flex_attention`` (``train.attention: flex``): a ``BlockMask`` built from the rows'
  ``subtree_end`` (``swarm.train.flex_mask``), no dense mask at all; CUDA only for training.
- ``sdpa``: the boolean ``(B, 1, L, L)`` mask, cut into query blocks for block-sparse SDPA
  (``swarm.train.tree_attention``) or whole with ``block_size=None``.
- anything else (``eager``): an additive float mask in the model's dtype, because transformers'
  eager attention adds the mask to the scores (``attn_weights + attention_mask``) and so cannot
  take a boolean one. Its ``B·L²·itemsize`` bytes are small beside the ``B·H·L²`` scores that
  eager attention itself keeps per layer.

Flash-attention kernels cannot take an arbitrary tree mask. Does not compute losses.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.checkpoint import checkpoint

from swarm.merge.tensors import Collated, tree_attention_mask
from swarm.train.flex_mask import FLEX_IMPL, check_flex_device, tree_block_mask
from swarm.train.tree_attention import IMPL, block_plan, tree_attention

__all__ = ["target_logprobs", "base_causal_lm", "LOGIT_CHUNK_ELEMS"]

# 2^25 float32 logits = 128 MiB at once: ~220 positions of a 151,936-token vocabulary
LOGIT_CHUNK_ELEMS = 1 << 25


def base_causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The underlying ``*ForCausalLM`` of a peft model (adapter layers included), or the model."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def target_logprobs(
    model: torch.nn.Module,
    col: Collated,
    temperature: float = 1.0,
    with_entropy: bool = False,
    block_size: int | None = 128,
    allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
    logit_chunk_elems: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-target logprobs ``(T,)`` (with grad if enabled) and, optionally, entropies (no grad).

    ``allowed``: ``(target indices (K,), bool rows (K, vocab))``; those targets' softmax runs over
    the allowed tokens only (the constrained-decoding mask they were sampled under).

    ``block_size``: masked rows on an SDPA model use block-sparse tree attention with query
    blocks of this size (``tree_attention``); None runs the dense mask through plain SDPA. A model
    switched to flex attention (``flex_mask.use_flex_attention``) gets a ``BlockMask`` built from
    ``col.subtree_end`` instead; with gradients it must be on CUDA (ValidationError on CPU).
    ``logit_chunk_elems``: at most this many float logits (positions x vocab) live at once; longer
    target lists are cut into chunks whose logits the backward recomputes (bounded memory for
    real vocabularies). None: :data:`LOGIT_CHUNK_ELEMS`.
    """
    lm = base_causal_lm(model)
    device = next(lm.parameters()).device
    impl = lm.config._attn_implementation
    mask: torch.Tensor | BlockMask | None = col.attention_mask
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    extra = {}
    if impl == FLEX_IMPL and col.subtree_end is not None:
        check_flex_device(device, torch.is_grad_enabled() and any(p.requires_grad for p in lm.parameters()))
        mask = tree_block_mask(col.subtree_end.to(device))
    elif mask is None and col.subtree_end is not None:  # collated for flex, run on another attention
        mask = tree_attention_mask(col.subtree_end)
    if isinstance(mask, torch.Tensor):
        mask = mask.to(device)
        if impl in ("sdpa", IMPL) and block_size:
            extra["swarm_tree_plan"] = block_plan(mask, block_size)
            ctx = tree_attention(lm)
        elif impl not in ("sdpa", IMPL):
            dtype = next(lm.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
    with ctx:
        out = lm.get_decoder()(input_ids=col.input_ids.to(device), attention_mask=mask,
                               position_ids=None if col.position_ids is None else col.position_ids.to(device),
                               use_cache=False, **extra)
    hidden = out.last_hidden_state
    length = hidden.shape[1]
    flat = (col.predict_row * length + col.predict_pos).to(device)
    uniq, inverse = torch.unique(flat, return_inverse=True)
    h = hidden.reshape(-1, hidden.shape[-1])[uniq]
    head = lm.get_output_embeddings()
    cap = getattr(lm.config, "final_logit_softcapping", None)
    targets = col.target_ids.to(device)
    rows = max(1, (logit_chunk_elems or LOGIT_CHUNK_ELEMS) // max(1, head.weight.shape[0]))
    if h.shape[0] <= rows:  # one chunk: nothing to save by recomputing
        logp, entropy = _head_logprobs(head, h, inverse, targets, temperature, cap, with_entropy)
        return _constrained(head, h, inverse, targets, temperature, cap, allowed, logp, entropy)
    # (positions x vocab) float logits per chunk only; the backward recomputes each chunk's
    # logits from its hidden rows instead of keeping them all (checkpoint)
    order = torch.argsort(inverse)
    starts = torch.searchsorted(inverse[order], torch.arange(0, h.shape[0] + rows, rows, device=device))
    pieces, ents = [], []
    for c, a in enumerate(range(0, h.shape[0], rows)):
        sel = order[starts[c]:starts[c + 1]]
        if sel.numel() == 0:
            continue
        fn = functools.partial(_head_logprobs, head, temperature=temperature, cap=cap, with_entropy=with_entropy)
        lp, en = checkpoint(fn, h[a:a + rows], inverse[sel] - a, targets[sel], use_reentrant=False)
        pieces.append(lp)
        ents.append(en)
    back = torch.argsort(order)
    logp = torch.cat(pieces)[back]
    entropy = torch.cat(ents)[back] if with_entropy else None
    return _constrained(head, h, inverse, targets, temperature, cap, allowed, logp, entropy)


def _head_logprobs(head: torch.nn.Module, h: torch.Tensor, inverse: torch.Tensor, targets: torch.Tensor,
                   temperature: float, cap: float | None, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (and entropies) of ``targets`` predicted from hidden rows ``h[inverse]``."""
    logits = head(h).float()
    if cap:
        logits = torch.tanh(logits / cap) * cap
    logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits[inverse, targets] - logz[inverse]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = (logz - (probs * logits).sum(-1))[inverse]
    return logp, entropy


def _constrained(head: torch.nn.Module, h: torch.Tensor, inverse: torch.Tensor, targets: torch.Tensor,
                 temperature: float, cap: float | None, allowed: tuple[torch.Tensor, torch.Tensor] | None,
                 logp: torch.Tensor, entropy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logp``/``entropy`` with the grammar-constrained targets renormalised over their allowed tokens.

    Only the K constrained targets' logits are recomputed (K x vocab), so this adds no full-batch logits.
    """
    if allowed is None:
        return logp, entropy
    device = h.device
    sel, ok = allowed[0].to(device), allowed[1].to(device)
    logits = head(h[inverse[sel]]).float()
    if cap:
        logits = torch.tanh(logits / cap) * cap
    logits = logits / temperature
    if ok.shape[-1] < logits.shape[-1]:  # ids past the tokenizer's vocabulary are never allowed
        ok = torch.nn.functional.pad(ok, (0, logits.shape[-1] - ok.shape[-1]), value=False)
    mlogp = torch.log_softmax(logits.masked_fill(~ok, float("-inf")), dim=-1)
    logp = logp.index_put((sel,), mlogp.gather(1, targets[sel].unsqueeze(1)).squeeze(1))
    if entropy is not None:
        with torch.no_grad():
            entropy[sel] = -torch.special.xlogy(mlogp.exp(), mlogp.exp()).sum(-1)
    return logp, entropy
