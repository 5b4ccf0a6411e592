"""FleetBackend: one policy served by several replicas (vllm / hf / upstream / echo backends).

The gateway sees one :class:`~swarm.policy.base.PolicyBackend`; behind it each request goes to
the *least-loaded* eligible replica: fewest samples in flight per unit of ``capacity``, ties to
the replica that has served least, then to the first listed.

Versions, the one rule: a request admitted after version ``v`` of a policy is *announced* is
only ever served by a replica that already serves ``v``. ``load_weights(policy, state, v)``
announces ``v`` first (``version(policy)`` returns it from then on), then pushes the weights to
every replica in parallel; each replica becomes eligible again the moment its own load returns,
so the fleet pauses only for the fastest replica's load, not the slowest. A request admitted
before the announcement may still finish on the old weights: its :class:`Generation` carries
the version the replica really used (every backend reports it) and that is what the gateway
stores in the step. Requests that find no eligible replica wait up to ``wait_s``, then fail
with :class:`~swarm.errors.BackendError`.

Failures: a replica whose ``generate`` fails with a backend fault (not the request's fault,
such as a too-long prompt) is taken out of rotation for ``cooldown_s`` and the request is
retried once on another replica (``stream`` retries only before its first token). A replica
whose ``load_weights`` fails keeps its old version and gets no traffic for that policy until a
later publish reaches it (a LoRA adapter state is complete, so the next one catches it up); if
every replica fails, the announcement is withdrawn and the error raised.

Tokenization (``render_chat``, ``encode``, ``decode``) is the first replica's: every replica
must serve the same base model and tokenizer (checked on a probe string where the replicas can
tokenize). It does not start, health-check or autoscale replicas, and it is not a gateway: a
remote *gateway* records steps itself, so several gateways share one pool instead of being
replicas here (see docs/scale_out.md).

:class:`VersionFollower` keeps such an *extra* gateway's backend at the latest version the
trainer published to the shared pool (it loads the adapter the pool's ``PolicyVersion`` names,
so that folder must be readable there); the trainer's own gateway needs none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from swarm.errors import BackendError, ConflictError, ContextLengthError, SwarmError, ValidationError
from swarm.lora import LoraSpec
from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, StateDict, TokenDelta
from swarm.policy.settings import BACKENDS, BackendSection, WeightsSection
from swarm.pool import Versions
from swarm.settings import Kinds, derive

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["FleetBackend", "Replica", "VersionFollower", "load_adapter_dir", "load_adapter_spec"]

log = logging.getLogger(__name__)

_PROBE = "Fleet probe: hello, world 123 <|im_end|>"


@dataclass
class Replica:
    """One backend of the fleet and what the router knows about it."""

    name: str
    backend: PolicyBackend
    capacity: float = 1.0
    versions: dict[str, int] = field(default_factory=dict)  # what this replica serves, per policy
    in_flight: int = 0  # samples being generated now
    served: int = 0  # requests routed here so far
    failures: int = 0
    down_until: float = 0.0  # out of rotation until then (monotonic clock)
    last_error: str | None = None

    def load(self) -> float:
        return self.in_flight / self.capacity

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "versions": dict(self.versions), "in_flight": self.in_flight,
                "served": self.served, "failures": self.failures, "capacity": self.capacity,
                "down": self.down_until > time.monotonic(), "last_error": self.last_error}


def _is_request_fault(exc: BaseException) -> bool:
    """Errors the request causes on any replica (retrying elsewhere cannot help)."""
    return isinstance(exc, ContextLengthError) or (isinstance(exc, SwarmError) and not isinstance(exc, BackendError))


class FleetBackend:
    """A PolicyBackend over several replicas with least-loaded routing (see the module docstring)."""

    def __init__(
        self,
        replicas: Sequence[PolicyBackend] | Mapping[str, PolicyBackend],
        *,
        capacities: Mapping[str, float] | None = None,
        wait_s: float = 120.0,
        cooldown_s: float = 5.0,
        retries: int = 1,
        check_tokenizers: bool = True,
    ) -> None:
        named = dict(replicas) if isinstance(replicas, Mapping) else {f"r{i}": b for i, b in enumerate(replicas)}
        if not named:
            raise ValidationError("FleetBackend needs at least one replica", field="replicas")
        caps = dict(capacities or {})
        self._replicas = [Replica(n, b, float(caps.get(n, 1.0))) for n, b in named.items()]
        served = [sorted(r.backend.policies()) for r in self._replicas]
        if any(s != served[0] for s in served):
            raise ValidationError(f"fleet replicas serve different policies: "
                                  f"{ {r.name: s for r, s in zip(self._replicas, served, strict=True)} }",
                                  field="replicas")
        self._policies = list(self._replicas[0].backend.policies())
        for r in self._replicas:
            if r.capacity <= 0:
                raise ValidationError(f"replica {r.name}: capacity must be > 0", field="capacities")
            r.versions = {p: int(r.backend.version(p)) for p in self._policies}
        # a replica behind the others (restarted on the base weights) waits for the next publish
        self._announced = {p: max(r.versions[p] for r in self._replicas) for p in self._policies}
        self._wait_s, self._cooldown_s, self._retries = float(wait_s), float(cooldown_s), int(retries)
        self._lock = threading.Lock()  # router counters and announcements: the event loop and publishers share them
        self._publish_lock = threading.Lock()
        if check_tokenizers:
            self._check_tokenizers()

    # -- PolicyBackend: metadata -------------------------------------------------------------
    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas)

    @property
    def supports_constraints(self) -> bool:
        """Structured outputs only when every replica enforces them."""
        return all(getattr(r.backend, "supports_constraints", False) for r in self._replicas)

    @property
    def max_top_logprobs(self) -> int:
        return min(int(getattr(r.backend, "max_top_logprobs", 0)) for r in self._replicas)

    def policies(self) -> list[str]:
        return list(self._policies)

    def _check(self, policy: str) -> None:
        if policy not in self._announced:
            from swarm.errors import NotFoundError

            raise NotFoundError(f"unknown policy {policy!r}; served: {sorted(self._announced)}", policy=policy)

    def version(self, policy: str) -> int:
        """The announced version: what every request admitted from now on is served with."""
        self._check(policy)
        return self._announced[policy]

    def max_context(self, policy: str) -> int:
        return min(r.backend.max_context(policy) for r in self._replicas)

    def status(self) -> list[dict[str, Any]]:
        """Per replica: versions, samples in flight, requests served, failures, down or not."""
        with self._lock:
            return [r.status() for r in self._replicas]

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        return getattr(self._replicas[0].backend, "tokenizer", None)

    # -- PolicyBackend: text <-> ids (the first replica's; all share one tokenizer) -----------
    def render_chat(self, policy: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool) -> str:
        return self._replicas[0].backend.render_chat(policy, messages, tools, add_generation_prompt)

    def encode(self, policy: str, text: str) -> list[int]:
        return self._replicas[0].backend.encode(policy, text)

    def decode(self, policy: str, ids: list[int]) -> str:
        return self._replicas[0].backend.decode(policy, ids)

    def _check_tokenizers(self) -> None:
        policy = self._policies[0] if self._policies else None
        if policy is None:
            return
        seen: dict[str, list[int]] = {}
        for r in self._replicas:
            try:
                seen[r.name] = list(r.backend.encode(policy, _PROBE))
            except Exception:  # an upstream without a tokenizer cannot take part in the check
                continue
        if len({tuple(v) for v in seen.values()}) > 1:
            raise ValidationError(f"fleet replicas tokenize differently ({sorted(seen)}): every replica must "
                                  "serve the same base model and tokenizer", field="replicas")

    # -- routing -----------------------------------------------------------------------------
    def _pick(self, policy: str, exclude: set[str]) -> Replica | None:
        now = time.monotonic()
        want = self._announced[policy]
        best: Replica | None = None
        for r in self._replicas:
            if r.name in exclude or r.down_until > now or r.versions.get(policy, -1) < want:
                continue
            if best is None or (r.load(), r.served) < (best.load(), best.served):
                best = r
        return best

    async def _acquire(self, policy: str, samples: int, exclude: set[str]) -> Replica:
        self._check(policy)
        deadline = time.monotonic() + self._wait_s
        delay = 0.002
        while True:
            with self._lock:
                rep = self._pick(policy, exclude)
                if rep is not None:
                    rep.in_flight += samples
                    rep.served += 1
                    return rep
            if time.monotonic() > deadline:
                raise BackendError(f"no replica of policy {policy!r} serves version {self._announced[policy]} "
                                   f"after {self._wait_s:.0f}s: {self._why_none(policy, exclude)}", policy=policy)
            await asyncio.sleep(delay)  # a publish or a cooldown is in progress
            delay = min(delay * 2, 0.05)

    def _why_none(self, policy: str, exclude: set[str]) -> str:
        with self._lock:
            return "; ".join(f"{r.name}: v{r.versions.get(policy)}"
                             + (" (down)" if r.down_until > time.monotonic() else "")
                             + (" (failed this request)" if r.name in exclude else "")
                             + (f" last error {r.last_error}" if r.last_error else "") for r in self._replicas)

    def _release(self, rep: Replica, samples: int, error: BaseException | None = None) -> None:
        with self._lock:
            rep.in_flight -= samples
            if error is not None:
                rep.failures += 1
                rep.last_error = f"{type(error).__name__}: {error}"
                rep.down_until = time.monotonic() + self._cooldown_s
        if error is not None:
            log.warning("fleet replica %s failed (out of rotation for %.0fs): %r", rep.name, self._cooldown_s, error)

    # -- PolicyBackend: generation -----------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> list[Generation]:
        samples = max(1, request.sampling.n)
        failed: set[str] = set()
        while True:
            rep = await self._acquire(request.policy, samples, failed)
            try:
                gens = await rep.backend.generate(request)
            except Exception as exc:  # any replica failure: the caller's fault is re-raised, else the next replica
                if _is_request_fault(exc):
                    self._release(rep, samples)
                    raise
                self._release(rep, samples, exc)
                failed.add(rep.name)
                if len(failed) > self._retries or len(failed) >= len(self._replicas):
                    if isinstance(exc, BackendError):
                        raise
                    raise BackendError(f"fleet replica {rep.name} failed: {type(exc).__name__}: {exc}",
                                       policy=request.policy) from exc
                continue
            self._release(rep, samples)
            return gens

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        samples = max(1, request.sampling.n)
        failed: set[str] = set()
        while True:
            rep = await self._acquire(request.policy, samples, failed)
            started = False
            try:
                async for item in rep.backend.stream(request):
                    started = True
                    yield item
            except Exception as exc:  # as in generate: the caller's fault re-raised, else the next replica
                if _is_request_fault(exc):
                    self._release(rep, samples)
                    raise
                self._release(rep, samples, exc)
                failed.add(rep.name)
                if started or len(failed) > self._retries or len(failed) >= len(self._replicas):
                    raise  # tokens already sent cannot be taken back
                continue
            except BaseException:  # the consumer went away (GeneratorExit, cancellation)
                self._release(rep, samples)
                raise
            self._release(rep, samples)
            return

    # -- publishing --------------------------------------------------------------------------
    def load_weights(self, policy: str, adapter_state: StateDict | None, version: int) -> None:
        """Announce ``version``, then push it to every replica in parallel (see the module docstring).

        Returns when every replica has answered. Raises :class:`BackendError` only if no replica
        took the new weights (the announcement is then withdrawn); replicas that failed are named
        in :meth:`status` and get no traffic for ``policy`` until a later publish reaches them.
        """
        self._check(policy)
        with self._publish_lock:
            with self._lock:
                previous = self._announced[policy]
                if version <= previous:
                    raise ConflictError(f"version {version} is not newer than the announced version {previous}",
                                        policy=policy)
                self._announced[policy] = int(version)  # from here on no request goes to an older replica

            def push(rep: Replica) -> BaseException | None:
                try:
                    rep.backend.load_weights(policy, adapter_state, version)
                except Exception as exc:  # a result per replica: one failing must not stop the others' publish
                    return exc
                with self._lock:
                    rep.versions[policy] = int(version)
                return None

            with ThreadPoolExecutor(len(self._replicas), thread_name_prefix="fleet-publish") as ex:
                errors = dict(zip([r.name for r in self._replicas], ex.map(push, self._replicas), strict=True))
            failed = {n: e for n, e in errors.items() if e is not None}
            with self._lock:
                for r in self._replicas:
                    if r.name in failed:
                        r.failures += 1
                        r.last_error = f"load_weights v{version}: {type(failed[r.name]).__name__}: {failed[r.name]}"
                if len(failed) == len(self._replicas):
                    self._announced[policy] = previous
            if len(failed) == len(self._replicas):
                raise BackendError(f"no fleet replica took version {version} of {policy!r}: "
                                   + "; ".join(f"{n}: {e!r}" for n, e in failed.items()), policy=policy)
            for n, e in failed.items():
                log.warning("fleet replica %s did not take version %d of %r: %r", n, version, policy, e)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        for r in self._replicas:
            close = getattr(r.backend, "close", None)
            if callable(close):
                close()

    async def aclose(self) -> None:
        """Each member's ``aclose``: the connections the running event loop holds (the members stay open)."""
        for r in self._replicas:
            aclose = getattr(r.backend, "aclose", None)
            if callable(aclose):
                await aclose()


# -- following a trainer on another machine ------------------------------------------------------


def load_adapter_dir(path: str | Path) -> StateDict:
    """The peft adapter state saved by ``swarm.train.publish.save_adapter`` (``adapter_model.safetensors``)."""
    from safetensors.torch import load_file

    f = Path(path) / "adapter_model.safetensors"
    if not f.is_file():
        raise BackendError(f"no adapter_model.safetensors in {path}: is the trainer's out_dir readable here?",
                           path=str(path))
    return load_file(str(f))


def load_adapter_spec(path: str | Path) -> LoraSpec:
    """The :class:`~swarm.lora.LoraSpec` of a saved adapter (its ``adapter_config.json``): what a backend
    needs to attach before it can load that adapter's state (rank, alpha and targets must match)."""
    f = Path(path) / "adapter_config.json"
    try:
        cfg = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot read {f}: {exc}", path=str(path)) from None
    targets = cfg.get("target_modules") or ()
    return LoraSpec(rank=int(cfg["r"]), alpha=float(cfg["lora_alpha"]), dropout=float(cfg.get("lora_dropout") or 0.0),
                    target_modules=targets if isinstance(targets, str) else tuple(sorted(targets)))


class VersionFollower:
    """Polls a pool for published policy versions and loads each new one into ``backend``.

    For a gateway that is not the trainer's (another host on the same pool): without it, its
    backend would keep serving the weights it started with. A version whose ``adapter_path`` is
    ``None`` only bumps the backend's version. A load that fails is logged and retried on the
    next poll. It never moves a backend back to an older version.
    """

    def __init__(self, pool: Versions, backend: PolicyBackend, interval_s: float = 2.0,
                 load: Callable[[str], StateDict] = load_adapter_dir) -> None:
        self.pool, self.backend, self.interval_s, self._load = pool, backend, float(interval_s), load
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: dict[tuple[str, int], str] = {}

    def poll_once(self) -> dict[str, int]:
        """Bring every policy up to the pool's latest version; returns the versions loaded now."""
        loaded = {}
        for policy in self.backend.policies():
            latest = self.pool.latest_version(policy)
            if latest <= self.backend.version(policy):
                continue
            record = next((v for v in self.pool.policy_versions(policy) if v.version == latest), None)
            if record is None:
                continue
            try:
                state = None if record.adapter_path is None else self._load(record.adapter_path)
                self.backend.load_weights(policy, state, latest)
            except Exception as exc:  # keep serving the old version; try again next poll
                key = (policy, latest)
                if self._failed.get(key) != repr(exc):
                    log.warning("could not load version %d of %r from %s: %r", latest, policy, record.adapter_path, exc)
                self._failed[key] = repr(exc)
                continue
            loaded[policy] = latest
        return loaded

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # the pool unreachable for a moment must not end the follower
                log.warning("version follower poll failed", exc_info=True)
            self._stop.wait(self.interval_s)

    def start(self) -> VersionFollower:
        self._thread = threading.Thread(target=self._run, name="swarm-version-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


@BACKENDS.declare("fleet")
class FleetSettings(derive(FleetBackend, skip=("replicas", "capacities", "check_tokenizers"),  # type: ignore[misc]
                           base=WeightsSection)):
    """``backend: fleet``: replicas (model sections of other kinds) behind one backend (docs/scale_out.md)."""

    replicas: list[Annotated[BackendSection, Kinds(BACKENDS, exclude=("fleet",))]] = Field(min_length=1)

    def build(self, policies: list[str], lora: LoraSpec | None) -> FleetBackend:
        names = [rep.name or f"r{i}" for i, rep in enumerate(self.replicas)]
        return FleetBackend({n: rep.build(policies, lora) for n, rep in zip(names, self.replicas, strict=True)},
                            capacities={n: rep.capacity for n, rep in zip(names, self.replicas, strict=True)},
                            **self.args())
