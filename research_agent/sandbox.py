"""Run generated task code in a child process: isolated by bubblewrap where possible, always limited.

Parent side: :func:`run_sandboxed` starts ``python -m research_agent.sandbox <mode>`` with the
payload on stdin, ``RLIMIT_AS`` / ``RLIMIT_CPU`` / ``RLIMIT_FSIZE`` set before exec, a wall-clock
timeout (the whole process group is killed), a fresh scratch dir as working and home directory,
an environment of known variables only (no API keys), and returns a :class:`SandboxResult` (a
failure, a crash or a timeout is a result, never an exception). The child runs inside
bubblewrap (:mod:`research_agent.isolation`: private loopback only, read-only project, writable
scratch, unprivileged, ``RLIMIT_NPROC``) when the machine has it; otherwise under the audit-hook
guard of :mod:`research_agent.guard`, and the result says which (``isolation``).

Child side, one mode:

- ``check``: import and signature checks, instance determinism, the package's own reward tests,
  property checks of ``compute_reward`` (finite float in [low, high], deterministic, malformed
  answers handled) and the spec's worked examples as oracle answers;
- ``episodes``: the dry run. The child starts the gateway (:func:`swarm.stack.start_stack`) with
  the dry-run policy on its own loopback and a pool in the scratch dir, runs K prompt groups (or
  K games of a ``run_multiagent`` task) through the swarm client, and reports what the pool holds.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from research_agent.isolation import SANDBOX_UID, Isolation, bwrap_command, detect, readable_paths

if TYPE_CHECKING:  # the sandbox imports swarm only inside the dry run
    from swarm.pool import Lookup

__all__ = ["Limits", "SandboxResult", "run_sandboxed", "MALFORMED_ANSWERS"]

REPO = Path(__file__).resolve().parents[1]
MARK = "@@SANDBOX-RESULT@@ "
MALFORMED_ANSWERS: tuple[Any, ...] = (None, "", "   ", "???", "<|im_end|>", '{"answer": ', "-1e309", "NaN",
                                      "x" * 2000, "1/0", "\u00e9\u00e8\u2603")
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NUM_THREADS")


@dataclass
class Limits:
    timeout_s: float = 180.0
    cpu_s: int = 300
    memory_mb: int = 4096
    file_mb: int = 64
    processes: int = 256      # RLIMIT_NPROC inside bubblewrap (threads count too)


@dataclass
class SandboxResult:
    ok: bool                      # the child ran to the end and reported
    data: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    stderr_tail: str = ""
    seconds: float = 0.0
    isolation: Isolation | None = None

    @property
    def error(self) -> str:
        if self.timed_out:
            return "timed out (wall-clock limit)"
        if not self.ok:
            return f"sandbox process exited with {self.returncode}:\n{self.stderr_tail}"
        return ""


def _set_limits(limits: Limits) -> Callable[[], None]:
    def apply() -> None:
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        fsize = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        os.setsid()  # its own process group, so a timeout kills everything it started

    return apply


def _env(import_root: Path, scratch: Path, isolation: Isolation, limits: Limits) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update({"PYTHONPATH": os.pathsep.join(dict.fromkeys([str(import_root), str(REPO)])),
                "HOME": str(scratch), "TMPDIR": str(scratch), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1", "NO_PROXY": "*", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "DO_NOT_TRACK": "true", "RA_SANDBOX_ISOLATION": isolation.kind,
                "RA_SANDBOX_NPROC": str(limits.processes), "RA_SANDBOX_SCRATCH": str(scratch)})
    return env


def run_sandboxed(mode: str, payload: dict[str, Any], import_root: Path, limits: Limits | None = None,
                  isolation: Isolation | str = "auto", readable: tuple[Path, ...] = ()) -> SandboxResult:
    """Run one child mode; ``import_root`` goes first on its ``PYTHONPATH`` (where the package lives).

    ``isolation`` is an :class:`Isolation` or a mode for :func:`research_agent.isolation.detect`;
    ``readable`` adds read-only paths the child needs (the dry-run model).
    """
    limits = limits or Limits()
    iso = isolation if isinstance(isolation, Isolation) else detect(isolation)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="ra-sandbox-") as tmp:
        scratch = Path(tmp).resolve()
        cmd = [sys.executable, "-m", "research_agent.sandbox", mode]
        if iso.isolated:
            if os.geteuid() == 0:
                os.chown(scratch, SANDBOX_UID, SANDBOX_UID)
            cmd = bwrap_command(scratch, readable_paths([Path(import_root), REPO, *readable])) + cmd
        proc = subprocess.Popen(cmd, cwd=scratch, env=_env(Path(import_root), scratch, iso, limits),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_set_limits(limits))
        try:
            out, err = proc.communicate(json.dumps(payload), timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, err = proc.communicate()
            return SandboxResult(False, {}, proc.returncode, True, (err or "")[-4000:], time.time() - t0, iso)
    data: dict[str, Any] = {}
    for line in (out or "").splitlines():
        if line.startswith(MARK):
            data = json.loads(line[len(MARK):])
    return SandboxResult(bool(data) and proc.returncode == 0, data, proc.returncode, False, (err or "")[-4000:],
                         time.time() - t0, iso)


# ---------------------------------------------------------------- child side

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


def _signatures(c: _Checks, mod: Any, module: str) -> None:
    """make_instance(seed), and run_episode(instance, llm) or run_multiagent(instance, client, group_id, cfg, kind)."""
    fn = getattr(mod, "make_instance", None)
    ok = callable(fn) and _arity(fn) == 1
    c.add("signature make_instance", ok, "" if ok else f"{module}.make_instance must be a function of 1 argument(s)")
    multi = getattr(mod, "run_multiagent", None)
    if callable(multi):
        params = inspect.signature(multi).parameters
        ok = _arity(multi) == 4 and "kind" in params
        c.add("signature run_multiagent", ok, "" if ok else
              f"{module}.run_multiagent must be run_multiagent(instance, client, group_id, cfg, kind='train')")
        return
    fn = getattr(mod, "run_episode", None)
    ok = callable(fn) and _arity(fn) == 2
    c.add("signature run_episode", ok, "" if ok else f"{module}.run_episode must be a function of 2 argument(s)")


def check(payload: dict[str, Any]) -> dict[str, Any]:
    import importlib

    c = _Checks()
    module, low, high = payload["module"], float(payload["low"]), float(payload["high"])
    mod = c.run("import package", lambda: importlib.import_module(module))
    reward_mod = c.run("import reward module", lambda: importlib.import_module(f"{module}.reward"))
    if mod is None or reward_mod is None:
        return {"checks": c.items}
    _signatures(c, mod, module)
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
    if not instances:  # a check that could not run is a failure, not a pass
        failures.append("could not run: make_instance gave no instance to score malformed answers against "
                        "(see the check 'instances deterministic and JSON-serialisable')")
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
    if not payload.get("examples"):
        problems.append("could not run: the spec has no worked examples")
    c.add("oracle: worked examples get their stated rewards", not problems, "\n".join(problems[:4]))
    return {"checks": c.items, "oracle_rewards": oracle}


def _backend(policy: str, model_path: str | None) -> Any:
    from swarm.policy import build_backend

    if policy == "echo":
        return build_backend("echo")
    if policy == "tiny":
        return build_backend("hf", model_path=model_path, policies=["default"])
    raise ValueError(f"validate.policy={policy!r} is unknown; use tiny or echo")


def _pool_summary(pool: Lookup, task: str) -> dict[str, Any]:
    """What the dry run left in the pool: episodes by status, episodes without steps, rewards by group."""
    from swarm.pool import StepFilter

    eps = pool.query_episodes(StepFilter(task=task), limit=10_000)
    finished = [e for e in eps if e.status.value == "finished"]
    with_steps = {st.episode_id for st in pool.query_steps(StepFilter(task=task), limit=100_000)}
    groups: dict[str, list[float]] = {}
    for e in finished:
        groups.setdefault(e.group_id or e.episode_id, []).append(float(e.reward or 0.0))
    return {"episodes": len(eps), "finished": len(finished),
            "without_steps": sum(1 for e in finished if e.episode_id not in with_steps), "groups": groups}


def episodes(payload: dict[str, Any], arm: Callable[[], None]) -> dict[str, Any]:
    """The dry run: a gateway on this sandbox's loopback, then ``groups`` groups (or games) one by one."""
    from swarm.client.sdk import SwarmClient
    from swarm.client.task import load_task
    from swarm.client.worker import WorkerConfig, run_one_episode
    from swarm.pool import Pool
    from swarm.stack import start_stack

    errors: list[str] = []
    pool = Pool(f"sqlite:///{Path(os.environ.get('RA_SANDBOX_SCRATCH', '.')) / 'dryrun-pool.db'}")
    try:
        with start_stack(pool, _backend(payload["policy"], payload.get("model_path"))) as stack:
            arm()  # trusted set-up done: from here on generated code runs
            try:
                task = load_task(payload["module"])
            except Exception as exc:  # reported to the repair loop
                return {"errors": [_tb(exc)], "n_errors": 1, "summary": _pool_summary(pool, payload["task"])}
            cfg = WorkerConfig(server=stack.url, task=payload["module"], workers=1,
                               group_size=int(payload["group_size"]), max_tokens=int(payload.get("max_tokens", 32)),
                               temperature=float(payload.get("temperature", 1.0)),
                               episode_timeout_s=float(payload.get("episode_timeout_s", 60)), client_id="research-agent")
            with SwarmClient(cfg.server) as client:
                for g in range(int(payload["groups"])):
                    seed = int(payload.get("seed", 0)) + g
                    group = f"{task.name}-{seed}"
                    runs = 1 if task.run_multiagent is not None else cfg.group_size  # a game is one group
                    for _ in range(runs):
                        try:
                            if task.run_multiagent is not None:
                                task.run_multiagent(task.make_instance(seed), client, group, cfg, kind="train")
                            else:
                                run_one_episode(client, task, cfg, seed, group)
                        except Exception as exc:  # the agent's failure is the result
                            errors.append(_tb(exc))
        return {"errors": errors[:3], "n_errors": len(errors), "multiagent": task.run_multiagent is not None,
                "summary": _pool_summary(pool, payload["task"])}
    finally:
        pool.close()


def _main() -> None:
    mode = sys.argv[1]
    payload = json.loads(sys.stdin.read())
    scratch = os.environ.get("RA_SANDBOX_SCRATCH", os.getcwd())
    if os.environ.get("RA_SANDBOX_ISOLATION") == "bubblewrap":
        # inside our own namespaces as an unprivileged user: the kernel enforces this
        n = int(os.environ.get("RA_SANDBOX_NPROC", "256"))
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))

        def arm() -> None:
            return None
    else:
        from research_agent.guard import install_guard

        def arm() -> None:
            install_guard(scratch)
    if mode == "check":
        arm()
        result = check(payload)
    else:
        result = episodes(payload, arm)
    ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    result["cpu_s"] = round(sum(r.ru_utime + r.ru_stime for r in ru), 3)  # the child's own CPU time
    sys.stdout.write("\n" + MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _main()
