"""Run untrusted Python (a policy's generated code) against unit tests, in a separate process
with limits, and collect the results (TASKS.md, "Real-model tasks", ``code_unit_tests``).

Design: every limit exists so that a crash, hang or naive escape of the generated code is a
reward of 0 with a reason, never a crash, hang or corruption of the trainer.

- **A separate process**, ``python -I -S -B`` (isolated: no user site, no ``PYTHON*``
  variables, no site-packages, no bytecode written), an empty environment, ``close_fds``, in a
  new session (``start_new_session``) so that the whole process group can be killed.
- **A fresh temporary working directory** ("the root"), deleted afterwards: the only place the
  code may write.
- **Resource limits** (`SandboxLimits`), set by the harness before the code is compiled:
  ``RLIMIT_CPU`` (a busy loop is killed), ``RLIMIT_AS`` (a huge allocation raises
  MemoryError instead of swapping the host), ``RLIMIT_NPROC`` (a fork bomb fails; note that
  Linux does not apply it to root), ``RLIMIT_FSIZE`` (a file cannot fill the disk),
  ``RLIMIT_NOFILE`` and ``RLIMIT_CORE`` = 0. They are set in the child's first lines rather
  than in ``preexec_fn``, which Python documents as unsafe in a process with threads (the
  trainer has torch's and `score_batch`'s); no candidate code runs before they hold.
- **A wall-clock timeout** enforced by the parent, which then kills the process group
  (``os.killpg``); a per-test alarm inside the child so one slow test costs only that test.
- **An audit hook** (``sys.addaudithook``, PEP 578) installed before the code runs refuses:
  sockets, ``subprocess``, ``os.system``, ``os.exec*``, ``os.fork``/``posix_spawn``/``spawn``,
  signals to other processes, ``ctypes`` and other foreign-code imports, raising resource
  limits, links; ``open`` for writing outside the root; reading outside the root except the
  standard library (imports need it; site-packages excluded); deleting, renaming, ``chmod``
  etc. outside the root. Any refusal makes the whole result ``blocked``, 0 passed.
- **A result protocol** that prints cannot forge: the child answers on a duplicate of its
  original stdout (fd 1 is pointed at stderr before the code runs) with one line prefixed by
  a random nonce; return values are converted to plain JSON in the child and compared here,
  so an object whose ``__eq__`` always says True passes nothing. Output read by the parent is
  capped; garbage, truncated or missing output is a result, never an exception.

What it does NOT protect against: it is not a security boundary against a determined
attacker. There are no namespaces, no seccomp filter, no separate user: code that reaches C
(a CPython bug, a crafted code object, introspection that removes the guard's records or
finds the nonce) escapes the audit hook, and the process runs with the trainer's user and
file permissions (as root, ``RLIMIT_NPROC`` does not apply, only the hook stops ``fork``).
Creating many files inside the root is bounded only by CPU time and ``RLIMIT_FSIZE`` per
file; reading what the standard library directory holds is allowed. It protects the trainer
from accidents and naive escapes. Linux only.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

HARNESS = Path(__file__).with_name("harness.py")
Status = Literal["ok", "timeout", "crashed", "limit", "blocked", "invalid_output"]
MAX_CODE_CHARS = 200_000
"""Longer code is not run (status ``invalid_output``: the policy's output is unusable)."""


@dataclass(frozen=True)
class TestCase:
    """One hidden unit test: ``function(*args) == expected``, both plain JSON data (tuples are
    compared as lists; floats with a relative/absolute tolerance of 1e-9)."""

    __test__ = False  # not a pytest test class
    args: tuple[Any, ...]
    expected: Any


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run. Valid regime: all positive; ``wall_seconds`` should exceed
    ``cpu_seconds`` plus interpreter start-up (~0.1 s, more on a loaded host)."""

    cpu_seconds: int = 2
    """RLIMIT_CPU of the child: CPU seconds before the kernel kills it."""
    wall_seconds: float = 5.0
    """Wall-clock limit enforced by the parent (a sleeping or blocked child uses no CPU)."""
    per_test_seconds: float = 1.0
    """Alarm per test call inside the child; a test past it fails alone."""
    memory_bytes: int = 512 * 2**20
    """RLIMIT_AS: address space of the child."""
    processes: int = 0
    """RLIMIT_NPROC: counts every process and thread of the user, so 0 forbids any new one
    (threads included); ignored by Linux for root."""
    file_bytes: int = 2**20
    """RLIMIT_FSIZE: largest file the code may write (in the root)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    output_bytes: int = 2**20
    """Most bytes the parent reads from the child's stdout and stderr together; more is a
    ``limit`` result (the child is killed)."""

    def validate(self) -> list[str]:
        """Problems with these limits, empty if none."""
        return [f"sandbox limit {k}={v} must be > 0" for k, v in vars(self).items()
                if k != "processes" and not v > 0] + (
            [f"sandbox limit processes={self.processes} must be >= 0"]
            if self.processes < 0 else [])


@dataclass(frozen=True)
class TestOutcome:
    """One test: ``passed``, and why not (``error``: exception name, "wrong answer", ...)."""

    __test__ = False  # not a pytest test class
    passed: bool
    error: str = ""


@dataclass(frozen=True)
class SandboxResult:
    """The result of one run. ``passed`` is 0 unless ``status`` is ``ok``; ``reason`` says
    what went wrong (empty when nothing did)."""

    status: Status
    passed: int
    total: int
    outcomes: tuple[TestOutcome, ...]
    reason: str = ""
    seconds: float = 0.0

    @property
    def reward(self) -> float:
        """Fraction of tests passed (0 for no tests)."""
        return self.passed / self.total if self.total else 0.0


def _equal(got: Any, want: Any) -> bool:
    """Plain-data equality with float tolerance; bool is not an int here."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, (list, tuple)) and isinstance(got, list):
        return len(got) == len(want) and all(_equal(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_equal(got[k], want[k]) for k in want)
    return type(got) is type(want) and bool(got == want)


def _rlimits(limits: SandboxLimits) -> dict[str, int]:
    return {"RLIMIT_CPU": limits.cpu_seconds, "RLIMIT_AS": limits.memory_bytes,
            "RLIMIT_NPROC": limits.processes, "RLIMIT_FSIZE": limits.file_bytes,
            "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _communicate(proc: subprocess.Popen[bytes], payload: bytes, limits: SandboxLimits
                 ) -> tuple[bytes, str]:
    """Feed ``payload`` and read stdout (stderr is drained and dropped) until both close,
    the wall deadline or the output cap. Returns (stdout, "" | "timeout" | "output")."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + limits.wall_seconds
    out, n_read = bytearray(), 0
    sel = selectors.DefaultSelector()
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), "timeout"
            for key, _ in sel.select(left):
                if key.fileobj is proc.stdin:
                    try:
                        payload = payload[os.write(proc.stdin.fileno(), payload):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the child died before reading it all
                        payload = b""
                    if not payload:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                n_read += len(chunk)
                if n_read > limits.output_bytes:
                    return bytes(out), "output"
                if key.fileobj is proc.stdout:
                    out += chunk
        return bytes(out), ""
    finally:
        sel.close()


def _parse(stdout: bytes, nonce: str, n_tests: int) -> dict[str, Any] | None:
    """The nonce-prefixed result object, or None if absent or malformed."""
    prefix = nonce.encode()
    for line in reversed(stdout.splitlines()):
        if not line.startswith(prefix):
            continue
        try:
            out = json.loads(line[len(prefix):].decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None
        ok = (isinstance(out, dict) and isinstance(out.get("tests"), list)
              and isinstance(out.get("violations"), list) and isinstance(out.get("load"), str)
              and all(isinstance(t, dict) for t in out["tests"]))
        if ok and (out["load"] != "ok" or len(out["tests"]) == n_tests):
            return out
        return None
    return None


def _failed(status: Status, reason: str, n: int, start: float) -> SandboxResult:
    return SandboxResult(status, 0, n, tuple(TestOutcome(False, status) for _ in range(n)),
                         reason, time.monotonic() - start)


def run_tests(code: str, function: str, tests: Sequence[TestCase],
              limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` (Python source defining ``function``) in the sandbox and call
    ``function(*test.args)`` for each test. Never raises for anything the code does; raises
    ValueError only for invalid ``limits`` or tests that are not plain JSON data (caller
    bugs). See the module docstring for what is limited and blocked."""
    limits = limits or SandboxLimits()
    if problems := limits.validate():
        raise ValueError("; ".join(problems))
    start, n = time.monotonic(), len(tests)
    if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
        return _failed("invalid_output", f"code is not a string of at most {MAX_CODE_CHARS} "
                       "characters", n, start)
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="rlscope-sandbox-") as root:
        try:
            payload = json.dumps({
                "nonce": nonce, "code": code, "function": function, "root": root,
                "args": [list(t.args) for t in tests], "limits": _rlimits(limits),
                "per_test_seconds": limits.per_test_seconds}).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ValueError(f"sandbox tests must be plain JSON data: {e}") from e
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(HARNESS)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root,
                env={"LC_ALL": "C.UTF-8"}, close_fds=True, start_new_session=True)
        except OSError as e:
            return _failed("crashed", f"could not start the sandbox: {e}", n, start)
        try:
            stdout, cut = _communicate(proc, payload, limits)
        finally:
            _kill_group(proc.pid)
            proc.wait()
    if cut == "timeout":
        return _failed("timeout", f"wall-clock limit of {limits.wall_seconds:g} s", n, start)
    if cut == "output":
        return _failed("limit", f"output over {limits.output_bytes} bytes", n, start)
    rc = proc.returncode
    out = _parse(stdout, nonce, n)
    if out is None:
        if rc in (-signal.SIGXCPU, -signal.SIGKILL):
            return _failed("timeout", f"CPU time limit of {limits.cpu_seconds} s", n, start)
        if rc != 0 or not stdout:
            return _failed("crashed", f"exited with code {rc} without a result", n, start)
        return _failed("invalid_output", "no well-formed result line", n, start)
    if out["violations"]:
        return _failed("blocked", str(out["violations"][0])[:300], n, start)
    load = out["load"]
    if load != "ok":
        status: Status = "limit" if load == "memory" else "crashed"
        return _failed(status, str(out.get("load_error", load))[:300], n, start)
    outcomes = []
    for test, got in zip(tests, out["tests"], strict=True):
        error = str(got.get("error") or "")[:100]
        passed = not error and _equal(got.get("value"), test.expected)
        outcomes.append(TestOutcome(passed, "" if passed else error or "wrong answer"))
    return SandboxResult("ok", sum(o.passed for o in outcomes), n, tuple(outcomes), "",
                         time.monotonic() - start)


def run_many(jobs: Sequence[tuple[str, str, Sequence[TestCase]]],
             limits: SandboxLimits | None = None, workers: int = 2) -> list[SandboxResult]:
    """`run_tests` on each ``(code, function, tests)``, at most ``workers`` sandboxes at a
    time (threads waiting on child processes: the pool bounds concurrent children, and the
    CPU they take, to ``workers``). Results in input order."""
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    with ThreadPoolExecutor(max_workers=min(workers, max(len(jobs), 1))) as pool:
        return list(pool.map(lambda job: run_tests(job[0], job[1], job[2], limits), jobs))


__all__ = ["SandboxLimits", "SandboxResult", "Status", "TestCase", "TestOutcome",
           "run_many", "run_tests"]
