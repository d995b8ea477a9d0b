"""Run untrusted Python (a policy's generated code) against unit tests and collect the results
(TASKS.md, "Real-model tasks", ``code_unit_tests``). Threat model and what was tried:
docs/sandbox.md.

A policy under RL is an adversary: it searches for any program that raises its reward. So the
judge is OUTSIDE the untrusted process. The child receives only the function's source and the
test INPUTS and returns only the raw return values (plain JSON, size-capped) over a pipe; this
(trusted) process compares them with the expected outputs and decides pass/fail. Expected
outputs, hidden tests of other specs and rlscope's data files never enter the child's view.

Two modes:

- **isolated** (the default, `rlscope.sandbox.isolated`): the child runs under bubblewrap in
  new user, mount, PID, network, IPC and UTS namespaces, as uid 65534 with no capabilities,
  on a read-only filesystem holding only the C libraries, the interpreter and its standard
  library, with a private size-capped ``/tmp``, a seccomp filter, rlimits and a wall
  timeout that kills its process group. Where bubblewrap or seccomp is unavailable,
  `run_tests` raises `SandboxUnavailable` (the code task refuses to start) — never a silent
  fallback;
- **weak** (``unsafe=True``, ``--unsafe_sandbox``; `rlscope.sandbox.weak`): the previous
  subprocess with an in-process audit hook. It stops accidents, not an adversary.

Statuses: ``ok`` (the program ran; each test passed or not), ``timeout`` (CPU or wall limit),
``crashed`` (no result: an exception while loading, a missing function, a non-zero exit),
``limit`` (output or memory cap), ``blocked`` (the isolated mode's seccomp filter killed the
program for a forbidden system call; the weak mode's guard refused an operation),
``invalid_output`` (the code is too long, or the child's answer is malformed). Every status
but ``ok`` scores 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rlscope.sandbox.common import (
    MAX_CODE_CHARS,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    Status,
    TestCase,
    TestOutcome,
    failed,
)
from rlscope.sandbox.isolated import isolation_problem, require_isolation, run_tests_isolated
from rlscope.sandbox.weak import run_tests_weak


def run_tests(code: str, function: str, tests: Sequence[TestCase],
              limits: SandboxLimits | None = None, *, unsafe: bool = False) -> SandboxResult:
    """Run ``code`` (Python source defining ``function``) in the sandbox and call
    ``function(*test.args)`` for each test; ``unsafe`` selects the weak mode. Never raises for
    anything the code does; raises ValueError for invalid ``limits`` or tests that are not
    plain JSON data (caller bugs) and SandboxUnavailable when the isolated mode cannot run
    here."""
    limits = limits or SandboxLimits()
    if problems := limits.validate():
        raise ValueError("; ".join(problems))
    try:
        json.dumps([list(t.args) for t in tests])
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"sandbox tests must be plain JSON data: {e}") from e
    start, n = time.monotonic(), len(tests)
    if not unsafe:
        require_isolation()
    if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
        return failed("invalid_output", f"code is not a string of at most {MAX_CODE_CHARS} "
                      "characters", n, start)
    if unsafe:
        return run_tests_weak(code, function, tests, limits, start)
    return run_tests_isolated(code, function, tests, limits, start)


def run_many(jobs: Sequence[tuple[str, str, Sequence[TestCase]]],
             limits: SandboxLimits | None = None, workers: int = 2, *,
             unsafe: bool = False) -> list[SandboxResult]:
    """`run_tests` on each ``(code, function, tests)``, at most ``workers`` sandboxes at a
    time (threads waiting on child processes: the pool bounds concurrent children, and the
    CPU they take, to ``workers``). Results in input order."""
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    if not unsafe:
        require_isolation()
    with ThreadPoolExecutor(max_workers=min(workers, max(len(jobs), 1))) as pool:
        return list(pool.map(
            lambda job: run_tests(job[0], job[1], job[2], limits, unsafe=unsafe), jobs))


__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "Status", "TestCase",
           "TestOutcome", "isolation_problem", "require_isolation", "run_many", "run_tests"]
