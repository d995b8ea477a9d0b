"""`rlscope.sandbox.repl.ReplSession`: a persistent sandboxed interpreter. The code task's
escape attempts (tests/test_sandbox.py), run both as written (the restricted builtins and the
import allow-list stop most of them first) and through a bypass of those restrictions (so the
operating-system isolation is what stops them), leave the test process and the host
unharmed; infinite loops, huge outputs and forbidden imports; a timeout or crash resets the
session without harming the caller; variables persist across blocks; the block clock pauses
while the parent answers a request."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_sandbox import ESCAPES, HOST_FILES, NEW_ATTACKS, PYPROJECT, SPECS, _live_with, _sessions

import rlscope.sandbox.repl as repl
from rlscope.sandbox import isolation_problem
from rlscope.sandbox.repl import ALLOWED_IMPORTS, ReplLimits, ReplResult, ReplSession

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
PROBLEM = isolation_problem() if sys.platform.startswith("linux") else "not Linux"
isolated_only = pytest.mark.skipif(bool(PROBLEM), reason=f"no isolated sandbox: {PROBLEM}")

TOOLS = '''
def tools(data, request):
    def ask(x):
        return request({"ask": x})
    return {"data": data, "ask": ask}
'''
"""A minimal tool set: ``data`` and ``ask(x)``, which asks the parent."""
LIMITS = ReplLimits(block_seconds=1.0, cpu_seconds=4, max_observation_chars=200)
BYPASS = ('_i = [c for c in ().__class__.__base__.__subclasses__() '
          'if c.__name__ == "BuiltinImporter"][0]\n'
          '_b = _i.load_module("sys").modules["builtins"]\n'
          'exec({code!r}, {{"__builtins__": _b}})\n')
"""Runs ``code`` with the real builtins (open, an unrestricted import): the interpreter-level
restrictions are a convenience, not the boundary."""


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture
def guarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: socket.socket) -> Any:
    """Runs blocks in a fresh session and checks the host afterwards (as tests/test_sandbox.py
    does): same cwd, the sentinel unchanged, no `HOST_FILES`, no connection to `listener`, no
    process left of the session once closed."""
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    pids: list[int] = []
    real_popen = subprocess.Popen

    class RecordingPopen(real_popen):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            pids.append(self.pid)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    marker = f"# rlscope-repl-test {os.getpid()} {time.monotonic_ns()}"
    monkeypatch.setattr(repl, "REPL_SOURCE", f"{marker}\n{repl.REPL_SOURCE}")
    cwd = os.getcwd()
    port = listener.getsockname()[1]

    def run(blocks: list[str], unsafe: bool = False, limits: ReplLimits = LIMITS,
            on_request: Callable[[Any], Any] | None = None) -> list[ReplResult]:
        session = ReplSession(TOOLS, {"n": 1}, limits, on_request, unsafe=unsafe)
        try:
            results = [session.run(b.replace("SENTINEL", str(sentinel))
                                   .replace("PYPROJECT", str(PYPROJECT))
                                   .replace("SPECS", str(SPECS)).replace("PORT", str(port)))
                       for b in blocks]
        finally:
            session.close()
        assert os.getcwd() == cwd
        assert sentinel.read_text() == "keep me"
        for path in HOST_FILES:
            assert not os.path.exists(path), f"the sandbox created {path} on the host"
        with pytest.raises(BlockingIOError):
            listener.accept()
        assert pids and not set(pids) & _sessions(), "a sandboxed process outlived its session"
        assert not _live_with(marker.encode()), "a sandboxed process outlived its session"
        return results

    return run


ATTACKS = {name: code for name, (code, _) in ESCAPES.items()} | {
    name: code for name, (code, _) in NEW_ATTACKS.items()}


DEFAULT = ("fork_bomb", "read_sentinel", "write_outside", "socket", "os_system", "kill_parent",
           "raise_limits", "print_100mb", "os_exit", "network_host_loopback", "kill_everyone",
           "flood_result_channel", "exec_python_again")
"""The attacks of the default suite (bypass variant); the others, and every restricted
variant, are slow tests."""


CASES = [pytest.param(name, bypass, id=f"{name}-{'bypass' if bypass else 'restricted'}",
                      marks=() if bypass and name in DEFAULT else pytest.mark.slow)
         for name in ATTACKS for bypass in (False, True)]


@isolated_only
@pytest.mark.parametrize(("name", "bypass"), CASES)
def test_escape_attempts_leave_host_unharmed_and_session_usable(guarded: Any, name: str,
                                                                bypass: bool) -> None:
    """The bypass variant is the real test of the isolation; the restricted one (slow) shows
    what the restrictions alone give."""
    code = ATTACKS[name]
    attack = BYPASS.format(code=code) if bypass else code
    first, after = guarded([attack, "print(6 * 7)"])
    assert first.status in {"ok", "error", "timeout", "crashed", "limit"}
    assert len(first.observation) <= LIMITS.max_observation_chars
    assert after.observation == "42\n", (name, first, after)  # a fresh or the same session


@isolated_only
def test_bypass_really_reaches_the_real_builtins(guarded: Any) -> None:
    """The bypass is not a no-op: with it, ``open`` works inside the sandbox's own /tmp."""
    (result,) = guarded([BYPASS.format(code="open('/tmp/x', 'w').write('hi')\n"
                                            "print(open('/tmp/x').read())")])
    assert (result.status, result.observation) == ("ok", "hi\n")


@isolated_only
def test_restricted_builtins_and_import_allow_list(guarded: Any) -> None:
    results = guarded(["open('/etc/passwd')", "input()", "import os", "from os import path",
                       "import socket", "exit()", "help()", "breakpoint()",
                       "import " + ", ".join(ALLOWED_IMPORTS) + "\nimport collections.abc\n"
                       "print(re.sub('a', 'b', 'aa'), math.floor(2.5))"])
    *refused, allowed = results
    assert [r.status for r in refused] == ["error"] * 8
    assert refused[0].observation == "NameError: name 'open' is not defined"
    assert refused[2].observation.startswith("ImportError: import of 'os' is not allowed")
    assert refused[3].observation.startswith("ImportError: import of 'os' is not allowed")
    assert (allowed.status, allowed.observation) == ("ok", "bb 2\n")


@isolated_only
def test_variables_persist_and_observation_is_stdout_then_error(guarded: Any) -> None:
    results = guarded(["x = 40", "x += 2\nprint('x is', x)", "print(x)\n1 / 0",
                       "SHOW_VARS()", "FINAL_VAR('x')", "FINAL(('a', 'b'))",
                       "FINAL(object())", "FINAL_VAR('nope')", "print(data)"])
    assert results[0] == ReplResult("ok", "", "", "", seconds=results[0].seconds)
    assert results[1].observation == "x is 42\n"
    assert (results[2].status, results[2].observation) == (
        "error", "42\nZeroDivisionError: division by zero")
    assert results[3].observation == "x: int\n"
    assert (results[4].has_final, results[4].final) == (True, 42)
    assert (results[5].has_final, results[5].final) == (True, ["a", "b"])
    assert results[6].has_final and results[6].final.startswith("<object object at")
    assert (results[7].has_final, results[7].observation) == (
        False, "NameError: FINAL_VAR: no variable named 'nope'")
    assert results[8].observation == "{'n': 1}\n"


@isolated_only
def test_infinite_loop_times_out_and_resets_without_harming_the_caller(guarded: Any) -> None:
    start = time.monotonic()
    before, loop, after, sleep = guarded(["x = 1", "while True:\n    pass", "print(x)",
                                          BYPASS.format(code="import time\ntime.sleep(100)")])
    assert before.status == "ok"
    assert (loop.status, loop.reset) == ("timeout", True)
    assert "reset" in loop.observation and "variables are lost" in loop.observation
    assert after.observation == "NameError: name 'x' is not defined"  # a fresh session
    assert (sleep.status, sleep.reset) == ("timeout", True)
    assert time.monotonic() - start < 2 * LIMITS.block_seconds + 3.0


@isolated_only
def test_huge_output_is_cut_and_the_session_lives(guarded: Any) -> None:
    flood, spam, after = guarded(["print('x' * 10**8)",
                                  "for i in range(10**5):\n    print(i)\ny = 5",
                                  "print(y)"])
    assert (flood.status, flood.observation) == ("ok", "x" * LIMITS.max_observation_chars)
    assert spam.status == "ok" and len(spam.observation) == LIMITS.max_observation_chars
    assert spam.observation.startswith("0\n1\n2\n")
    assert after.observation == "5\n"


@isolated_only
def test_cpu_limit_kills_the_session(guarded: Any) -> None:
    limits = ReplLimits(block_seconds=20.0, cpu_seconds=1, max_observation_chars=200)
    start = time.monotonic()
    busy, after = guarded(["while True:\n    pass", "print('back')"], limits=limits)
    assert (busy.status, busy.reset) == ("crashed", True)
    assert after.observation == "back\n"
    assert time.monotonic() - start < 10.0


@isolated_only
def test_clock_pauses_while_the_parent_answers(guarded: Any) -> None:
    def slow(payload: Any) -> Any:
        time.sleep(1.5 * LIMITS.block_seconds)
        return {"answer": payload["ask"] * 2}

    (result,) = guarded(["print(ask(21))"], on_request=slow)
    assert (result.status, result.observation) == ("ok", "{'answer': 42}\n")
    assert result.seconds > 1.5 * LIMITS.block_seconds


@isolated_only
def test_parent_handler_error_propagates_and_kills_the_session() -> None:
    def broken(payload: Any) -> Any:
        raise KeyError("parent bug")

    session = ReplSession(TOOLS, {}, LIMITS, broken)
    with pytest.raises(KeyError, match="parent bug"):
        session.run("ask(1)")
    assert not session.alive
    assert session.run("print(1)").observation == "1\n"
    session.close()


@isolated_only
def test_crash_resets_with_a_notice(guarded: Any) -> None:
    bypass = BYPASS.format(code="import os\nos._exit(3)")
    first, crash, after = guarded(["x = 1", bypass, "print('x' in dir())"])
    assert first.status == "ok" and (crash.status, crash.reset) == ("crashed", True)
    assert crash.observation.startswith("[REPL crashed: the session died")
    assert after.observation == "False\n"


def test_weak_mode_runs_blocks_and_resets(guarded: Any) -> None:
    results = guarded(["x = 2", "print(x * 21)", "import os", "while True:\n    pass",
                       "print(x)"], unsafe=True)
    assert [r.status for r in results] == ["ok", "ok", "error", "timeout", "error"]
    assert results[1].observation == "42\n"


def test_invalid_limits_and_messages_raise() -> None:
    with pytest.raises(ValueError, match="block_seconds=0"):
        ReplSession(TOOLS, {}, ReplLimits(block_seconds=0))
    session = ReplSession(TOOLS, {}, LIMITS, lambda p: object(), unsafe=True)
    with pytest.raises(ValueError, match="plain JSON"):
        session.run("ask(1)")
    assert not session.alive
    too_long = session.run("x" * (repl.MAX_CODE_CHARS + 1))
    assert too_long.status == "error" and not session.alive


@isolated_only
def test_sessions_launched_together_all_run(guarded: Any) -> None:
    """`launch` starts several children before any is waited for (the tree driver boots a
    lockstep batch's sessions at once); each then runs, in whatever order."""
    sessions = [ReplSession(TOOLS, {"n": i}, LIMITS) for i in range(4)]
    try:
        for s in sessions:
            s.launch()
        assert all(s.alive for s in sessions)
        results = [s.run("print(data['n'])") for s in reversed(sessions)]
    finally:
        for s in sessions:
            s.close()
    assert [r.observation for r in results] == ["3\n", "2\n", "1\n", "0\n"]
    assert guarded(["print('host checks')"])[0].observation == "host checks\n"


@isolated_only
def test_final_values_are_not_cut_to_the_observation(guarded: Any) -> None:
    big, cut = guarded(["FINAL(['y' * 100] * 50)", "FINAL(['z' * 100] * 50 + [1])"],
                       limits=replace(LIMITS, max_final_chars=2000))
    assert (big.has_final, cut.has_final) == (True, True)
    # both are over 2,000 JSON characters: their repr, cut to 2,000
    assert big.final == repr(["y" * 100] * 50)[:2000]
    assert cut.final == repr(["z" * 100] * 50 + [1])[:2000]
    (whole,) = guarded(["FINAL(['y' * 100] * 50)"])  # default 65,536: the value itself
    assert whole.final == ["y" * 100] * 50
