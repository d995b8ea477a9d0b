"""The child side of the isolated sandbox (`rlscope.sandbox.isolated`). Its SOURCE is passed
to ``python -I -S -B -c`` inside bubblewrap (the file itself is never visible in the sandbox);
stdlib only, no imports of rlscope.

It holds no secret and decides nothing. stdin carries one JSON object ``{"code", "function",
"args": [[...], ...], "limits": {...}, "per_test_seconds"}`` (no expected outputs). The
harness sets the resource limits (soft = hard: the child cannot raise them back), moves its
result channel off fd 1 (fd 1 then writes to stderr, so an honest program's prints cannot
garble the result), ``exec``s the code in a fresh namespace, calls ``function`` on each
argument list under a per-call alarm, and writes ONE line to the result channel:
``{"load": "ok" | error kind, "load_error": str, "tests": [{"value", "error"}]}``. Values are
encoded as plain JSON (exact builtin types only, so an object with a lying ``__eq__`` or an
``int`` subclass is an error, not a value). The parent compares them with the expected
outputs. Code that tampers with this harness (replaces ``json.dumps``, writes to the result
channel, edits ``__main__``) can only change what is reported as its own return values.

The weak mode's child (``weak_harness.py``) loads this file by path and reuses `set_limits`,
`run_candidate` and `write_all`, so the two modes load and call the code alike.
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys
from collections.abc import Callable
from typing import Any

MAX_VALUE_CHARS = 65_536
"""A return value whose JSON exceeds this is reported as an error, not sent."""


class TestTimeout(BaseException):
    """One test ran past its time; a BaseException so ``except Exception`` does not eat it."""


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-able builtins of exactly these types (tuples become lists); raises
    TypeError for anything else, subclasses included."""
    if depth > 50:
        raise TypeError("return value nested too deeply")
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        return value if math.isfinite(value) else repr(value)
    if t in (list, tuple):
        return [plain(v, depth + 1) for v in value]
    if t is dict:
        if not all(type(k) is str for k in value):
            raise TypeError("dict keys must be str")
        return {k: plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"return value of type {t.__name__} is not plain data")


def set_limits(limits: dict[str, int]) -> None:
    """Soft = hard for each limit (by `resource` name), so the candidate cannot raise them
    back."""
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def run_candidate(request: dict[str, Any], dumps: Callable[[Any], str]) -> dict[str, Any]:
    """``exec`` ``request["code"]`` in a fresh namespace and call ``request["function"]`` on
    each of ``request["args"]`` under an alarm of ``request["per_test_seconds"]`` (encoding
    the value with `plain` and ``dumps`` counts against it). Returns ``{"load", "load_error",
    "tests": [{"value", "error"}]}``; never raises for anything the code does."""
    out: dict[str, Any] = {"load": "ok", "load_error": "", "tests": []}
    per_test = float(request["per_test_seconds"])

    def on_alarm(signum: int, frame: Any) -> None:
        raise TestTimeout(f"test ran past {per_test:g} s")

    signal.signal(signal.SIGALRM, on_alarm)
    namespace: dict[str, Any] = {"__name__": "candidate", "__builtins__": __builtins__}
    fn: Any = None
    try:
        exec(compile(request["code"], "<candidate>", "exec"), namespace)
        fn = namespace.get(request["function"])
        if not callable(fn):
            out["load"], out["load_error"] = "missing", f"no function {request['function']!r}"
    except SyntaxError as e:
        out["load"], out["load_error"] = "syntax", f"SyntaxError: {e.msg} (line {e.lineno})"
    except MemoryError:
        out["load"], out["load_error"] = "memory", "MemoryError while loading the code"
    except BaseException as e:  # anything the candidate raises is a result
        out["load"], out["load_error"] = "error", f"{type(e).__name__} while loading the code"
    if out["load"] == "ok":
        for args in request["args"]:
            test: dict[str, Any] = {"value": None, "error": ""}
            try:
                signal.setitimer(signal.ITIMER_REAL, per_test)
                try:  # encoding a giant value counts against the call's time
                    encoded = plain(fn(*args))
                    if len(dumps(encoded)) > MAX_VALUE_CHARS:
                        raise ValueError("return value too large")
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                test["value"] = encoded
            except BaseException as e:
                test["error"] = type(e).__name__
            out["tests"].append(test)
    return out


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a pipe may take it in parts)."""
    while data:
        data = data[os.write(fd, data):]


def main() -> None:
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises, not kills
    set_limits(request["limits"])
    result_fd = os.dup(1)
    os.dup2(2, 1)
    dumps = json.dumps  # taken before the code runs: replacing json.dumps changes nothing here
    out = run_candidate(request, dumps)
    write_all(result_fd, (dumps(out) + "\n").encode("utf-8", errors="replace"))
    os._exit(0)  # no atexit, no waiting for threads the candidate started


if __name__ == "__main__":
    main()
