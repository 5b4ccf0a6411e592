"""OS isolation for generated task code: the bubblewrap command line, and whether it works here.

Generated code comes from an LLM, so validation runs it inside bubblewrap (``bwrap``, Debian's
``bubblewrap`` package) when the machine has it:

- its own network namespace: only a private loopback (the dry-run gateway runs inside it too),
  no route to anything else;
- its own PID, IPC and UTS namespaces, a new session, killed with its parent;
- a read-only view of what Python needs (the interpreter, the venv, the project, the package
  being validated, the dry-run model) and nothing else of the host; one writable scratch dir;
- run as an unprivileged user (``nobody`` via util-linux ``setpriv`` when we are root), so the
  kernel enforces ``RLIMIT_NPROC`` (processes and threads) besides the memory, CPU and file-size
  limits the parent sets.

Where bwrap is missing or cannot create namespaces (a container without the privilege), the
caller falls back to the audit-hook guard of :mod:`research_agent.guard` and must say so loudly.
This module builds command lines and probes once; it does not run generated code itself.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Isolation", "detect", "bwrap_command", "readable_paths", "readable_copy", "SANDBOX_UID", "MODES"]

SANDBOX_UID = 65534  # nobody: not root, so RLIMIT_NPROC applies and host files owned by root stay unwritable
MODES = ("auto", "bubblewrap", "guard")
_ETC = ("/etc/passwd", "/etc/group", "/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/hosts")


@dataclass(frozen=True)
class Isolation:
    """Which isolation a sandbox run gets: ``bubblewrap`` or ``guard`` (with the reason why not bwrap)."""

    kind: str
    detail: str

    @property
    def isolated(self) -> bool:
        return self.kind == "bubblewrap"

    def describe(self) -> str:
        """One line for reports and the terminal."""
        if self.isolated:
            return (f"isolation: bubblewrap ({self.detail}): private loopback only, read-only project and venv, "
                    "writable scratch dir, unprivileged user, memory/process/CPU/time limits")
        return (f"NOT ISOLATED: {self.detail}; falling back to the in-process guard (audit hook + rlimits), which "
                "catches mistakes but is not a boundary against hostile code. Install bubblewrap "
                "(apt-get install bubblewrap) for real isolation.")


def readable_paths(extra: list[Path] | tuple[Path, ...] = ()) -> list[Path]:
    """What the sandbox may read: the interpreter and venv, every directory on ``sys.path``, and ``extra``."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent]
    paths += [Path(p) for p in sys.path if p and Path(p).is_dir()]
    paths += [Path(p) for p in extra]
    out: list[Path] = []
    for p in sorted({p.resolve() for p in paths if p.exists()}, key=lambda q: len(q.parts)):
        if p == Path("/") or any(p.is_relative_to(q) for q in out):
            continue  # already visible through a parent
        out.append(p)
    return out


def _system_binds() -> list[str]:
    args: list[str] = []
    for top in ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/lib32", "/libx32"):
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    for f in _ETC:
        args += ["--ro-bind-try", f, f]
    return args


def bwrap_command(scratch: Path, readable: list[Path], bwrap: str | None = None) -> list[str]:
    """The ``bwrap ... --`` prefix (and ``setpriv`` when root) that runs a command in the sandbox."""
    bwrap = bwrap or shutil.which("bwrap") or "bwrap"
    args = [bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session"]
    root = os.geteuid() == 0
    if not root:
        args += ["--unshare-user"]  # an unprivileged bwrap needs a user namespace for the others
    args += _system_binds() + ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/dev/shm"]
    binds = [p for p in readable if p != scratch]
    dirs: set[Path] = set()
    for p in binds + [scratch]:
        for parent in p.parents:
            if parent != Path("/") and not any(parent.is_relative_to(b) for b in binds):
                dirs.add(parent)
    for d in sorted(dirs, key=lambda q: len(q.parts)):  # traversable by the unprivileged user
        args += ["--perms", "0755", "--dir", str(d)]
    for p in binds:
        args += ["--ro-bind", str(p), str(p)]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch), "--"]
    if root:
        args += ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--"]
    return args


@functools.cache
def readable_copy(path: Path) -> Path:
    """``path`` itself, or (as root, when the sandbox user could not read it) a world-readable copy.

    The copy lives in a temporary folder for the life of this process (e.g. the tiny checkpoint,
    which its cache writes 0700).
    """
    import atexit
    import stat
    import tempfile

    if os.geteuid() != 0:
        return path
    readable = all(os.stat(p).st_mode & (stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0))
                   for p in [path, *path.rglob("*")] if not p.is_symlink())
    if readable:
        return path
    tmp = Path(tempfile.mkdtemp(prefix="ra-readable-"))
    atexit.register(shutil.rmtree, tmp, True)
    copy = Path(shutil.copytree(path, tmp / path.name, symlinks=True))
    for p in [tmp, copy, *copy.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    return copy


@functools.cache
def _probe(bwrap: str) -> str:
    """'' when bwrap can build the sandbox here (a private loopback that is up), else why not."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ra-probe-") as tmp:
        scratch = Path(tmp)
        if os.geteuid() == 0:
            os.chown(scratch, SANDBOX_UID, SANDBOX_UID)
        cmd = bwrap_command(scratch, readable_paths(), bwrap) + [
            sys.executable, "-c", "import socket; print(sorted(n for _, n in socket.if_nameindex()))"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap failed to start: {exc}"
    if proc.returncode != 0:
        return f"bwrap cannot create the sandbox here: {proc.stderr.strip()[-300:]}"
    if proc.stdout.strip() != "['lo']":
        return f"bwrap's sandbox sees network interfaces {proc.stdout.strip()} (expected only lo)"
    return ""


def detect(mode: str = "auto") -> Isolation:
    """``auto``: bubblewrap when it works here, else the guard; ``bubblewrap``: required; ``guard``: by choice."""
    if mode not in MODES:
        raise ValueError(f"validate.isolation={mode!r} is unknown; use one of {', '.join(MODES)}")
    if mode == "guard":
        return Isolation("guard", "validate.isolation=guard was chosen")
    bwrap = shutil.which("bwrap")
    why = "bubblewrap (bwrap) is not installed" if bwrap is None else _probe(bwrap)
    if not why:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()  # type: ignore[list-item]
        return Isolation("bubblewrap", version or bwrap or "bwrap")
    if mode == "bubblewrap":
        raise RuntimeError(f"validate.isolation=bubblewrap but {why}")
    return Isolation("guard", why)
