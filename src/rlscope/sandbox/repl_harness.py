"""The child side of `rlscope.sandbox.repl.ReplSession`: a persistent interpreter that runs one
code block per request. Its SOURCE is passed to ``python -I -S -B -c`` (inside bubblewrap in the
isolated mode, as a plain subprocess in the weak mode); stdlib only, no imports of rlscope.

Protocol (one JSON object per line, both ways; every line the child writes starts with the
session's nonce and goes to the result channel, a duplicate of the original fd 1, while fds 1
and 2 then point to /dev/null):

1. stdin: the setup ``{"nonce", "limits", "root", "guard", "modules": {"harness",
   "guard"}, "allowed_imports", "dropped_builtins", "max_stdout_chars", "max_final_chars",
   "setup_source", "setup_data"}``. ``modules`` are the sources of ``harness.py`` (limits,
   plain values) and ``weak_harness.py`` (the audit guard), executed here because the files
   themselves are not visible in the isolated mode. ``setup_source`` defines ``tools(data,
   request)``, which returns the names given to the user's namespace. The child answers
   ``{"kind": "ready"}``.
2. stdin: ``{"code": str}``; the child runs it in the persistent namespace (restricted
   builtins, import allow-list, stdout captured) and answers ``{"kind": "done", "stdout",
   "error", "final"}``. While it runs, a tool may call ``request(payload)``: the child writes
   ``{"kind": "request", "payload"}`` and reads the parent's reply (one JSON line) from stdin.

``FINAL(value)``, ``FINAL_VAR(name)`` and ``SHOW_VARS()`` are given to every session. FINAL
records its value (the first one counts) and ends the block. The harness holds no secret: code
that tampers with it can only change what is reported as its own output or answer.
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import traceback
import types
from typing import Any


class FinalCalled(BaseException):
    """Raised by FINAL to end the block; a BaseException so ``except Exception`` passes it."""


class CappedWriter:
    """A text stream keeping the first ``cap`` characters written to it (prints past the cap
    are dropped, so a flood of output costs no memory)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.size = cap, 0
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError("write() argument must be str")
        if self.size < self.cap:
            piece = text[:self.cap - self.size]
            self.parts.append(piece)
            self.size += len(piece)
        return len(text)

    def flush(self) -> None:
        return None

    def value(self) -> str:
        return "".join(self.parts)


def load_module(name: str, source: str) -> types.ModuleType:
    """``source`` executed as a module named ``name`` (not ``__main__``, so it does not run)."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def restricted_builtins(dropped: list[str], allowed: frozenset[str]) -> dict[str, Any]:
    """The builtins of user code: without ``dropped``, with an ``__import__`` that loads only
    modules whose top-level package is in ``allowed``."""
    real_import = builtins.__import__

    def guarded_import(name: str, globals: Any = None, locals: Any = None,
                       fromlist: Any = (), level: int = 0) -> Any:
        if level != 0 or name.split(".")[0] not in allowed:
            raise ImportError(f"import of {name!r} is not allowed (allowed: "
                              f"{', '.join(sorted(allowed))})")
        return real_import(name, globals, locals, fromlist, level)

    table = {k: v for k, v in vars(builtins).items() if k not in dropped}
    table["__import__"] = guarded_import
    return table


def main() -> None:
    stdin = sys.stdin.buffer
    setup = json.loads(stdin.readline().decode("utf-8"))
    nonce: str = setup["nonce"]
    shared = load_module("rlscope_sandbox_harness", setup["modules"]["harness"])
    guard_module = load_module("rlscope_sandbox_guard", setup["modules"]["guard"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises, not kills
    root = os.path.realpath(setup["root"])
    os.chdir(root)
    result_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    dumps, loads, write_all, plain = json.dumps, json.loads, shared.write_all, shared.plain
    cap, final_cap = int(setup["max_stdout_chars"]), int(setup["max_final_chars"])

    def send(message: dict[str, Any]) -> None:
        write_all(result_fd, (nonce + dumps(message) + "\n").encode("utf-8", "replace"))

    def request(payload: Any) -> Any:
        send({"kind": "request", "payload": payload})
        line = stdin.readline()
        if not line:
            os._exit(0)  # the parent is gone
        return loads(line.decode("utf-8"))

    user: dict[str, Any] = {"__name__": "__repl__"}
    final: dict[str, Any] = {}
    tool_names: set[str] = set()

    def FINAL(value: Any) -> None:
        final.setdefault("value", value)
        raise FinalCalled

    def FINAL_VAR(name: str) -> None:
        if not isinstance(name, str) or name not in user:
            raise NameError(f"FINAL_VAR: no variable named {name!r}")
        FINAL(user[name])

    def SHOW_VARS() -> None:
        shown = [f"{k}: {type(v).__name__}" for k, v in user.items()
                 if not k.startswith("_") and k not in tool_names
                 and not isinstance(v, types.ModuleType)]
        print("\n".join(shown) if shown else "(no variables)")

    setup_ns: dict[str, Any] = {"__name__": "__main__"}  # its exceptions print unqualified
    exec(compile(setup["setup_source"], "<tools>", "exec"), setup_ns)
    given = dict(setup_ns["tools"](setup["setup_data"], request))
    given.update(FINAL=FINAL, FINAL_VAR=FINAL_VAR, SHOW_VARS=SHOW_VARS)
    tool_names.update(given)
    user.update(given)
    user["__builtins__"] = restricted_builtins(list(setup["dropped_builtins"]),
                                               frozenset(setup["allowed_imports"]))
    shared.set_limits(setup["limits"])
    if setup["guard"]:
        stdlib = os.path.realpath(os.path.dirname(os.__file__))
        sys.addaudithook(guard_module.make_guard(root, (stdlib,), []))
    send({"kind": "ready"})
    while True:
        line = stdin.readline()
        if not line:
            os._exit(0)
        code = loads(line.decode("utf-8"))["code"]
        out = CappedWriter(cap)
        error = ""
        final.clear()
        sys.stdout = out
        try:
            exec(compile(code, "<repl>", "exec"), user)
        except FinalCalled:
            pass
        except BaseException as e:  # anything the code raises is its observation
            error = traceback.format_exception_only(type(e), e)[-1].strip()
        finally:
            sys.stdout = sys.__stdout__
        answer = None
        if "value" in final:
            try:
                encoded = plain(final["value"])
                answer = {"value": encoded, "plain": True} if len(dumps(encoded)) <= final_cap \
                    else {"value": repr(final["value"])[:final_cap], "plain": False}
            except BaseException:  # not plain data: its repr stands for it
                try:
                    answer = {"value": repr(final["value"])[:final_cap], "plain": False}
                except BaseException as e:
                    error = f"FINAL: the value cannot be shown ({type(e).__name__})"
        send({"kind": "done", "stdout": out.value(), "error": error[:cap], "final": answer})


if __name__ == "__main__":
    main()
