"""The sandbox: generated code gets loopback-only network, no subprocesses, and time/memory limits."""

from __future__ import annotations

from pathlib import Path

from research_agent.sandbox import Limits, run_sandboxed

EXAMPLES = [{"instance": {}, "answer": "a", "reward": 1.0}, {"instance": {}, "answer": "b", "reward": 0.0}]


def _package(root: Path, init: str, reward: str = "def compute_reward(instance, answer):\n    return {'reward': float(answer == 'a')}\n") -> None:
    pkg = root / "gen" / "t"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(init)
    (pkg / "reward.py").write_text(reward)
    (pkg / "test_reward.py").write_text("def test_ok():\n    assert True\n")


def _check(root: Path, limits: Limits | None = None):
    return run_sandboxed("check", {"module": "gen.t", "low": 0.0, "high": 1.0, "seeds": 2, "examples": EXAMPLES},
                         root, limits or Limits(timeout_s=60))


def _failed(res) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in res.data["checks"] if not c["ok"]}


OK_INIT = "def make_instance(seed):\n    return {'s': seed}\n\ndef run_episode(instance, llm):\n    return {'reward': 0.0}\n"


def test_a_good_package_passes(tmp_path: Path) -> None:
    _package(tmp_path, OK_INIT)
    res = _check(tmp_path)
    assert res.ok and not _failed(res), res
    assert sorted(res.data["oracle_rewards"]) == [0.0, 1.0]


def test_outside_network_and_processes_are_refused(tmp_path: Path) -> None:
    guarded = ("import socket, subprocess\n"
               "try:\n    socket.create_connection(('10.255.255.1', 80), timeout=1)\n    NET = 'connected'\n"
               "except PermissionError as e:\n    NET = str(e)\n"
               "try:\n    subprocess.run(['true'])\n    PROC = 'ran'\n"
               "except PermissionError as e:\n    PROC = str(e)\n"
               "assert 'loopback only' in NET, NET\n"
               "assert 'starting processes' in PROC, PROC\n"
               "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
               "socket.create_connection(s.getsockname()).close(); s.close()\n")  # loopback is allowed
    _package(tmp_path, guarded + OK_INIT)
    res = _check(tmp_path)
    assert res.ok and not _failed(res), _failed(res)
    _package(tmp_path / "b", "import socket\nsocket.getaddrinfo('example.com', 443)\n" + OK_INIT)
    assert "not allowed (loopback only)" in _failed(_check(tmp_path / "b"))["import package"]


def test_memory_and_time_limits(tmp_path: Path) -> None:
    _package(tmp_path, "BIG = bytearray(3 * 1024 ** 3)\n" + OK_INIT)
    res = _check(tmp_path, Limits(timeout_s=60, memory_mb=1024))
    assert "MemoryError" in _failed(res)["import package"]
    _package(tmp_path / "b", "while True:\n    pass\n" + OK_INIT)
    res = _check(tmp_path / "b", Limits(timeout_s=3))
    assert not res.ok and res.timed_out and "timed out" in res.error


def test_broken_reward_is_reported_not_raised(tmp_path: Path) -> None:
    _package(tmp_path, OK_INIT, "def compute_reward(instance, answer):\n    return {'reward': len(answer) * 1.0}\n")
    failed = _failed(_check(tmp_path))
    assert "TypeError" in failed["property: malformed answers score in range, deterministically"]
    assert "oracle: worked examples get their stated rewards" in failed
