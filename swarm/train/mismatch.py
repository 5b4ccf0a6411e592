"""Train-inference mismatch: the sampler's recorded logprobs against the trainer's recompute of the same tokens.

The backend records, for every sampled token, the logprob of the distribution it sampled from (mu); the
trainer recomputes the same token's logprob under its own weights (pi) in the update's forward pass. For a
step sampled at the version being trained (*on-policy*) the two are the same distribution in exact
arithmetic, so ``|pi - mu|`` per token measures the engines' disagreement alone (kernels, dtype, batching,
a wrong adapter, template or temperature). A *stale* step (sampled at an older version) also carries the
policy's drift since then; it is reported apart (``mismatch/stale_*``), never mixed into the mismatch.

Per token, over the on-policy tokens with a recorded logprob (unrecorded ones, NaN, are skipped):

- ``mismatch/logprob_abs_mean``, ``mismatch/logprob_abs_max``: mean and max of ``|pi - mu|`` (nats);
- ``mismatch/kl_k3``: the k3 estimate of KL(mu || pi) (samples come from mu): ``r - 1 - log r``, ``r = pi/mu``;
- ``mismatch/tokens``; and for the stale tokens ``mismatch/stale_logprob_abs_mean``, ``..._max``, ``..._tokens``.

Pure tensor code, measured where the trainer already holds both (``swarm.train.batch_loss``: no extra forward):
:func:`mismatch_terms` is one micro-batch's sums as a device tensor (no host sync), :class:`MismatchSums`
adds them up (``max`` for the maxima) and turns them into metrics. It neither logs nor decides anything: the
run's reaction to a large mismatch is :mod:`swarm.train.health`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

from swarm.train.losses import k3_kl

__all__ = ["MismatchSums", "mismatch_terms", "mismatch_stats"]

# the order of mismatch_terms' entries (and MismatchSums' fields)
_SUMS = ("tokens", "abs_sum", "k3_sum", "stale_tokens", "stale_abs_sum")
_MAXES = ("abs_max", "stale_abs_max")


def mismatch_terms(recomputed: torch.Tensor, recorded: torch.Tensor, on_policy: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """One micro-batch's mismatch sums as a ``(7,)`` tensor on the inputs' device (no host sync).

    ``recomputed``: the trainer's per-token logprobs (T,) (gradients are not followed); ``recorded``: the
    sampler's (T,), NaN where none was recorded; ``on_policy``: (T,) bool, True where the token's step was
    sampled at the version being trained (None: all). Order: :data:`_SUMS` then :data:`_MAXES`.
    """
    with torch.no_grad():
        pi = recomputed.detach().double()  # k3 of a 1e-5 difference is ~5e-11: below float32's resolution near 1
        mu = recorded.detach().double().to(pi.device)
        seen = ~torch.isnan(mu)
        on = seen if on_policy is None else seen & on_policy.to(device=pi.device, dtype=torch.bool)
        off = seen & ~on
        mu0 = torch.where(seen, mu, pi)  # NaN must not leak into the sums through the masked-out entries
        diff = (pi - mu0).abs()
        zero = torch.zeros_like(diff)
        k3 = torch.where(on, k3_kl(mu0, pi), zero)  # KL(mu || pi): logp = the sampler's, ref = the trainer's
        d_on, d_off = torch.where(on, diff, zero), torch.where(off, diff, zero)
        return torch.stack([on.sum().float(), d_on.sum(), k3.sum(), off.sum().float(), d_off.sum(),
                            d_on.max() if diff.numel() else diff.new_zeros(()),
                            d_off.max() if diff.numel() else diff.new_zeros(())])


@dataclass
class MismatchSums:
    """Running sums (and maxima) of an update's mismatch terms, over micro-batches and ranks."""

    tokens: float = 0.0
    abs_sum: float = 0.0
    k3_sum: float = 0.0
    stale_tokens: float = 0.0
    stale_abs_sum: float = 0.0
    abs_max: float = 0.0
    stale_abs_max: float = 0.0

    def add(self, terms: torch.Tensor) -> None:
        """Add one :func:`mismatch_terms` (one host sync)."""
        vals = dict(zip(_SUMS + _MAXES, terms.tolist(), strict=True))
        for k in _SUMS:
            setattr(self, k, getattr(self, k) + vals[k])
        for k in _MAXES:
            setattr(self, k, max(getattr(self, k), vals[k]))

    def sums(self) -> dict[str, float]:
        """The additive entries (what ``distributed.all_reduce_sums`` takes)."""
        return {k: getattr(self, k) for k in _SUMS}

    def maxes(self) -> dict[str, float]:
        """The maxima (reduced across ranks with max, not sum)."""
        return {k: getattr(self, k) for k in _MAXES}

    @classmethod
    def from_dict(cls, values: dict[str, float]) -> MismatchSums:
        return cls(**{f.name: float(values[f.name]) for f in fields(cls)})

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """``mismatch/`` metrics; the on-policy (stale) ones only when there were such tokens."""
        out: dict[str, float] = {"mismatch/tokens": self.tokens, "mismatch/stale_tokens": self.stale_tokens}
        if self.tokens > 0:
            out.update({"mismatch/logprob_abs_mean": self.abs_sum / self.tokens,
                        "mismatch/logprob_abs_max": self.abs_max, "mismatch/kl_k3": self.k3_sum / self.tokens})
        if self.stale_tokens > 0:
            out.update({"mismatch/stale_logprob_abs_mean": self.stale_abs_sum / self.stale_tokens,
                        "mismatch/stale_logprob_abs_max": self.stale_abs_max})
        return out


def mismatch_stats(recomputed: torch.Tensor, recorded: torch.Tensor, on_policy: torch.Tensor | None = None
                   ) -> dict[str, float]:
    """The ``mismatch/`` metrics of one set of tokens (see the module docstring)."""
    sums = MismatchSums()
    sums.add(mismatch_terms(recomputed, recorded, on_policy))
    return sums.metrics()
