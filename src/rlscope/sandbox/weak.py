"""The WEAK mode (``--unsafe_sandbox``): the previous sandbox, kept only for machines where the
operating-system isolation (`rlscope.sandbox.isolated`) is unavailable. NOT a security
boundary: see docs/sandbox.md for the attacks it does not stop.

A plain ``python -I -S -B`` subprocess of the trainer's user, in a new session and a fresh
temporary directory, with resource limits and an in-process audit hook
(``weak_harness.py``: refuses sockets, new processes, reads and writes outside the temporary
directory and the standard library). The audit hook and the result channel share one
interpreter with the untrusted code, so the code can disable or forge them; the expected
outputs still stay in the parent, which compares the returned values itself.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlscope.sandbox.common import (
    SandboxLimits,
    SandboxResult,
    TestCase,
    failed,
    judge,
    rlimits,
    run_child,
    well_formed,
)

HARNESS = Path(__file__).with_name("weak_harness.py")


def _parse(stdout: bytes, nonce: str, n_tests: int) -> dict[str, Any] | None:
    """The nonce-prefixed result object, or None if absent or malformed."""
    prefix = nonce.encode()
    for line in reversed(stdout.splitlines()):
        if not line.startswith(prefix):
            continue
        try:
            out = json.loads(line[len(prefix):].decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if well_formed(out, n_tests) and isinstance(out.get("violations"), list):
            return out
        return None
    return None


def run_tests_weak(code: str, function: str, tests: Sequence[TestCase],
                   limits: SandboxLimits, start: float) -> SandboxResult:
    """`rlscope.sandbox.run_tests` in the weak mode (arguments already checked)."""
    n = len(tests)
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="rlscope-sandbox-") as root:
        payload = json.dumps({
            "nonce": nonce, "code": code, "function": function, "root": root,
            "args": [list(t.args) for t in tests], "limits": rlimits(limits),
            "per_test_seconds": limits.per_test_seconds}).encode("utf-8")
        child = run_child(lambda: subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(HARNESS)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root,
            env={"LC_ALL": "C.UTF-8"}, close_fds=True, start_new_session=True),
            payload, limits, n, start)
    if isinstance(child, SandboxResult):
        return child
    stdout, _, rc = child
    out = _parse(stdout, nonce, n)
    if out is None:
        if rc in (-signal.SIGXCPU, -signal.SIGKILL):
            return failed("timeout", f"CPU time limit of {limits.cpu_seconds} s", n, start)
        if rc != 0 or not stdout:
            return failed("crashed", f"exited with code {rc} without a result", n, start)
        return failed("invalid_output", "no well-formed result line", n, start)
    if out["violations"]:
        return failed("blocked", str(out["violations"][0])[:300], n, start)
    return judge(tests, out, start)
