"""The sandbox: escapes (network, processes, ctypes, files) refused under bubblewrap and under the guard
fallback, and reported to the LLM; memory, process and wall-clock limits; a broken reward is a result.

No test can put a packet on the real network: every send goes to TEST-NET-1 (192.0.2.1) and only after
the package itself has checked that the guard refuses that very audit event (so the real call is
refused before any syscall) or that its network namespace holds nothing but ``lo``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ra_scripted import SPEC

from research_agent.isolation import detect
from research_agent.repair import repair_messages
from research_agent.sandbox import Limits, run_sandboxed
from research_agent.spec import parse_spec
from research_agent.validate import ValidationReport

EXAMPLES = [{"instance": {}, "answer": "a", "reward": 1.0}, {"instance": {}, "answer": "b", "reward": 0.0}]
BWRAP = detect("auto")
if os.environ.get("RA_REQUIRE_BUBBLEWRAP") and not BWRAP.isolated:  # set by .ci/run once bwrap is installed
    raise RuntimeError(f"RA_REQUIRE_BUBBLEWRAP is set but {BWRAP.detail}")
MODES = [pytest.param("bubblewrap", marks=pytest.mark.skipif(
             not BWRAP.isolated, reason=f"no OS isolation here: {BWRAP.detail} (CI installs bubblewrap)")),
         "guard"]

SAFE = '''import multiprocessing, os, socket, sys
ADDR = ("192.0.2.1", 9)  # TEST-NET-1 (RFC 5737)


def _target(event, sock):
    """ADDR, only when a send cannot leave this machine."""
    try:
        sys.audit(event, sock, ADDR)  # the guard refuses the same event the real call raises
    except PermissionError:
        return ADDR
    if {n for _, n in socket.if_nameindex()} != {"lo"}:
        raise RuntimeError("TEST SAFETY: neither guarded nor network-isolated; not sending")
    return ADDR


def _child(q):
    try:
        s = socket.socket()
        s.settimeout(2)
        s.connect(_target("socket.connect", s))
        q.put("connected")
    except Exception as exc:
        q.put(repr(exc))


def _spawn(method):
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    got = q.get(timeout=60)
    p.join()
    raise RuntimeError(f"{method} child: {got}")
'''

ESCAPES = {  # name -> (code run by make_instance, what bubblewrap's refusal says, what the guard's says)
    "tcp": ("s = socket.socket(); s.settimeout(2); s.connect(_target('socket.connect', s))",
            "Network is unreachable", "network access to 192.0.2.1 (socket.connect"),
    "udp_sendto": ("u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b'x', _target('socket.sendto', u))",
                   "Network is unreachable", "network access to 192.0.2.1 (socket.sendto"),
    "udp_sendmsg": ("u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                    "u.sendmsg([b'x'], [], 0, _target('socket.sendmsg', u))",
                    "Network is unreachable", "network access to 192.0.2.1 (socket.sendmsg"),
    "mp_spawn": ("_spawn('spawn')",
                 "spawn child: OSError(101, 'Network is unreachable')", "starting processes (_posixsubprocess"),
    "mp_forkserver": ("_spawn('forkserver')",
                      "forkserver child: OSError(101, 'Network is unreachable')", "starting processes"),
    "posix_spawn": ("pid = os.posix_spawn('/bin/sh', ['sh', '-c', 'echo escaped > {outside}'], dict(os.environ))\n"
                    "raise RuntimeError(f'posix_spawn: sh exited {{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}}')",
                    "posix_spawn: sh exited 2", "starting processes (os.posix_spawn)"),
    "ctypes_system": ("import ctypes\nrc = ctypes.CDLL(None).system(b'echo escaped > {outside}')\n"
                      "raise RuntimeError(f'system() returned {{rc}}')",
                      "system() returned 512", "ctypes foreign functions (ctypes.dlopen"),
    "write_outside": ("open('{outside}', 'w').write('escaped')", "Read-only file system", "outside the scratch dir"),
}


def _package(root: Path, init: str, reward: str = "def compute_reward(instance, answer):\n    return {'reward': float(answer == 'a')}\n") -> None:
    pkg = root / "gen" / "t"
    pkg.mkdir(parents=True)
    root.chmod(0o755)  # readable by the sandbox's unprivileged user (pytest's tmp dirs are 0700)
    (pkg / "__init__.py").write_text(init)
    (pkg / "reward.py").write_text(reward)
    (pkg / "test_reward.py").write_text("def test_ok():\n    assert True\n")


def _check(root: Path, limits: Limits | None = None, isolation: str = "auto"):
    return run_sandboxed("check", {"module": "gen.t", "low": 0.0, "high": 1.0, "seeds": 2, "examples": EXAMPLES},
                         root, limits or Limits(timeout_s=90), isolation)


def _failed(res) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in res.data["checks"] if not c["ok"]}


OK_INIT = "def make_instance(seed):\n    return {'s': seed}\n\ndef run_episode(instance, llm):\n    return {'reward': 0.0}\n"


@pytest.mark.parametrize("mode", MODES)
def test_a_good_package_passes_and_loopback_works(tmp_path: Path, mode: str) -> None:
    loopback = ("import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                "socket.create_connection(s.getsockname()).close(); s.close()\n")
    _package(tmp_path, loopback + OK_INIT)
    res = _check(tmp_path, isolation=mode)
    assert res.ok and not _failed(res), res
    assert res.isolation is not None and res.isolation.kind == mode
    assert sorted(res.data["oracle_rewards"]) == [0.0, 1.0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_escapes_are_refused_and_reported_to_the_llm(tmp_path: Path, mode: str, escape: str) -> None:
    outside = tmp_path / "outside.txt"
    code, by_bwrap, by_guard = ESCAPES[escape]
    body = "\n".join("    " + line for line in code.format(outside=outside).splitlines())
    _package(tmp_path, SAFE + f"\n\ndef make_instance(seed):\n{body}\n    return {{'s': seed}}\n\n\n"
                       "def run_episode(instance, llm):\n    return {'reward': 0.0}\n")
    res = _check(tmp_path, isolation=mode)
    detail = _failed(res).get("instances deterministic and JSON-serialisable", "")
    assert "TEST SAFETY" not in detail
    assert (by_bwrap if mode == "bubblewrap" else by_guard) in detail, detail
    assert not outside.exists()
    # the refusal reaches the LLM in the repair prompt
    report = ValidationReport()
    for c in res.data["checks"]:
        report.add(c["name"], c["ok"], c["detail"])
    prompt = repair_messages(parse_spec(SPEC), {"__init__.py": "..."}, report)[1]["content"]
    assert (by_bwrap if mode == "bubblewrap" else by_guard) in prompt


@pytest.mark.parametrize("mode", MODES)
def test_memory_and_time_limits(tmp_path: Path, mode: str) -> None:
    _package(tmp_path, "BIG = bytearray(3 * 1024 ** 3)\n" + OK_INIT)
    res = _check(tmp_path, Limits(timeout_s=60, memory_mb=1024), mode)
    assert "MemoryError" in _failed(res)["import package"]
    _package(tmp_path / "b", "while True:\n    pass\n" + OK_INIT)
    res = _check(tmp_path / "b", Limits(timeout_s=3), mode)
    assert not res.ok and res.timed_out and "timed out" in res.error


@pytest.mark.skipif(not BWRAP.isolated, reason=f"no OS isolation here: {BWRAP.detail} (CI installs bubblewrap)")
def test_process_limit_in_the_sandbox(tmp_path: Path) -> None:
    forks = ("import os, time\nkids = []\ntry:\n    for _ in range(200):\n        pid = os.fork()\n"
             "        if pid == 0:\n            time.sleep(3)\n            os._exit(0)\n        kids.append(pid)\n"
             "finally:\n    N = len(kids)\nraise RuntimeError(f'forked {N}')\n")
    _package(tmp_path, forks + OK_INIT)
    detail = _failed(_check(tmp_path, Limits(timeout_s=60, processes=32), "bubblewrap"))["import package"]
    assert "Resource temporarily unavailable" in detail and "forked" not in detail.splitlines()[-1]


def test_broken_reward_is_reported_not_raised(tmp_path: Path) -> None:
    _package(tmp_path, OK_INIT, "def compute_reward(instance, answer):\n    return {'reward': len(answer) * 1.0}\n")
    failed = _failed(_check(tmp_path))
    assert "TypeError" in failed["property: malformed answers score in range, deterministically"]
    assert "oracle: worked examples get their stated rewards" in failed


def test_a_check_that_could_not_run_is_a_failure(tmp_path: Path) -> None:
    _package(tmp_path, "def make_instance(seed):\n    raise ValueError('no data')\n\n"
                       "def run_episode(instance, llm):\n    return {'reward': 0.0}\n")
    failed = _failed(_check(tmp_path))
    assert "ValueError: no data" in failed["instances deterministic and JSON-serialisable"]
    assert "could not run" in failed["property: malformed answers score in range, deterministically"]
