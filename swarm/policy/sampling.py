"""Token sampling whose logprobs are those of the distribution actually sampled from, a whole batch at once.

:func:`batch_logprobs` turns a batch of raw logits into the log-probabilities the sampler uses,
each row with its own parameters (:class:`BatchParams`): ``log_softmax(logits / temperature)``,
then restricted to the ``top_k`` most likely tokens (``top_k > 0``), then to the nucleus of mass
``top_p`` (``top_p < 1``) and renormalised. :func:`processed_logprobs` is the same function with one
set of parameters for any number of rows; a trainer that wants importance ratios against recorded
logprobs scores its own logits with it (same temperature, top_p, top_k). ``temperature == 0``
means greedy decoding; its recorded logprob is that of the *unscaled* softmax (temperature 1, no
truncation), since a point mass would give 0 for every token and carry no information.

:func:`sample` draws one token per row by inverting the row's CDF at a uniform number that
depends only on the row's ``(seed, sample index, step)`` (:func:`uniforms`, a SplitMix64 hash):
counter-based randomness, so a seeded call gives the same tokens whatever else shares its batch,
on CPU and on CUDA alike (up to float rounding of the batched matmuls that made the logits).
Everything stays on the logits' device; only what the caller gathers crosses to the host.

Pure functions over tensors; no model, no batching loop, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["BatchParams", "batch_logprobs", "processed_logprobs", "sample", "uniforms", "uniforms_at", "sample_from"]

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_HEAD = 512  # candidate tokens for top-k / top-p before falling back to a full sort


@dataclass(frozen=True)
class BatchParams:
    """Per-row sampling parameters as tensors on the logits' device, plus what the host knows of them."""

    temperature: torch.Tensor  # (B,) float32; 0: greedy
    top_p: torch.Tensor  # (B,) float32 in (0, 1]
    top_k: torch.Tensor  # (B,) int64; 0: off
    greedy: torch.Tensor  # (B,) bool
    truncating: torch.Tensor  # (B,) bool: a sampled row with top_k or top_p < 1
    any_truncating: bool
    any_greedy: bool
    all_greedy: bool

    @classmethod
    def of(cls, temperature: Sequence[float], top_p: Sequence[float], top_k: Sequence[int],
           device: torch.device | str = "cpu") -> BatchParams:
        """Parameters for rows with these temperatures, top_p and top_k values."""
        greedy = [t <= 0 for t in temperature]
        trunc = [not g and (k > 0 or p < 1.0) for g, p, k in zip(greedy, top_p, top_k, strict=True)]
        return cls(temperature=torch.tensor([float(t) for t in temperature], device=device),
                   top_p=torch.tensor([float(p) for p in top_p], device=device),
                   top_k=torch.tensor([int(k) for k in top_k], dtype=torch.long, device=device),
                   greedy=torch.tensor(greedy, device=device), truncating=torch.tensor(trunc, device=device),
                   any_truncating=any(trunc), any_greedy=any(greedy), all_greedy=all(greedy))


def batch_logprobs(logits: torch.Tensor, params: BatchParams) -> torch.Tensor:
    """Log-probabilities (float32, ``(B, V)``) of each row's sampling distribution."""
    logits = logits.float()
    scale = torch.where(params.greedy, torch.ones_like(params.temperature), params.temperature)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    if not params.any_truncating:
        return logp
    sorted_logp, order = _sorted_head(logp, params)
    vocab = sorted_logp.shape[-1]  # the candidates: every token a row can keep is among them
    k = torch.where(params.top_k > 0, params.top_k, torch.full_like(params.top_k, vocab))
    drop_sorted = torch.arange(vocab, device=logp.device)[None, :] >= k[:, None]  # top-k first ...
    kept = sorted_logp.masked_fill(drop_sorted, float("-inf"))
    # renormalised over the top-k set; without top_k the row's own probabilities (the head may hold less than all)
    renorm = torch.where((params.top_k > 0)[:, None], kept - torch.logsumexp(kept, dim=-1, keepdim=True), kept)
    probs = renorm.exp()
    # ... then the nucleus of what is left: drop a token when the mass strictly before it reaches top_p
    nucleus = (probs.cumsum(dim=-1) - probs) >= params.top_p[:, None]
    drop_sorted = (drop_sorted | (nucleus & (params.top_p < 1.0)[:, None])) & params.truncating[:, None]
    drop = torch.ones_like(logp, dtype=torch.bool).scatter(-1, order, drop_sorted)  # not a candidate: dropped
    out = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return torch.where(params.truncating[:, None], out, logp)


def _sorted_head(logp: torch.Tensor, params: BatchParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely tokens of each row, sorted: a ``topk`` head when it holds every token a row may keep, else all.

    A full sort of a 49k vocabulary costs ~5 ms a row on one CPU core; a nucleus is usually a few
    hundred tokens. The head is exact when, for every truncating row, ``top_k`` fits in it or
    (without ``top_k``) its mass already reaches ``top_p``: every token after it is then dropped.
    """
    vocab = logp.shape[-1]
    head = min(vocab, max(_HEAD, int(params.top_k.max())))
    if head < vocab:
        vals, idx = logp.topk(head, dim=-1)
        by_k = (params.top_k > 0) & (params.top_k <= head)
        # a margin over top_p: a rounding difference from the cumulative sum below cannot keep a token past the head
        by_p = (params.top_k == 0) & (torch.logsumexp(vals, dim=-1).exp() >= params.top_p + 1e-5)
        if bool((by_k | by_p | ~params.truncating).all()):
            return vals, idx
    return logp.sort(dim=-1, descending=True)


def processed_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                       top_k: int = 0) -> torch.Tensor:
    """Log-probabilities (float32, same shape as ``logits``) of the sampling distribution, one parameter set."""
    flat = logits.reshape(-1, logits.shape[-1])
    n = flat.shape[0]
    params = BatchParams.of([temperature] * n, [top_p] * n, [top_k] * n, device=logits.device)
    return batch_logprobs(flat, params).reshape(logits.shape)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return x ^ (x >> np.uint64(31))


def _rows(seeds: Sequence[int], indices: Sequence[int]) -> np.ndarray:
    seed = np.asarray([int(s) & 0xFFFFFFFFFFFFFFFF for s in seeds], dtype=np.uint64)
    return _splitmix64(_splitmix64(seed) ^ np.asarray([int(i) for i in indices], dtype=np.uint64))


def _unit(h: np.ndarray) -> torch.Tensor:
    u = (h >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return torch.from_numpy(np.minimum(u, 1.0 - 2.0**-40))


def uniforms(seeds: Sequence[int], indices: Sequence[int], steps: int) -> torch.Tensor:
    """Float64 ``(B, steps)`` in [0, 1): row b's number at step s is a hash of ``(seeds[b], indices[b], s)`` only."""
    return _unit(_splitmix64(_rows(seeds, indices)[:, None] ^ _splitmix64(np.arange(steps, dtype=np.uint64))[None, :]))


def uniforms_at(seeds: Sequence[int], indices: Sequence[int], steps: Sequence[int]) -> torch.Tensor:
    """Float64 ``(B,)``: row b's number at its own step ``steps[b]`` (the same as :func:`uniforms` gives there)."""
    return _unit(_splitmix64(_rows(seeds, indices) ^ _splitmix64(np.asarray([int(s) for s in steps], dtype=np.uint64))))


def sample(logp: torch.Tensor, u: torch.Tensor, params: BatchParams) -> torch.Tensor:
    """One token id per row (``(B,)`` int64, on the logits' device): the row's CDF inverted at ``u``; argmax when greedy."""
    if params.all_greedy:
        return logp.argmax(dim=-1)
    cdf = logp.exp().double().cumsum(dim=-1)
    x = u.to(device=logp.device, dtype=torch.float64) * cdf[:, -1]
    # first index whose cumulative mass exceeds x: never a zero-probability token
    ids = torch.searchsorted(cdf, x[:, None], right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)
    return torch.where(params.greedy, logp.argmax(dim=-1), ids) if params.any_greedy else ids


def sample_from(logp: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """One token id from a 1-D row of :func:`processed_logprobs` (argmax when temperature is 0); for callers
    outside the batched loop that keep a ``torch.Generator``."""
    if temperature <= 0:
        return int(torch.argmax(logp).item())
    return int(torch.multinomial(logp.exp(), 1, generator=generator).item())
