"""Run control: the state a client drives a training run through (``/v1/control``, docs/scale_out.md
"Driving the server from a client").

One :class:`Control` lives in the training process (``flows.train``) and is shared by its own gateway's
routes, which write it, and the flow's update loop, which reads it between updates. Another gateway on
the same pool serves no control: the run's state is in this process's memory. States::

    waiting --start--> running <--pause/resume--> paused
       |                  |                          |
       +------stop--------+----------stop------------+--> stopping --(the loop ends)--> finished

Knob changes (:data:`KNOBS`, the declared-safe ones) are validated here and queued; the loop takes them
(:meth:`Control.take_changes`) between updates and reports each as applied at its policy version. Start
overrides are checked by the ``check_start`` callable the flow passes (its typed config). Thread-safe
(one lock). It does not train, log or read config; refusals raise :class:`~swarm.errors.ValidationError`
(400, naming the knob) or :class:`~swarm.errors.ConflictError` (409, the state forbids the call).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

from swarm.errors import ConflictError, ValidationError

__all__ = ["Control", "ControlStatus", "Change", "Knob", "KnobValue", "KNOBS", "STATES", "STRATEGIES", "knob_name",
           "check_knob"]

KnobValue = int | float | str | None  # lr: float; strategy: str; the counts: int; max_staleness may be None
_Started = TypeVar("_Started")  # what check_start makes of a client's overrides (flows.train: its RunConfig)

STATES = ("waiting", "running", "paused", "stopping", "finished")
STRATEGIES = ("episodes", "groups", "groups_var", "any_agree", "all_agree")


@dataclass(frozen=True)
class Knob:
    """A declared-safe knob: its config key and what it accepts."""

    key: str
    accepts: str


KNOBS: dict[str, Knob] = {
    "lr": Knob("algo.lr", "a number > 0 (set on the optimizer's param groups)"),
    "strategy": Knob("batching.strategy", f"one of {', '.join(STRATEGIES)}"),
    "min_groups": Knob("batching.min_groups", "an integer >= 1"),
    "min_episodes": Knob("batching.min_episodes", "an integer >= 1"),
    "max_staleness": Knob("train.max_staleness", "an integer >= 0, or null (no limit)"),
    "eval_every": Knob("task.eval_every", "an integer >= 0 (0: no eval groups)"),
    "updates": Knob("train.updates", "an integer >= 1 (the run's total)"),
}
_BY_KEY = {k.key: name for name, k in KNOBS.items()}


def knob_name(name: str) -> str:
    """The knob's short name for ``name`` (short or its config key); a ValidationError lists the safe ones."""
    if name in KNOBS:
        return name
    if name in _BY_KEY:
        return _BY_KEY[name]
    safe = ", ".join(f"{n} ({k.key})" for n, k in KNOBS.items())
    raise ValidationError(f"{name}: not a knob that may change during a run; the safe knobs are {safe} "
                          "(anything else needs a new run)", param=name, code="unsafe_knob")


def _int(value: object, lo: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        v = int(value) if not isinstance(value, float) or value.is_integer() else None
    except ValueError:
        return None
    return v if v is not None and v >= lo else None


def check_knob(name: str, value: object) -> tuple[str, KnobValue]:
    """(short name, the value as the run uses it); a ValidationError names the knob and what it accepts."""
    name = knob_name(name)
    v: KnobValue = None
    if name == "lr":
        try:
            v = float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else None
        except ValueError:
            v = None
        v = v if v is not None and math.isfinite(v) and v > 0 else None
    elif name == "strategy":
        v = value if isinstance(value, str) and value in STRATEGIES else None
    elif name == "max_staleness":
        if value is None or value == "null":
            return name, None
        v = _int(value, 0)
    else:
        v = _int(value, 0 if name == "eval_every" else 1)
    if v is None:
        raise ValidationError(f"{name}={value!r}: bad value; {name} ({KNOBS[name].key}) takes {KNOBS[name].accepts}",
                              param=name, code="invalid_value")
    return name, v


@dataclass(frozen=True)
class Change:
    """A requested knob change; ``version`` is the policy version it was applied at (None: queued)."""

    knob: str
    value: KnobValue
    requested_at: float = field(default_factory=time.time)
    version: int | None = None
    applied_at: float | None = None


class ControlStatus(TypedDict):
    """What :meth:`Control.status` answers (``GET /v1/control``)."""

    state: str
    held: bool
    holder: str | None
    policy_version: int
    updates_done: int
    updates_total: KnobValue
    knobs: dict[str, KnobValue]
    overrides: dict[str, object]
    pending: list[dict[str, Any]]  # asdict(Change)
    applied: list[dict[str, Any]]


class Control(Generic[_Started]):
    """The run's control state (see the module docstring); ``knobs`` are the run's current values."""

    def __init__(self, knobs: Mapping[str, KnobValue], *, wait_for_client: bool = False,
                 check_start: Callable[[dict[str, object]], tuple[_Started, Mapping[str, KnobValue]]] | None = None
                 ) -> None:
        """``check_start(overrides)`` -> (what the flow starts with, the knobs after the overrides); it raises
        ValidationError naming a refused key. Without ``wait_for_client`` the run is running at once."""
        self._lock = threading.Condition()
        self.state = "waiting" if wait_for_client else "running"
        self.knobs = {k: knobs.get(k) for k in KNOBS}
        self.holder: str | None = None if wait_for_client else "flows.train"
        self.updates_done = 0
        self.version = 0
        self.started_with: _Started | None = None
        self.overrides: dict[str, object] = {}
        self._check_start = check_start
        self._queue: list[Change] = []
        self.applied: list[Change] = []
        self._stops: list[threading.Event] = []
        self._held = False  # the loop is holding at a pause (no update under way)

    # -- what the routes call -------------------------------------------------------------------
    def status(self) -> ControlStatus:
        """The state, ``held`` (paused and the loop is holding: no update under way), holder, policy version,
        updates done / total, knobs, queued and applied changes."""
        with self._lock:
            return {"state": self.state, "held": self._held, "holder": self.holder, "policy_version": self.version,
                    "updates_done": self.updates_done, "updates_total": self.knobs["updates"],
                    "knobs": dict(self.knobs), "overrides": dict(self.overrides),
                    "pending": [asdict(c) for c in self._queue], "applied": [asdict(c) for c in self.applied]}

    def start(self, overrides: Mapping[str, object], holder: str = "client") -> ControlStatus:
        """Start a waiting run with ``overrides`` (dotted config keys); 409 unless waiting."""
        with self._lock:
            if self.state != "waiting":
                raise ConflictError(f"the run is already {self.state} (held by {self.holder}): two runs cannot "
                                    "train one policy at once; stop it first, or start another server",
                                    code="run_in_progress")
            overrides = {KNOBS[k].key if k in KNOBS else k: v for k, v in overrides.items()}  # lr -> algo.lr
            started, knobs = self._check_start(dict(overrides)) if self._check_start else (None, {})
            self.started_with, self.overrides, self.holder = started, dict(overrides), holder
            self.knobs.update({k: v for k, v in knobs.items() if k in KNOBS})
            self.state = "running"
            self._lock.notify_all()
        return self.status()

    def pause(self) -> ControlStatus:
        """Hold the run before its next update (an update already training completes); 409 unless running."""
        return self._move({"running", "paused"}, "paused")

    def resume(self) -> ControlStatus:
        """Let a paused run go on; 409 unless paused (or running)."""
        return self._move({"paused", "running"}, "running")

    def retune(self, knobs: Mapping[str, object]) -> list[Change]:
        """Queue knob changes (all valid or none); 409 once the run is stopping or finished."""
        if not knobs:
            raise ValidationError("no knobs given; send {knob: value}, e.g. {\"lr\": 0.001}", code="invalid_value")
        checked = [check_knob(k, v) for k, v in knobs.items()]
        with self._lock:
            if self.state not in ("running", "paused"):
                raise ConflictError(f"the run is {self.state}: knobs change while it is running or paused"
                                    + (" (give them as start overrides)" if self.state == "waiting" else ""),
                                    code=f"run_{self.state}")
            changes = [Change(k, v) for k, v in checked]
            self._queue.extend(changes)
            self._lock.notify_all()
        return changes

    def stop(self) -> ControlStatus:
        """End the run cleanly: the current update finishes, then the checkpoint (a waiting run just ends)."""
        with self._lock:
            if self.state in ("waiting", "running", "paused"):
                self.state = "stopping"
                for ev in self._stops:
                    ev.set()
                self._lock.notify_all()
        return self.status()

    # -- what the flow's loop calls ---------------------------------------------------------------
    def bind(self, stop: threading.Event) -> None:
        """A :meth:`stop` also sets ``stop`` (the session's event: the loop and the workers watch it)."""
        with self._lock:
            self._stops.append(stop)
            if self.state in ("stopping", "finished"):
                stop.set()

    def wait_for_start(self, stop: threading.Event, poll_s: float = 0.2) -> _Started | None:
        """Block until a client starts the run: what ``check_start`` made of its overrides; None when the
        run was stopped (a client's stop or ``stop``: Ctrl-C) first."""
        with self._lock:
            while self.state == "waiting" and not stop.is_set():
                self._lock.wait(poll_s)
            if self.state == "waiting":
                self.state = "stopping"
            return self.started_with if self.state in ("running", "paused") else None

    def hold_while_paused(self, stop: threading.Event, poll_s: float = 0.2) -> None:
        """Return once the run is not paused (or ``stop`` is set)."""
        with self._lock:
            self._held = self.state == "paused"
            while self.state == "paused" and not stop.is_set():
                self._lock.wait(poll_s)
            self._held = False

    @property
    def paused(self) -> bool:
        return self.state == "paused"

    def halt(self, stop: threading.Event) -> _Halt:
        """An event-like ``is_set()``: ``stop`` or a pause, so a pause ends the wait for a batch at once."""
        return _Halt(self, stop)

    def take_changes(self) -> list[Change]:
        """The queued changes, oldest first, removed from the queue (the loop applies them)."""
        with self._lock:
            out, self._queue = self._queue, []
            return out

    def mark_applied(self, change: Change, version: int) -> Change:
        """Record ``change`` as applied at policy ``version``; the knob takes its value."""
        done = Change(change.knob, change.value, change.requested_at, version, time.time())
        with self._lock:
            self.knobs[change.knob] = change.value
            self.applied.append(done)
        return done

    def progress(self, updates_done: int, version: int) -> None:
        """The loop's progress, for :meth:`status`."""
        with self._lock:
            self.updates_done, self.version = updates_done, version

    def finish(self) -> None:
        """The run ended (whatever the reason)."""
        with self._lock:
            self.state = "finished"
            self._lock.notify_all()

    def _move(self, allowed: set[str], to: str) -> ControlStatus:
        with self._lock:
            if self.state not in allowed:
                raise ConflictError(f"the run is {self.state}; it can be {'paused' if to == 'paused' else 'resumed'} "
                                    f"only while {' or '.join(sorted(allowed))}", code=f"run_{self.state}")
            self.state = to
            self._lock.notify_all()
        return self.status()


@dataclass(frozen=True)
class _Halt:
    control: Control
    stop: threading.Event

    def is_set(self) -> bool:
        return self.stop.is_set() or self.control.paused
