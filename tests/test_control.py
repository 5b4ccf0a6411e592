"""Run control state (swarm.control): transitions, start overrides, refused knobs and values, concurrency."""

from __future__ import annotations

import threading

import pytest

from swarm.control import KNOBS, Control, check_knob
from swarm.errors import ConflictError, ValidationError

KNOB_VALUES = {"lr": 1e-3, "strategy": "groups", "min_groups": 1, "min_episodes": 1, "max_staleness": 1,
               "eval_every": 0, "updates": 5}


def _waiting(check=None) -> Control:
    return Control(KNOB_VALUES, wait_for_client=True, check_start=check or (lambda o: (dict(o), {})))


def test_transitions_waiting_running_paused_stopping_finished() -> None:
    c = _waiting()
    stop = threading.Event()
    c.bind(stop)
    assert c.status()["state"] == "waiting" and c.status()["holder"] is None
    with pytest.raises(ConflictError, match="pause"):
        c.pause()
    with pytest.raises(ConflictError, match="start overrides"):
        c.retune({"lr": 0.1})
    out = c.start({"lr": 0.01, "train.updates": 3}, holder="laptop:1")
    assert out["state"] == "running" and out["holder"] == "laptop:1"
    assert c.wait_for_start(stop) == {"algo.lr": 0.01, "train.updates": 3}  # short names become config keys
    with pytest.raises(ConflictError, match="two runs cannot train one policy"):
        c.start({}, holder="other")
    assert c.pause()["state"] == "paused" and c.paused
    assert c.pause()["state"] == "paused"  # idempotent
    assert c.resume()["state"] == "running"
    assert not stop.is_set()
    assert c.stop()["state"] == "stopping" and stop.is_set()
    with pytest.raises(ConflictError):
        c.resume()
    with pytest.raises(ConflictError):
        c.retune({"lr": 0.1})
    c.finish()
    assert c.status()["state"] == "finished"


def test_a_run_without_wait_for_client_is_running_at_once_and_refuses_start() -> None:
    c = Control(KNOB_VALUES)
    assert c.status()["state"] == "running"
    with pytest.raises(ConflictError, match="already running"):
        c.start({})


def test_stop_while_waiting_ends_the_wait() -> None:
    c = _waiting()
    stop = threading.Event()
    got: list = []
    t = threading.Thread(target=lambda: got.append(c.wait_for_start(stop)))
    t.start()
    c.stop()
    t.join(5)
    assert got == [None] and c.status()["state"] == "stopping"
    ctrl_c = _waiting()  # Ctrl-C: the session's event
    ev = threading.Event()
    ev.set()
    assert ctrl_c.wait_for_start(ev) is None


def test_start_refused_by_the_checker_stays_waiting() -> None:
    def check(o):
        raise ValidationError("model.path: fixed once the server waits", param="model.path")

    c = _waiting(check)
    with pytest.raises(ValidationError, match="model.path"):
        c.start({"model.path": "x"})
    assert c.status()["state"] == "waiting"


def test_start_overrides_set_the_knobs() -> None:
    c = _waiting(lambda o: ("cfg", {"lr": o["algo.lr"], "updates": 9}))
    c.start({"lr": 0.5})
    assert c.status()["knobs"]["lr"] == 0.5 and c.status()["updates_total"] == 9


@pytest.mark.parametrize("knob", ["algo.clip_eps", "model.path", "train.batch_timeout_s", "temperature"])
def test_unsafe_knob_is_refused_naming_it_and_listing_the_safe_ones(knob: str) -> None:
    c = Control(KNOB_VALUES)
    with pytest.raises(ValidationError) as exc:
        c.retune({"lr": 0.1, knob: 1})
    msg = str(exc.value)
    assert msg.startswith(f"{knob}:") and all(name in msg for name in KNOBS)
    assert c.take_changes() == []  # all or none


@pytest.mark.parametrize(("knob", "value"), [("lr", 0), ("lr", "fast"), ("lr", float("nan")), ("strategy", "big"),
                                             ("min_groups", 0), ("min_groups", 1.5), ("updates", True),
                                             ("max_staleness", -1), ("eval_every", "x")])
def test_bad_value_is_refused_naming_the_knob(knob: str, value) -> None:
    with pytest.raises(ValidationError, match=rf"^{knob}="):
        check_knob(knob, value)


def test_knobs_by_config_key_and_values_coerced() -> None:
    assert check_knob("algo.lr", "0.001") == ("lr", 0.001)
    assert check_knob("batching.min_groups", 2.0) == ("min_groups", 2)
    assert check_knob("train.max_staleness", None) == ("max_staleness", None)
    assert check_knob("task.eval_every", 0) == ("eval_every", 0)


def test_changes_queue_in_order_and_applied_changes_set_the_knobs() -> None:
    c = Control(KNOB_VALUES)
    c.retune({"lr": 0.1})
    c.retune({"batching.strategy": "episodes", "lr": 0.2})
    changes = c.take_changes()
    assert [(ch.knob, ch.value) for ch in changes] == [("lr", 0.1), ("strategy", "episodes"), ("lr", 0.2)]
    assert c.take_changes() == []
    for ch in changes:
        c.mark_applied(ch, version=3)
    st = c.status()
    assert st["knobs"]["lr"] == 0.2 and st["knobs"]["strategy"] == "episodes"
    assert [a["version"] for a in st["applied"]] == [3, 3, 3] and st["pending"] == []


def test_pause_halts_the_wait_and_hold_returns_on_resume() -> None:
    c = Control(KNOB_VALUES)
    stop = threading.Event()
    halt = c.halt(stop)
    assert not halt.is_set()
    c.pause()
    assert halt.is_set()
    done = threading.Event()
    t = threading.Thread(target=lambda: (c.hold_while_paused(stop), done.set()))
    t.start()
    assert not done.wait(0.3) and c.status()["held"]
    c.resume()
    assert done.wait(5) and not halt.is_set()


def test_concurrent_starts_one_wins_and_concurrent_retunes_all_queue() -> None:
    c = _waiting()
    results: list[str] = []
    barrier = threading.Barrier(16)

    def start(i: int) -> None:
        barrier.wait()
        try:
            c.start({}, holder=f"h{i}")
            results.append("ok")
        except ConflictError:
            results.append("409")

    threads = [threading.Thread(target=start, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["409"] * 15 + ["ok"]
    retunes = [threading.Thread(target=lambda i=i: c.retune({"min_groups": i + 1})) for i in range(50)]
    for t in retunes:
        t.start()
    for t in retunes:
        t.join()
    assert sorted(ch.value for ch in c.take_changes()) == list(range(1, 51))
