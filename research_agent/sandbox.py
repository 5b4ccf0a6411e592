"""Run generated task code in a child process with time, memory and network limits.

Parent side: :func:`run_sandboxed` starts ``python -m research_agent.sandbox <mode>`` with the
payload on stdin, ``RLIMIT_AS`` / ``RLIMIT_CPU`` / ``RLIMIT_FSIZE`` set before exec, a wall-clock
timeout, a scratch working directory, and returns a :class:`SandboxResult` (a failure, a crash
or a timeout is a result, never an exception).

Child side: an audit hook refuses sockets to anything but loopback (``socket.connect``,
``socket.getaddrinfo``, ``sendto``) and refuses starting processes; then one mode runs:

- ``check``: import and signature checks, instance determinism, the package's own reward tests,
  property checks of ``compute_reward`` (finite float in [low, high], deterministic, malformed
  answers handled) and the spec's worked examples as oracle answers;
- ``episodes``: K prompt groups through a real gateway with the swarm client.

The audit hook is a guard against mistakes in generated code, not a boundary against hostile code.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Limits", "SandboxResult", "run_sandboxed", "MALFORMED_ANSWERS"]

REPO = Path(__file__).resolve().parents[1]
MARK = "@@SANDBOX-RESULT@@ "
LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0"}
MALFORMED_ANSWERS: tuple[Any, ...] = (None, "", "   ", "???", "<|im_end|>", '{"answer": ', "-1e309", "NaN",
                                      "x" * 2000, "1/0", "\u00e9\u00e8\u2603")


@dataclass
class Limits:
    timeout_s: float = 180.0
    cpu_s: int = 300
    memory_mb: int = 4096
    file_mb: int = 64


@dataclass
class SandboxResult:
    ok: bool                      # the child ran to the end and reported
    data: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    stderr_tail: str = ""
    seconds: float = 0.0

    @property
    def error(self) -> str:
        if self.timed_out:
            return "timed out (wall-clock limit)"
        if not self.ok:
            return f"sandbox process exited with {self.returncode}:\n{self.stderr_tail}"
        return ""


def _set_limits(limits: Limits) -> Any:
    def apply() -> None:
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        fsize = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        os.setsid()  # its own process group, so a timeout kills everything it started

    return apply


def run_sandboxed(mode: str, payload: dict[str, Any], import_root: Path, limits: Limits | None = None) -> SandboxResult:
    """Run one child mode; ``import_root`` goes first on its ``PYTHONPATH`` (where the package lives)."""
    limits = limits or Limits()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RESEARCH_AGENT_"))}
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(import_root), str(REPO)]))
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "NO_PROXY": "*", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="ra-sandbox-") as cwd:
        proc = subprocess.Popen([sys.executable, "-m", "research_agent.sandbox", mode], cwd=cwd, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_set_limits(limits))
        try:
            out, err = proc.communicate(json.dumps(payload), timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, err = proc.communicate()
            return SandboxResult(False, {}, proc.returncode, True, (err or "")[-4000:], time.time() - t0)
    data: dict[str, Any] = {}
    for line in (out or "").splitlines():
        if line.startswith(MARK):
            data = json.loads(line[len(MARK):])
    return SandboxResult(bool(data) and proc.returncode == 0, data, proc.returncode, False, (err or "")[-4000:],
                         time.time() - t0)


# ---------------------------------------------------------------- child side

def _install_guard() -> None:
    def host_ok(host: Any) -> bool:
        if isinstance(host, bytes):
            host = host.decode(errors="replace")
        return host is None or str(host) in LOOPBACK or str(host).startswith("127.")

    def hook(event: str, args: tuple) -> None:
        if event in ("socket.connect", "socket.sendto"):
            addr = args[1]
            if isinstance(addr, tuple) and not host_ok(addr[0]):
                raise PermissionError(f"sandbox: network access to {addr[0]} is not allowed (loopback only)")
        elif event == "socket.getaddrinfo" and not host_ok(args[0]):
            raise PermissionError(f"sandbox: name lookup of {args[0]} is not allowed (loopback only)")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty"):
            raise PermissionError(f"sandbox: starting processes ({event}) is not allowed in task code")

    sys.addaudithook(hook)


def _tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]


class _Checks:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool, detail: str = "", warn: bool = False) -> bool:
        self.items.append({"name": name, "ok": bool(ok), "detail": detail, "warn": warn})
        return ok

    def run(self, name: str, fn: Any) -> Any:
        """Run ``fn``; an exception becomes a failed check with its traceback."""
        try:
            result = fn()
        except Exception as exc:  # generated code may raise anything; it is reported, not raised
            self.add(name, False, _tb(exc))
            return None
        self.add(name, True)
        return result


def _arity(fn: Any) -> int:
    return len([p for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty])


def _score(compute: Any, instance: dict[str, Any], answer: Any, low: float, high: float) -> tuple[bool, str, float]:
    parts = compute(instance, answer)
    if not isinstance(parts, dict) or "reward" not in parts:
        return False, f"compute_reward returned {type(parts).__name__}, not a dict with 'reward'", 0.0
    r = parts["reward"]
    if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(float(r)):
        return False, f"reward {r!r} is not a finite float", 0.0
    if not low - 1e-9 <= float(r) <= high + 1e-9:
        return False, f"reward {r} is outside [{low}, {high}]", float(r)
    bad = [k for k, v in parts.items() if isinstance(v, bool) or not isinstance(v, int | float)]
    if bad:
        return False, f"reward parts {bad} are not numbers (MLflow logs floats)", float(r)
    if compute(instance, answer) != parts:
        return False, "compute_reward is not deterministic (two calls differ)", float(r)
    return True, "", float(r)


def check(payload: dict[str, Any]) -> dict[str, Any]:
    import importlib

    c = _Checks()
    module, low, high = payload["module"], float(payload["low"]), float(payload["high"])
    mod = c.run("import package", lambda: importlib.import_module(module))
    reward_mod = c.run("import reward module", lambda: importlib.import_module(f"{module}.reward"))
    if mod is None or reward_mod is None:
        return {"checks": c.items}
    for fn_name, n in (("make_instance", 1), ("run_episode", 2)):
        fn = getattr(mod, fn_name, None)
        c.add(f"signature {fn_name}", callable(fn) and _arity(fn) == n,
              "" if callable(fn) and _arity(fn) == n else f"{module}.{fn_name} must be a function of {n} argument(s)")
    compute = getattr(reward_mod, "compute_reward", None)
    if not c.add("signature compute_reward", callable(compute) and _arity(compute) == 2,
                 "" if callable(compute) else "reward.py must define compute_reward(instance, answer)"):
        return {"checks": c.items}
    instances: list[dict[str, Any]] = []

    def make_all() -> None:
        for s in range(int(payload.get("seeds", 8))):
            inst = mod.make_instance(s)
            if not isinstance(inst, dict):
                raise TypeError(f"make_instance({s}) returned {type(inst).__name__}, not a dict")
            if json.dumps(inst, sort_keys=True) != json.dumps(mod.make_instance(s), sort_keys=True):
                raise AssertionError(f"make_instance({s}) is not deterministic in the seed")
            instances.append(inst)

    c.run("instances deterministic and JSON-serialisable", make_all)
    distinct = len({json.dumps(i, sort_keys=True) for i in instances})
    c.add("instances vary with the seed", distinct > 1 or len(instances) <= 1, f"{distinct} distinct of {len(instances)}",
          warn=True)
    tests = c.run("import test_reward", lambda: importlib.import_module(f"{module}.test_reward"))
    if tests is not None:
        names = [n for n in dir(tests) if n.startswith("test_") and callable(getattr(tests, n))]
        c.add("package has reward tests", bool(names), "" if names else "test_reward.py defines no test_* function")
        for n in names:
            c.run(f"package test {n}", getattr(tests, n))
    failures = []
    for inst in instances[:4]:
        for ans in MALFORMED_ANSWERS:
            try:
                ok, why, _ = _score(compute, inst, ans, low, high)
            except Exception as exc:  # reported as a property failure
                ok, why = False, _tb(exc)
            if not ok:
                failures.append(f"compute_reward(make_instance(..), {ans!r:.40}): {why}")
    c.add("property: malformed answers score in range, deterministically", not failures, "\n".join(failures[:4]))
    oracle = []
    problems = []
    for i, ex in enumerate(payload.get("examples", [])):
        try:
            ok, why, r = _score(compute, ex["instance"], ex["answer"], low, high)
        except Exception as exc:  # reported as an oracle failure
            ok, why, r = False, _tb(exc), float("nan")
        if ok and abs(r - float(ex["reward"])) > 1e-6:
            ok, why = False, f"expected reward {ex['reward']}, got {r}"
        if not ok:
            problems.append(f"worked example {i} (answer {ex['answer']!r:.60}): {why}")
        else:
            oracle.append(r)
    c.add("oracle: worked examples get their stated rewards", not problems, "\n".join(problems[:4]))
    return {"checks": c.items, "oracle_rewards": oracle}


def episodes(payload: dict[str, Any]) -> dict[str, Any]:
    """Run ``groups`` x ``group_size`` episodes one by one; agent errors are collected with tracebacks."""
    from swarm.client.sdk import SwarmClient
    from swarm.client.task import load_task
    from swarm.client.worker import WorkerConfig, run_one_episode

    errors: list[str] = []
    rewards: dict[str, list[float]] = {}
    try:
        task = load_task(payload["module"])
    except Exception as exc:  # reported to the repair loop
        return {"errors": [_tb(exc)], "rewards": {}}
    cfg = WorkerConfig(server=payload["server"], task=payload["module"], workers=1,
                       group_size=int(payload["group_size"]), temperature=float(payload.get("temperature", 1.0)),
                       max_tokens=int(payload.get("max_tokens", 32)),
                       episode_timeout_s=float(payload.get("episode_timeout_s", 60)), client_id="research-agent")
    with SwarmClient(cfg.server) as client:
        for g in range(int(payload["groups"])):
            seed = int(payload.get("seed", 0)) + g
            group = f"{task.name}-{seed}"
            for _ in range(cfg.group_size):
                try:
                    parts = run_one_episode(client, task, cfg, seed, group)
                    rewards.setdefault(group, []).append(float(parts["reward"]))
                except Exception as exc:  # the agent's failure is the result
                    errors.append(_tb(exc))
    return {"errors": errors[:3], "n_errors": len(errors), "rewards": rewards}


def _main() -> None:
    mode = sys.argv[1]
    payload = json.loads(sys.stdin.read())
    _install_guard()
    result = {"check": check, "episodes": episodes}[mode](payload)
    sys.stdout.write("\n" + MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _main()
