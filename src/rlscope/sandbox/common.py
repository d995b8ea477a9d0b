"""What both sandbox modes share: the public data types, the limits, the trusted comparison of
returned values with the expected ones, and the parent's bounded reading of a child."""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "timeout", "crashed", "limit", "blocked", "invalid_output"]
MAX_CODE_CHARS = 200_000
"""Longer code is not run (status ``invalid_output``: the policy's output is unusable)."""


class SandboxUnavailable(RuntimeError):
    """The operating-system isolation cannot be used here (bubblewrap missing or unable to
    create namespaces, or no seccomp support); the message says how to fix it."""


@dataclass(frozen=True)
class TestCase:
    """One hidden unit test: ``function(*args) == expected``, both plain JSON data (tuples are
    compared as lists; floats with a relative/absolute tolerance of 1e-9). Only ``args`` ever
    reaches the sandboxed child; ``expected`` stays in the trusted parent."""

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
    """Wall-clock limit enforced by the parent, which then kills the child's whole process
    group (a sleeping or blocked child uses no CPU)."""
    per_test_seconds: float = 1.0
    """Alarm per test call inside the child; a test past it fails alone."""
    memory_bytes: int = 512 * 2**20
    """RLIMIT_AS: address space of the child."""
    processes: int = 0
    """RLIMIT_NPROC of the child (it never needs a new process; the isolated mode's seccomp
    filter also kills any attempt); Linux ignores it for a process whose real uid is root."""
    file_bytes: int = 2**20
    """RLIMIT_FSIZE: largest file the code may write (in its private /tmp)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    output_bytes: int = 2**20
    """Most bytes the parent reads from the child's stdout and stderr together; more is a
    ``limit`` result (the child is killed)."""
    tmp_bytes: int = 16 * 2**20
    """Size of the isolated child's private in-memory /tmp (its only writable directory)."""

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


def equal(got: Any, want: Any) -> bool:
    """Plain-data equality with float tolerance (ints against ints exactly); bool is not an
    int here. Recursion follows ``want`` (trusted), so a deeply nested ``got`` cannot exhaust
    the stack."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, int) and isinstance(got, int):
        return got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        try:
            return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
        except OverflowError:  # an int beyond float range is close to no finite float
            return False
    if isinstance(want, (list, tuple)) and isinstance(got, list):
        return len(got) == len(want) and all(equal(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(equal(got[k], want[k]) for k in want)
    return type(got) is type(want) and bool(got == want)


def rlimits(limits: SandboxLimits) -> dict[str, int]:
    """The child's resource limits by `resource` name (soft = hard)."""
    return {"RLIMIT_CPU": limits.cpu_seconds, "RLIMIT_AS": limits.memory_bytes,
            "RLIMIT_NPROC": limits.processes, "RLIMIT_FSIZE": limits.file_bytes,
            "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}


def kill_group(pgid: int) -> None:
    """SIGKILL to the process group ``pgid`` (gone already is fine)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def communicate(proc: subprocess.Popen[bytes], payload: bytes, limits: SandboxLimits
                ) -> tuple[bytes, bytes, str]:
    """Feed ``payload`` and read stdout and stderr until both close, the wall deadline or the
    output cap. Returns (stdout, the first 4 KiB of stderr, "" | "timeout" | "output")."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + limits.wall_seconds
    out, err, n_read = bytearray(), bytearray(), 0
    sel = selectors.DefaultSelector()
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), "timeout"
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
                    return bytes(out), bytes(err), "output"
                if key.fileobj is proc.stdout:
                    out += chunk
                elif len(err) < 4096:
                    err += chunk[:4096 - len(err)]
        return bytes(out), bytes(err), ""
    finally:
        sel.close()


def failed(status: Status, reason: str, n: int, start: float) -> SandboxResult:
    """A result of 0 passed for ``n`` tests, every outcome failed with ``status``."""
    return SandboxResult(status, 0, n, tuple(TestOutcome(False, status) for _ in range(n)),
                         reason, time.monotonic() - start)


def run_child(start_child: Callable[[], subprocess.Popen[bytes]], payload: bytes,
              limits: SandboxLimits, n: int, start: float
              ) -> SandboxResult | tuple[bytes, bytes, int]:
    """Start the child, send it ``payload``, read it within the limits and reap its whole
    process group. A child that cannot start, outlives the wall clock or floods its output is
    the result (0 of ``n`` passed); otherwise ``(stdout, stderr, returncode)`` for the mode to
    read."""
    try:
        proc = start_child()
    except OSError as e:
        return failed("crashed", f"could not start the sandbox: {e}", n, start)
    try:
        stdout, stderr, cut = communicate(proc, payload, limits)
    finally:
        kill_group(proc.pid)
        proc.wait()
    if cut == "timeout":
        return failed("timeout", f"wall-clock limit of {limits.wall_seconds:g} s", n, start)
    if cut == "output":
        return failed("limit", f"output over {limits.output_bytes} bytes", n, start)
    return stdout, stderr, proc.returncode


def well_formed(out: Any, n_tests: int) -> bool:
    """Whether ``out`` (the child's parsed answer) is ``{"load": str, "tests": [dict, ...]}``
    with one entry per test when ``load`` is ``ok``."""
    return (isinstance(out, dict) and isinstance(out.get("load"), str)
            and isinstance(out.get("tests"), list)
            and all(isinstance(t, dict) for t in out["tests"])
            and (out["load"] != "ok" or len(out["tests"]) == n_tests))


def judge(tests: Sequence[TestCase], out: dict[str, Any], start: float) -> SandboxResult:
    """The trusted verdict on a `well_formed` answer: code that did not load scores 0
    (``limit`` for a MemoryError, else ``crashed``); otherwise each reported value
    (``{"value", "error"}``) is compared with its expected output."""
    if out["load"] != "ok":
        status: Status = "limit" if out["load"] == "memory" else "crashed"
        return failed(status, str(out.get("load_error", out["load"]))[:300], len(tests), start)
    outcomes = []
    for test, answer in zip(tests, out["tests"], strict=True):
        error = answer.get("error")
        error = str(error)[:100] if error else ""
        passed = not error and equal(answer.get("value"), test.expected)
        outcomes.append(TestOutcome(passed, "" if passed else error or "wrong answer"))
    return SandboxResult("ok", sum(o.passed for o in outcomes), len(outcomes), tuple(outcomes),
                         "", time.monotonic() - start)
