"""The fallback guard: an audit hook that refuses what generated task code must not do.

Used only where OS isolation (:mod:`research_agent.isolation`) is unavailable, and then said
loudly. Installed in the sandbox child after the trusted set-up, it refuses with a
``PermissionError`` naming the rule:

- network to anything but loopback: ``socket.connect``, ``sendto``, ``sendmsg``, ``getaddrinfo``;
- starting processes: ``subprocess``, ``os.system`` / ``exec*`` / ``posix_spawn*`` / ``fork``, and
  ``multiprocessing``'s ``spawn`` / ``forkserver`` (they call ``_posixsubprocess.fork_exec``
  directly, which raises no audit event, so that function is replaced);
- ``ctypes`` loading or looking up foreign functions (``system()`` through libc);
- writing, creating, renaming, removing or linking files outside the scratch dir.

It catches mistakes in generated code. It is not a boundary against hostile code: Python code can
reach the OS in ways no audit hook sees. This module does not start or isolate processes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["install_guard", "LOOPBACK"]

LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0"}
_PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.posix_spawnp", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# event -> positions of the path arguments that must stay inside the scratch dir
_PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.chmod": (0,),
                "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,), "shutil.rmtree": (0,),
                "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1)}


def _refuse(what: str) -> None:
    raise PermissionError(f"sandbox guard: {what} is not allowed in task code")


def install_guard(scratch: Path | str) -> None:
    """Install the audit hook for the rest of this process; writes are allowed under ``scratch`` only."""
    root = os.path.realpath(scratch)

    def host_ok(host: Any) -> bool:
        if isinstance(host, bytes):
            host = host.decode(errors="replace")
        return host is None or str(host) in LOOPBACK or str(host).startswith("127.")

    def inside(path: Any) -> bool:
        if isinstance(path, int):
            return True  # a file descriptor the process already holds
        try:
            p = os.path.normpath(os.path.join(root, os.fsdecode(os.fspath(path))))
        except TypeError:
            return False
        return p == root or p.startswith(root + os.sep) or p == os.devnull

    def hook(event: str, args: tuple) -> None:
        if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
            addr = args[1] if len(args) > 1 else None
            if isinstance(addr, tuple) and not host_ok(addr[0]):
                _refuse(f"network access to {addr[0]} ({event}; loopback only)")
        elif event == "socket.getaddrinfo" and not host_ok(args[0]):
            _refuse(f"name lookup of {args[0]} (loopback only)")
        elif event in _PROCESS_EVENTS:
            _refuse(f"starting processes ({event})")
        elif event in ("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle"):
            _refuse(f"ctypes foreign functions ({event} {args[0]!r:.60})")
        elif event == "import" and args[0] == "_posixsubprocess" and "_posixsubprocess" not in sys.modules:
            _refuse("re-importing _posixsubprocess")
        elif event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if writing and not inside(path):
                _refuse(f"writing {os.fsdecode(path)!r} outside the scratch dir")
        elif event in ("os.symlink", "os.link"):
            _refuse(f"creating links ({event})")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and not inside(args[i]):
                    _refuse(f"{event} on {args[i]!r} outside the scratch dir")

    import _posixsubprocess

    def fork_exec(*_: Any, **__: Any) -> None:
        _refuse("starting processes (_posixsubprocess.fork_exec: subprocess, multiprocessing spawn/forkserver)")

    _posixsubprocess.fork_exec = fork_exec  # type: ignore[attr-defined]
    sys.addaudithook(hook)
