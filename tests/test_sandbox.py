"""`rlscope.sandbox`: every escape attempt scores 0 with the right status within its limits,
and the test process is unharmed (cwd, a sentinel file outside the sandbox, no leftover
processes). Each case runs one short-lived child; limits are small to keep the file fast."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import rlscope.sandbox as sandbox
from rlscope.sandbox import SandboxLimits, TestCase, run_many, run_tests

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2.0, per_test_seconds=0.5)
ADD_TESTS = [TestCase((1, 2), 3), TestCase((2, 2), 4), TestCase((-1, 1), 0), TestCase((5, 0), 5)]
GOOD = "def add(a, b):\n    return a + b\n"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _sessions() -> set[int]:
    """Session ids of every live process (Linux /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            out.add(int(fields[4]))
    return out


@pytest.fixture
def guarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs code and checks afterwards that the test process is unharmed: same cwd, the
    sentinel file outside the sandbox unchanged, no process left in the child's session."""
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    pids: list[int] = []
    real_popen = subprocess.Popen

    class RecordingPopen(real_popen):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            pids.append(self.pid)

    monkeypatch.setattr(sandbox.subprocess, "Popen", RecordingPopen)
    cwd = os.getcwd()

    def run(code: str, tests: list[TestCase] = ADD_TESTS,
            limits: SandboxLimits = LIMITS) -> tuple[sandbox.SandboxResult, float]:
        code = code.replace("SENTINEL", str(sentinel)).replace("PYPROJECT", str(PYPROJECT))
        start = time.monotonic()
        result = run_tests(code, "add", tests, limits)
        elapsed = time.monotonic() - start
        assert os.getcwd() == cwd
        assert sentinel.read_text() == "keep me"
        assert pids and not set(pids) & _sessions(), "a sandboxed process outlived its run"
        assert elapsed < limits.wall_seconds + 1.0
        return result, elapsed

    return run


ESCAPES = {
    "infinite_loop": ("while True:\n    pass\n", "timeout"),
    "sleep_forever": ("import time\ntime.sleep(100)\n", "timeout"),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", "blocked"),
    "huge_allocation": ("x = bytearray(10**11)\n", "limit"),
    "read_sentinel": ("open('SENTINEL').read()\n" + GOOD, "blocked"),
    "read_passwd": ("open('/etc/passwd').read()\n" + GOOD, "blocked"),
    "read_pyproject": ("open('PYPROJECT').read()\n" + GOOD, "blocked"),
    "read_relative_escape": ("open('../../../../../../etc/passwd').read()\n" + GOOD, "blocked"),
    "write_outside": ("open('SENTINEL', 'w').write('gone')\n" + GOOD, "blocked"),
    "write_os_open": ("import os\nos.open('SENTINEL', os.O_WRONLY | os.O_TRUNC)\n" + GOOD,
                      "blocked"),
    "delete_outside": ("import os\nos.remove('SENTINEL')\n" + GOOD, "blocked"),
    "rename_outside": ("import os\nos.rename('SENTINEL', 'stolen')\n" + GOOD, "blocked"),
    "rmtree_outside": ("import shutil\nshutil.rmtree('/tmp/nothing-here')\n" + GOOD, "blocked"),
    "symlink_out": ("import os\nos.symlink('SENTINEL', 'link')\n" + GOOD, "blocked"),
    "socket": ("import socket\nsocket.socket().connect(('127.0.0.1', 80))\n" + GOOD, "blocked"),
    "os_system": ("import os\nos.system('touch /tmp/rlscope-sandbox-x')\n" + GOOD, "blocked"),
    "subprocess_run": ("import subprocess\nsubprocess.run(['true'])\n" + GOOD, "blocked"),
    "os_exec": ("import os\nos.execv('/bin/true', ['true'])\n", "blocked"),
    "ctypes": ("import ctypes\n" + GOOD, "blocked"),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + GOOD,
                    "blocked"),
    "raise_limits": ("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\n"
                     + GOOD, "blocked"),
    "print_100mb": ("import sys\nsys.stdout.write('x' * 100_000_000)\n" + GOOD, "limit"),
    "sys_exit_before_tests": ("import sys\nsys.exit(0)\n" + GOOD, "crashed"),
    "os_exit": ("import os\nos._exit(0)\n", "crashed"),
    "segfault_exit_code": ("import os\nos.abort()\n", "crashed"),
    "syntax_error": ("def add(a, b)\n    return a + b\n", "crashed"),
    "missing_function": ("def plus(a, b):\n    return a + b\n", "crashed"),
    "caught_violation": ("try:\n    open('/etc/passwd')\nexcept Exception:\n    pass\n" + GOOD,
                         "blocked"),
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_scores_zero_with_status(guarded: Any, name: str) -> None:
    code, status = ESCAPES[name]
    result, _ = guarded(code)
    assert (result.status, result.passed, result.reward) == (status, 0, 0.0), result
    assert result.total == len(ADD_TESTS) and len(result.outcomes) == len(ADD_TESTS)
    assert result.reason
    assert not Path("/tmp/rlscope-sandbox-x").exists()


def test_correct_solution_passes_all(guarded: Any) -> None:
    result, _ = guarded("import math, json, re, collections\n" + GOOD)
    assert (result.status, result.passed, result.reward) == ("ok", 4, 1.0)
    assert all(o.passed for o in result.outcomes)


def test_partial_solution_scores_the_fraction(guarded: Any) -> None:
    result, _ = guarded("def add(a, b):\n    return 2 * a if a == 2 else a\n")
    assert (result.status, result.passed, result.reward) == ("ok", 2, 0.5)
    assert [o.passed for o in result.outcomes] == [False, True, False, True]
    assert result.outcomes[0].error == "wrong answer"


def test_failing_tests_fail_alone(guarded: Any) -> None:
    """SystemExit, an exception and a slow call inside a test fail that test only."""
    code = ("import sys\ndef add(a, b):\n    if a == 1:\n        raise SystemExit(0)\n"
            "    if a == 2:\n        raise ValueError\n    if a == 5:\n        while True:\n"
            "            pass\n    return a + b\n")
    result, _ = guarded(code)
    assert (result.status, result.passed) == ("ok", 1)
    assert [o.error for o in result.outcomes] == ["SystemExit", "ValueError", "", "TestTimeout"]


def test_lying_return_values_do_not_pass(guarded: Any) -> None:
    """An object equal to everything, an int subclass, and a forged result line on stdout."""
    always = ("class A:\n    def __eq__(self, o):\n        return True\n"
              "def add(a, b):\n    return A()\n")
    assert guarded(always)[0].passed == 0
    sub = "class I(int):\n    pass\ndef add(a, b):\n    return I(a + b)\n"
    assert guarded(sub)[0].passed == 0
    forged = ('print(\'{"load": "ok", "tests": [], "violations": []}\')\n'
              "def add(a, b):\n    return None\n")
    assert guarded(forged)[0].passed == 0


def test_writing_inside_the_root_is_allowed(guarded: Any) -> None:
    code = ("with open('scratch.txt', 'w') as f:\n    f.write('ok')\n"
            "import os\nos.remove('scratch.txt')\n" + GOOD)
    assert guarded(code)[0].status == "ok"


def test_garbage_code_never_raises(guarded: Any) -> None:
    for code in ("", "\x00\x01\xff", "\udcff = 1", "é" * 1000, "def add(:\n" * 500):
        result, _ = guarded(code)
        assert result.passed == 0 and result.status != "ok", (code[:20], result)
    assert run_tests("x" * 300_000, "add", ADD_TESTS, LIMITS).status == "invalid_output"


def test_float_tolerance_and_containers(guarded: Any) -> None:
    tests = [TestCase((0.1, 0.2), 0.3), TestCase(([1], [2]), [1, 2]),
             TestCase((True, False), True)]
    code = ("def add(a, b):\n    if isinstance(a, list):\n        return tuple(a + b)\n"
            "    if isinstance(a, bool):\n        return 1\n    return a + b\n")
    result, _ = guarded(code, tests)
    assert [o.passed for o in result.outcomes] == [True, True, False]


def test_run_many_keeps_order_and_bounds_time() -> None:
    jobs = [(GOOD if i % 2 else "while True:\n    pass\n", "add", ADD_TESTS) for i in range(4)]
    start = time.monotonic()
    results = run_many(jobs, SandboxLimits(cpu_seconds=1, wall_seconds=2.0), workers=2)
    assert [r.status for r in results] == ["timeout", "ok", "timeout", "ok"]
    assert time.monotonic() - start < 6.0


def test_invalid_limits_and_tests_raise() -> None:
    with pytest.raises(ValueError, match="cpu_seconds"):
        run_tests(GOOD, "add", ADD_TESTS, SandboxLimits(cpu_seconds=0))
    with pytest.raises(ValueError, match="plain JSON"):
        run_tests(GOOD, "add", [TestCase((object(),), 1)], LIMITS)
