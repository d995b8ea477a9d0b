"""A persistent sandboxed Python session: one code block per request, variables kept between
blocks (COMPANIONS.md section 4, "Environment (REPL)"; docs/sandbox.md, "REPL sessions").

The child is `run_tests`' child: a separate ``python -I -S -B`` process with an empty
environment, under bubblewrap and the seccomp filter in the isolated mode (the default) or a
plain subprocess in a throw-away root directory in the weak mode (``unsafe=True``); rlimits
(soft = hard); the audit guard of the weak mode in both; a nonce-tagged result channel. On top
of that the user's code runs with restricted builtins (`DROPPED_BUILTINS`) and an import
allow-list (`ALLOWED_IMPORTS`), its stdout captured. The child's program is ``repl_harness.py``
(protocol in its docstring).

A block has a wall clock (``block_seconds``) that PAUSES while the parent answers a tool's
request (``on_request``: an ``rlm_query`` runs whole child rollouts meanwhile). A block past its
clock, a crash (the child dies: CPU limit, seccomp kill, ``os._exit``) or a flood of the
result channel kills the session; the observation says so and the next block starts a fresh
session (the tools again, the user's variables lost).
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlscope.sandbox import isolated
from rlscope.sandbox.common import MAX_CODE_CHARS, kill_group, rlimits
from rlscope.sandbox.common import SandboxLimits as _Limits

REPL_SOURCE = Path(__file__).with_name("repl_harness.py").read_text(encoding="utf-8")
"""The child's program (`repl_harness.py`), passed to ``python -c``."""
_MODULES = {"harness": Path(__file__).with_name("harness.py").read_text(encoding="utf-8"),
            "guard": Path(__file__).with_name("weak_harness.py").read_text(encoding="utf-8")}
ALLOWED_IMPORTS = ("re", "json", "math", "collections", "itertools", "functools", "string",
                   "statistics", "textwrap", "difflib")
"""Top-level modules the user's code may import (their submodules too)."""
DROPPED_BUILTINS = ("open", "input", "breakpoint", "exit", "quit", "help")
"""Builtins the user's code does not get."""
ReplStatus = Literal["ok", "error", "timeout", "crashed", "limit"]
RequestHandler = Callable[[Any], Any]
"""The parent's answer to a tool's ``request(payload)``: plain JSON data in and out."""


@dataclass(frozen=True)
class ReplLimits:
    """Limits of one REPL session. Valid regime: all positive."""

    block_seconds: float = 30.0
    """Wall clock of one block (``--repl_timeout``), paused while the parent answers a
    request; past it the session is killed and reset."""
    cpu_seconds: int = 300
    """RLIMIT_CPU of the whole session (``repl_timeout`` × the turn limit)."""
    max_observation_chars: int = 3000
    """The observation (stdout, then the error line) is cut to this many characters."""
    max_final_chars: int = 65_536
    """A FINAL value whose JSON is longer comes back as its ``repr`` cut to this length."""
    memory_bytes: int = 1024 * 2**20
    """RLIMIT_AS of the session."""
    file_bytes: int = 2**20
    """RLIMIT_FSIZE: largest file the code may write (in its private root)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    message_bytes: int = 4 * 2**20
    """Longest message line the parent reads from the child (more kills the session)."""
    tmp_bytes: int = 16 * 2**20
    """Size of the isolated child's private /tmp."""
    start_seconds: float = 30.0
    """Wall clock for starting a session (bubblewrap, the interpreter, the tools)."""

    def validate(self) -> list[str]:
        """Problems with these limits, empty if none."""
        return [f"REPL limit {k}={v} must be > 0" for k, v in vars(self).items()
                if not v > 0]


@dataclass(frozen=True)
class ReplResult:
    """One block's outcome. ``observation``: what the model sees next (stdout, then the last
    traceback line, or the reset notice; cut to ``max_observation_chars``). ``final``: the
    value given to FINAL / FINAL_VAR (``has_final``), as plain JSON data (tuples as lists) or,
    for other values, their ``repr``."""

    status: ReplStatus
    observation: str
    stdout: str = ""
    error: str = ""
    has_final: bool = False
    final: Any = None
    reset: bool = False
    seconds: float = 0.0


class _Killed(Exception):
    """The session had to be killed; ``status`` and ``reason`` say why."""

    def __init__(self, status: ReplStatus, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class ReplSession:
    """A persistent sandboxed interpreter (module docstring). ``setup_source`` defines
    ``tools(data, request) -> dict`` (stdlib only), run in the child with full builtins before
    any user code; ``setup_data`` (plain JSON) is its ``data``; the names it returns (plus
    FINAL, FINAL_VAR, SHOW_VARS) are the user's tools. ``on_request`` answers the tools'
    ``request(payload)`` calls (an error without it). The child starts at `launch` or the
    first `run`.
    Use as a context manager or call `close`. Raises SandboxUnavailable at the first `run` in
    the isolated mode where bubblewrap cannot isolate."""

    def __init__(self, setup_source: str, setup_data: Any, limits: ReplLimits | None = None,
                 on_request: RequestHandler | None = None, *, unsafe: bool = False) -> None:
        self.limits = limits or ReplLimits()
        if problems := self.limits.validate():
            raise ValueError("; ".join(problems))
        self.setup_source, self.setup_data = setup_source, setup_data
        self.on_request, self.unsafe = on_request, unsafe
        self.resets = 0
        """How many times the session was killed (timeout, crash, flood)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: str | None = None
        self._nonce = ""
        self._buffer = b""
        self._ready, self._ready_by = False, 0.0

    def __enter__(self) -> ReplSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        """Whether a child is running now."""
        return self._proc is not None

    def close(self) -> None:
        """Kill the child (if any) and remove its root directory."""
        if self._proc is not None:
            kill_group(self._proc.pid)
            for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
                if stream is not None:
                    stream.close()
            self._proc.wait()
            self._proc = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        self._buffer = b""
        self._ready = False

    def launch(self) -> None:
        """Start the child's process now, without waiting for it to be ready (the next `run`
        waits), so that several sessions boot at once; nothing if it runs. A launch that fails
        leaves the session stopped (the next `run` tries again and reports it). Raises
        SandboxUnavailable as `run` does. (No threads: bubblewrap's ``--die-with-parent``
        would kill the child when the thread that started it ends.)"""
        if self._proc is not None:
            return
        try:
            self._launch()
        except _Killed:
            self.close()
        except BaseException:
            self.close()
            raise

    def run(self, code: str) -> ReplResult:
        """Run one block (see the class docstring); never raises for anything the code does.
        The parent's ``on_request`` errors propagate (after the session is killed)."""
        start = time.monotonic()
        if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
            return self._result("error", "", f"the block is not a string of at most "
                                f"{MAX_CODE_CHARS} characters", None, start)
        try:
            if self._proc is None:
                self._launch()
            if not self._ready:
                if self._receive(self._ready_by).get("kind") != "ready":
                    raise _Killed("crashed", "the session did not start")
                self._ready = True
            self._send({"code": code}, time.monotonic() + self.limits.block_seconds)
            left = self.limits.block_seconds
            while True:
                t0 = time.monotonic()
                message = self._receive(t0 + left)
                left -= time.monotonic() - t0
                if message.get("kind") == "done":
                    break
                if message.get("kind") != "request":
                    raise _Killed("crashed", "a malformed message on the result channel")
                reply = self._answer(message.get("payload"))
                self._send(reply, time.monotonic() + self.limits.block_seconds)
        except _Killed as e:
            self.close()
            self.resets += 1
            notice = (f"[REPL {e.status}: {e.reason}. The session was reset: the tools are "
                      "back, your variables are lost.]")
            return ReplResult(e.status, notice[:self.limits.max_observation_chars], reset=True,
                              seconds=time.monotonic() - start)
        except BaseException:
            self.close()
            raise
        final = message.get("final")
        has_final = isinstance(final, dict) and "value" in final
        stdout, error = str(message.get("stdout", "")), str(message.get("error", ""))
        return self._result("error" if error else "ok", stdout, error,
                            final if has_final else None, start)

    def _result(self, status: ReplStatus, stdout: str, error: str, final: Any,
                start: float) -> ReplResult:
        observation = stdout + ("\n" if stdout and not stdout.endswith("\n") and error else "")
        observation = (observation + error)[:self.limits.max_observation_chars]
        return ReplResult(status, observation, stdout, error, final is not None,
                          final["value"] if final is not None else None, False,
                          time.monotonic() - start)

    def _answer(self, payload: Any) -> Any:
        if self.on_request is None:
            return {"error": ["RuntimeError", "this session has no parent handler"]}
        return self.on_request(payload)

    def _launch(self) -> None:
        """Start the child and send it its setup; it answers "ready" by ``_ready_by``."""
        limits = self.limits
        self._nonce = secrets.token_hex(16)
        child_limits = rlimits(_Limits(cpu_seconds=limits.cpu_seconds,
                                       memory_bytes=limits.memory_bytes,
                                       file_bytes=limits.file_bytes,
                                       open_files=limits.open_files))
        env = {"LC_ALL": "C.UTF-8"}
        if self.unsafe:
            self._root = tempfile.mkdtemp(prefix="rlscope-repl-")
            root = self._root
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", REPL_SOURCE], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root, env=env,
                close_fds=True, start_new_session=True)
        else:
            isolated.require_isolation()
            root = "/tmp"
            try:
                self._proc = isolated._spawn(isolated.BWRAP, limits.tmp_bytes, REPL_SOURCE)
            except OSError as e:
                raise _Killed("crashed", f"could not start the sandbox: {e}") from e
        setup = {"nonce": self._nonce, "limits": child_limits, "root": root, "guard": True,
                 "modules": _MODULES, "allowed_imports": list(ALLOWED_IMPORTS),
                 "dropped_builtins": list(DROPPED_BUILTINS),
                 "max_stdout_chars": limits.max_observation_chars,
                 "max_final_chars": limits.max_final_chars,
                 "setup_source": self.setup_source, "setup_data": self.setup_data}
        self._ready, self._ready_by = False, time.monotonic() + limits.start_seconds
        self._send(setup, self._ready_by)

    def _send(self, message: Any, deadline: float) -> None:
        """Write one JSON line to the child's stdin before ``deadline``."""
        assert self._proc is not None and self._proc.stdin is not None
        try:
            data = (json.dumps(message) + "\n").encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ValueError(f"REPL messages must be plain JSON data: {e}") from e
        fd = self._proc.stdin.fileno()
        os.set_blocking(fd, False)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Killed("timeout", "the session stopped reading its input")
                if not sel.select(left):
                    continue
                try:
                    data = data[os.write(fd, data):]
                except BlockingIOError:
                    continue
                except BrokenPipeError as e:
                    raise _Killed("crashed", "the session died") from e

    def _receive(self, deadline: float) -> dict[str, Any]:
        """The next nonce-tagged JSON line of the child's result channel before ``deadline``
        (other lines are skipped); stderr is drained and dropped."""
        assert self._proc is not None and self._proc.stdout is not None
        out_fd, err = self._proc.stdout.fileno(), self._proc.stderr
        prefix = self._nonce.encode()
        with selectors.DefaultSelector() as sel:
            sel.register(out_fd, selectors.EVENT_READ)
            if err is not None:
                sel.register(err.fileno(), selectors.EVENT_READ)
            while True:
                while b"\n" in self._buffer:
                    line, self._buffer = self._buffer.split(b"\n", 1)
                    if line.startswith(prefix):
                        try:
                            message = json.loads(line[len(prefix):].decode("utf-8"))
                        except (ValueError, UnicodeDecodeError, RecursionError) as e:
                            raise _Killed("crashed", "a malformed message") from e
                        if isinstance(message, dict):
                            return message
                        raise _Killed("crashed", "a malformed message")
                if len(self._buffer) > self.limits.message_bytes:
                    raise _Killed("limit", f"output over {self.limits.message_bytes} bytes")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Killed("timeout", f"the block ran past "
                                  f"{self.limits.block_seconds:g} s")
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if key.fd != out_fd:
                        if not chunk:
                            sel.unregister(key.fd)
                        continue
                    if not chunk:
                        rc = self._proc.poll()
                        raise _Killed("crashed", "the session died"
                                      + (f" (exit code {rc})" if rc is not None else ""))
                    self._buffer += chunk
