"""The child of the WEAK mode (`rlscope.sandbox.weak`, ``--unsafe_sandbox``): run as a script by
``python -I -S -B``, stdlib only. Its audit guard is forgeable (docs/sandbox.md).

Protocol. stdin carries one JSON object ``{"nonce", "code", "function", "args": [[...], ...],
"root", "limits": {...}}``. The harness sets the resource limits, moves its result channel
off fd 1 (fd 1 then writes to stderr, so prints of the candidate cannot forge a result),
installs the audit guard, ``exec``s the code in a fresh namespace and calls ``function`` on
each argument list, and writes ONE line ``nonce + json`` to the result channel:
``{"load": "ok" | error kind, "load_error": str, "tests": [{"value", "error"}],
"violations": [str]}``. Return values are encoded here as plain JSON (exact builtin types
only, so an object with a lying ``__eq__`` cannot pass a test); the parent compares them.

Must not import rlscope (it runs isolated from site-packages) nor anything that needs a
file after the guard is installed. It loads ``harness.py`` (the isolated mode's child, also
stdlib only) by path before installing the guard and reuses its loading and calling of the
code (`run_candidate`), its limits and its result writing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from typing import Any

BLOCKED_EVENTS = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn",
                  "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
                  "signal.pthread_kill", "ctypes.", "resource.setrlimit", "resource.prlimit",
                  "os.symlink", "os.link", "winreg.", "_winapi.", "sys.remote_exec")
"""Audit events refused outright (prefix match): network, new processes, signals to other
processes, foreign code, raising the limits, links that could point outside the root."""
BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_socket",
                             "socket", "multiprocessing", "_multiprocessing", "subprocess"})
"""Modules whose import is refused: they reach processes or foreign code without (or before)
an audit event."""
WRITE_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.rename": 2, "os.mkdir": 1, "os.chmod": 1,
                "os.chown": 1, "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1,
                "shutil.copyfile": 2, "shutil.copytree": 2, "shutil.move": 2,
                "shutil.chown": 1, "os.chflags": 1, "os.lchflags": 1, "os.setxattr": 1,
                "os.removexattr": 1}
"""Path-changing events and how many leading arguments are paths: allowed inside the root."""
READ_EVENTS = {"os.listdir": 1, "os.scandir": 1, "glob.glob": 1, "os.getxattr": 1,
               "os.listxattr": 1, "os.chdir": 1}
"""Path-reading events: allowed inside the root and (read-only) in the standard library."""
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def load_shared_harness() -> Any:
    """``harness.py`` of this directory as a module (not run: its ``__name__`` is not
    ``__main__``)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
    spec = importlib.util.spec_from_file_location("rlscope_sandbox_harness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_guard(root: str, read_roots: tuple[str, ...], violations: list[str]) -> Any:
    """The audit hook: refuses `BLOCKED_EVENTS`, `BLOCKED_IMPORTS`, writes outside ``root``
    and reads outside ``root`` + ``read_roots``, recording each refusal in ``violations``."""
    realpath, join, getcwd, sep = os.path.realpath, os.path.join, os.getcwd, os.sep

    def inside(path: Any, roots: tuple[str, ...]) -> bool:
        if isinstance(path, int):
            return True  # an fd: only ones opened under this guard, or the std streams
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        full = realpath(join(getcwd(), path))
        for r in roots:
            if full == r or full.startswith(r + sep):
                rest = full[len(r):].split(sep)
                return "site-packages" not in rest and "dist-packages" not in rest
        return False

    def deny(event: str, detail: Any) -> None:
        message = f"sandbox: {event} {str(detail)[:200]} blocked"
        violations.append(message)
        raise PermissionError(message)

    def guard(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(BLOCKED_EVENTS):
            deny(event, args[:1])
        elif event == "import":
            name = str(args[0])
            if name.split(".")[0] in BLOCKED_IMPORTS:
                deny(event, name)
        elif event == "open":
            path, _mode, flags = args
            writing = flags is not None and bool(int(flags) & WRITE_FLAGS)
            if not inside(path, (root,) if writing else (root, *read_roots)):
                deny(event, path)
        elif event in WRITE_EVENTS:
            for path in args[:WRITE_EVENTS[event]]:
                if not inside(path, (root,)):
                    deny(event, path)
        elif event in READ_EVENTS:
            for path in args[:READ_EVENTS[event]]:
                if path is not None and not inside(path, (root, *read_roots)):
                    deny(event, path)

    return guard


def main() -> None:
    shared = load_shared_harness()
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    nonce: str = request["nonce"]
    root = os.path.realpath(request["root"])
    os.chdir(root)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises, not kills
    result_fd = os.dup(1)
    os.dup2(2, 1)
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    shared.set_limits(request["limits"])  # soft = hard (root can raise them; the guard refuses)
    violations: list[str] = []
    sys.addaudithook(make_guard(root, (stdlib,), violations))
    dumps = json.dumps
    out = shared.run_candidate(request, dumps)
    out["violations"] = violations
    shared.write_all(result_fd, (nonce + dumps(out) + "\n").encode("utf-8", errors="replace"))
    os._exit(0)  # no atexit, no waiting for threads the candidate started


if __name__ == "__main__":
    main()
