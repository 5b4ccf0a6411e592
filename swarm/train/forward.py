"""Run packed rows through a causal LM and gather each target's logprob.

Calls the model's decoder (``get_decoder()``) directly with the tree mask and depth position
ids, then applies the LM head only at the *predicting* positions (each distinct one once), so
the full ``(B, L, vocab)`` logits are never materialised. Logits are divided by the sampling
temperature before the softmax, so logprobs match what the backend sampled from; targets sampled
under a grammar (``allowed``, see ``swarm.train.constraint``) are normalised over the tokens the
grammar allowed there, as the backend's masked sampling was.

Works for peft-wrapped models (LoRA layers live inside the decoder) and plain ones. The mask is
boolean for SDPA, additive float for other attention implementations; flash-attention kernels
cannot take an arbitrary tree mask. Does not compute losses.
"""

from __future__ import annotations

import contextlib

import torch

from swarm.merge.collate import Collated
from swarm.train.tree_attention import IMPL, block_plan, tree_attention

__all__ = ["target_logprobs", "base_causal_lm"]


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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-target logprobs ``(T,)`` (with grad if enabled) and, optionally, entropies (no grad).

    ``allowed``: ``(target indices (K,), bool rows (K, vocab))``; those targets' softmax runs over
    the allowed tokens only (the constrained-decoding mask they were sampled under).

    ``block_size``: masked rows on an SDPA model use block-sparse tree attention with query
    blocks of this size (``tree_attention``); None runs the dense mask through plain SDPA.
    """
    lm = base_causal_lm(model)
    device = next(lm.parameters()).device
    mask = col.attention_mask
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    extra = {}
    if mask is not None:
        mask = mask.to(device)
        if lm.config._attn_implementation == "sdpa" and block_size:
            extra["swarm_tree_plan"] = block_plan(mask, block_size)
            ctx = tree_attention(lm)
        elif lm.config._attn_implementation not in ("sdpa", IMPL):
            dtype = next(lm.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
    with ctx:
        out = lm.get_decoder()(
            input_ids=col.input_ids.to(device),
            attention_mask=mask,
            position_ids=None if col.position_ids is None else col.position_ids.to(device),
            use_cache=False,
            **extra,
        )
    hidden = out.last_hidden_state
    length = hidden.shape[1]
    flat = (col.predict_row * length + col.predict_pos).to(device)
    uniq, inverse = torch.unique(flat, return_inverse=True)
    logits = lm.get_output_embeddings()(hidden.reshape(-1, hidden.shape[-1])[uniq]).float()
    cap = getattr(lm.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits[inverse, col.target_ids.to(device)] - logz[inverse]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = (logz - (probs * logits).sum(-1))[inverse]
    if allowed is not None:
        sel, ok = allowed[0].to(device), allowed[1].to(device)
        if ok.shape[-1] < logits.shape[-1]:  # ids past the tokenizer's vocabulary are never allowed
            ok = torch.nn.functional.pad(ok, (0, logits.shape[-1] - ok.shape[-1]), value=False)
        masked = logits[inverse[sel]].masked_fill(~ok, float("-inf"))
        mlogp = torch.log_softmax(masked, dim=-1)
        logp = logp.index_put((sel,), mlogp.gather(1, col.target_ids.to(device)[sel].unsqueeze(1)).squeeze(1))
        if entropy is not None:
            with torch.no_grad():
                entropy[sel] = -torch.special.xlogy(mlogp.exp(), mlogp.exp()).sum(-1)
    return logp, entropy
