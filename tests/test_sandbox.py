"""`rlscope.sandbox`: every attack scores 0 and leaves the test process and the host unharmed
(cwd, a sentinel file outside the sandbox, files it tried to create, no leftover processes,
no connection to a host socket), in the isolated mode (bubblewrap, docs/sandbox.md). The
attacks of issue 13 that beat the old audit-hook sandbox are regression tests; the weak mode
(``unsafe=True``) and the refusal without bubblewrap are tested at the end. Each case runs
one short-lived child (~30 ms); limits are small to keep the file fast."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import rlscope.sandbox.isolated as isolated
from rlscope.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    TestCase,
    isolation_problem,
    run_many,
    run_tests,
)
from rlscope.sandbox.common import equal
from rlscope.tasks.base import TaskConfig
from rlscope.tasks.code import CodeConfig, CodeUnitTestsTask, load_specs, score_programs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
PROBLEM = isolation_problem() if sys.platform.startswith("linux") else "not Linux"
isolated_only = pytest.mark.skipif(bool(PROBLEM), reason=f"no isolated sandbox: {PROBLEM}")

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2.0, per_test_seconds=0.5)
QUICK = SandboxLimits(cpu_seconds=1, wall_seconds=1.0, per_test_seconds=0.3)
"""For programs expected to time out: a shorter wall limit keeps the file fast."""
FILLING = SandboxLimits(cpu_seconds=5, wall_seconds=5.0, per_test_seconds=0.5)
"""For programs that fill memory page by page: touching ~450 MB before the 512 MB address
space runs out took 0.3 s of CPU here but over 1 s on a CI machine (2026-11-27), so under
`LIMITS` the CPU limit could trip first; with room to spare the memory limit is the one hit."""
ADD_TESTS = [TestCase((1, 2), 3), TestCase((2, 2), 4), TestCase((-1, 1), 0), TestCase((5, 0), 5)]
GOOD = "def add(a, b):\n    return a + b\n"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
SPECS = Path(str(resources.files("rlscope.data").joinpath("code_specs.json"))).resolve()
HOST_FILES = ("/tmp/rlscope-sandbox-x", "/rlscope-sandbox-x", "/usr/lib/rlscope-sandbox-x")
"""Files attacks try to create on the host; none may exist after a run."""
SECRET = "rlscope-test-secret-3f9a"
"""Put in the test process's environment: no sandboxed program may see it."""


def _sp(result: SandboxResult) -> tuple[str, int]:
    return result.status, result.passed


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


def _live_with(marker: bytes, grace: float = 2.0) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker``, after waiting up to
    ``grace`` s for dying ones (the sandbox's processes die of their parent's death, just
    after the parent reaps bubblewrap)."""
    deadline = time.monotonic() + grace
    while True:
        live = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if (marker in (proc / "cmdline").read_bytes()
                        and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                    live.append(int(proc.name))
            except (OSError, IndexError):
                continue
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP server on the host's 127.0.0.1 that no sandboxed program may reach."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture
def guarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: socket.socket) -> Any:
    """Runs code and checks afterwards that the test process and host are unharmed: same cwd,
    the sentinel file outside the sandbox unchanged, none of `HOST_FILES` created, no
    connection to `listener`, no process left in the child's session nor any running the
    harness of this test (bubblewrap's ``--new-session`` puts the isolated program in a
    session of its own, so a run is tagged by a comment in the harness source it is given)."""
    for path in HOST_FILES:
        assert not os.path.exists(path), f"leftover {path}"
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    monkeypatch.setenv("RLSCOPE_SECRET", SECRET)
    pids: list[int] = []
    real_popen = subprocess.Popen

    class RecordingPopen(real_popen):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            pids.append(self.pid)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    marker = f"# rlscope-test-run {os.getpid()} {time.monotonic_ns()}"
    monkeypatch.setattr(isolated, "HARNESS_SOURCE", f"{marker}\n{isolated.HARNESS_SOURCE}")
    cwd = os.getcwd()
    port = listener.getsockname()[1]

    def run(code: str, tests: list[TestCase] = ADD_TESTS, limits: SandboxLimits = LIMITS,
            function: str = "add", unsafe: bool = False) -> tuple[SandboxResult, float]:
        code = (code.replace("SENTINEL", str(sentinel)).replace("PYPROJECT", str(PYPROJECT))
                .replace("SPECS", str(SPECS)).replace("PORT", str(port)))
        start = time.monotonic()
        result = run_tests(code, function, tests, limits, unsafe=unsafe)
        elapsed = time.monotonic() - start
        assert os.getcwd() == cwd
        assert sentinel.read_text() == "keep me"
        for path in HOST_FILES:
            assert not os.path.exists(path), f"the sandbox created {path} on the host"
        with pytest.raises(BlockingIOError):
            listener.accept()
        assert pids and not set(pids) & _sessions(), "a sandboxed process outlived its run"
        assert not _live_with(marker.encode()), "a sandboxed process outlived its run"
        assert elapsed < limits.wall_seconds + 1.0
        assert result.total == len(tests) and len(result.outcomes) == len(tests)
        return result, elapsed

    return run


ESCAPES = {  # the 28 attempts of the audit-hook sandbox, adapted; GOOD follows each attack
    "infinite_loop": ("while True:\n    pass\n", "timeout"),
    "sleep_forever": ("import time\ntime.sleep(100)\n", "timeout"),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", "blocked"),
    "huge_allocation": ("x = bytearray(10**11)\n", "limit"),
    "read_sentinel": ("open('SENTINEL').read()\n", "crashed"),
    "read_passwd": ("open('/etc/passwd').read()\n", "crashed"),
    "read_pyproject": ("open('PYPROJECT').read()\n", "crashed"),
    "read_relative_escape": ("open('../../../../../../etc/passwd').read()\n", "crashed"),
    "write_outside": ("open('SENTINEL', 'w').write('gone')\n", "crashed"),
    "write_os_open": ("import os\nos.open('SENTINEL', os.O_WRONLY | os.O_TRUNC)\n", "crashed"),
    "delete_outside": ("import os\nos.remove('SENTINEL')\n", "crashed"),
    "rename_outside": ("import os\nos.rename('SENTINEL', 'stolen')\n", "crashed"),
    "rmtree_outside": ("import shutil\nshutil.rmtree('/usr/lib')\n", "crashed"),
    "symlink_out": ("import os\nos.symlink('SENTINEL', 'link')\nopen('link', 'w').write('x')\n",
                    "crashed"),
    "socket": ("import socket\nsocket.socket().connect(('127.0.0.1', PORT))\n", "blocked"),
    "os_system": ("import os\nos.system('touch /tmp/rlscope-sandbox-x')\n", "blocked"),
    "subprocess_run": ("import subprocess\nsubprocess.run(['true'])\n", "blocked"),
    "os_exec": ("import os\nos.execv('/bin/true', ['true'])\n", "crashed"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).unshare(0x10000000)\n", "blocked"),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "blocked"),
    "raise_limits": ("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\n",
                     "crashed"),
    "print_100mb": ("import sys\nsys.stdout.write('x' * 100_000_000)\n", "limit"),
    "sys_exit_before_tests": ("import sys\nsys.exit(0)\n", "crashed"),
    "os_exit": ("import os\nos._exit(0)\n", "crashed"),
    "segfault_exit_code": ("import os\nos.abort()\n", "crashed"),
    "syntax_error": ("def add(a, b)\n    return a + b\n", "crashed"),
    "missing_function": ("def plus(a, b):\n    return a + b\n", "crashed"),
    "caught_violation": ("try:\n    open('/etc/passwd').read()\nexcept OSError:\n"
                         "    raise SystemExit(1)\n", "crashed"),
}

NEW_ATTACKS = {  # 10+ more: each either fails inside the child or earns nothing
    "thread_bomb": ("import threading, time\nfor _ in range(100_000):\n"
                    "    threading.Thread(target=time.sleep, args=(60,)).start()\n",
                    {"crashed", "limit"}),
    "write_host_tmp": ("open('/tmp/rlscope-sandbox-x', 'w').write('x')\n"
                       "def add(a, b):\n    return None\n", {"ok"}),
    "write_root": ("open('/rlscope-sandbox-x', 'w').write('x')\n", {"crashed"}),
    "write_usr_lib": ("open('/usr/lib/rlscope-sandbox-x', 'w').write('x')\n", {"crashed"}),
    "network_host_loopback": ("import socket\nsocket.create_connection(('127.0.0.1', PORT), 1)\n",
                              {"blocked"}),
    "udp_dns": ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "s.sendto(b'x', ('8.8.8.8', 53))\n", {"blocked"}),
    "netlink": ("import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW)\n",
                {"blocked"}),
    "read_shadow": ("open('/etc/shadow').read()\n", {"crashed"}),
    "ptrace_init": ("import ctypes\nctypes.CDLL(None).ptrace(16, 1, 0, 0)\n", {"blocked"}),
    "kill_everyone": ("import os\nos.kill(-1, 9)\n", {"blocked"}),
    "killpg_own_group": ("import os\nos.killpg(0, 9)\n", {"blocked"}),
    "mount_tmpfs": ("import ctypes\nctypes.CDLL(None).mount(b'none', b'/tmp', b'tmpfs', 0, None)\n",
                    {"blocked"}),
    "bpf": ("import ctypes\nctypes.CDLL(None).syscall(321, 0, 0, 0)\n", {"blocked"}),
    "setuid_root": ("import os\nos.setuid(0)\n", {"crashed"}),
    "import_rlscope": ("import rlscope\n", {"crashed"}),
    "import_site_packages": ("import torch\n", {"crashed"}),
    "infinite_recursion_c": ("import sys\nsys.setrecursionlimit(10**8)\n"
                             "def f(n):\n    return f(n + 1)\nf(0)\n",
                             {"crashed", "limit", "timeout"}),
    "ignore_alarm_and_sleep": ("import signal, time\n"
                               "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                               "def add(a, b):\n    time.sleep(100)\n", {"timeout"}),
    "memory_bomb": ("x = [bytearray(10**6) for _ in range(10**4)]\n", {"limit"}),
    "fill_dev_shm": ("open('/dev/shm/x', 'wb').write(b'x' * 10**6)\n", {"crashed"}),
    "fill_tmp": ("for i in range(100):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * 10**6)\n",
                 {"crashed"}),
    "flood_result_channel": ("import os\nfor fd in (1, 2, 3):\n"
                             "    os.write(fd, b'x' * 3_000_000)\n", {"limit"}),
    "deeply_nested_result_line": ("import os\nos.write(3, b'[' * 900_000)\nos._exit(0)\n",
                                  {"invalid_output"}),
    "exec_python_again": ("import os, sys\nos.execv(sys.executable, [sys.executable, '-c', "
                          "'print(1)'])\n", {"crashed"}),
}


@isolated_only
@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_scores_zero_with_status(guarded: Any, name: str) -> None:
    code, status = ESCAPES[name]
    result, _ = guarded(code if "def " in code else code + GOOD,
                        limits=QUICK if status == "timeout" else LIMITS)
    assert (result.status, result.passed, result.reward) == (status, 0, 0.0), result
    assert result.reason


@isolated_only
@pytest.mark.parametrize("name", list(NEW_ATTACKS))
def test_new_attack_scores_zero_and_host_unharmed(guarded: Any, name: str) -> None:
    code, statuses = NEW_ATTACKS[name]
    limits = QUICK if statuses == {"timeout"} else FILLING if name == "memory_bomb" else LIMITS
    result, _ = guarded(code if "def add" in code else code + GOOD, limits=limits)
    assert result.status in statuses and result.passed == 0, result


# --- the attacks of issue 13 that beat the audit-hook sandbox --------------------------------

FORGED = ('{"load": "ok", "load_error": "", "violations": [], "passed": true, '
          '"tests": [{"value": null, "error": "", "passed": true}]}')


@isolated_only
def test_forged_json_dumps_passes_nothing(guarded: Any) -> None:
    """A body returning None that replaces ``json.dumps`` (and ``json.dump``, and the harness's
    own reference through ``__main__``) with a forger of all-pass results."""
    code = (f"import json, __main__\nFORGED = {FORGED!r}\n"
            "def forged(*a, **k):\n    return FORGED\n"
            "json.dumps = json.dump = forged\n"
            "for name in list(vars(__main__)):\n"
            "    if 'dump' in name:\n        setattr(__main__, name, forged)\n"
            "def add(a, b):\n    return None\n")
    result, _ = guarded(code)
    assert (result.status, result.passed) == ("ok", 0)
    # writing the forgery straight into every pipe, then leaving, is no better
    direct = ("import os\nfor fd in range(1, 8):\n    try:\n"
              f"        os.write(fd, ({FORGED!r} + '\\n').encode())\n"
              "    except OSError:\n        pass\nos._exit(0)\n")
    result, _ = guarded(direct)
    assert result.passed == 0 and result.status in ("invalid_output", "crashed"), result


ANSWER_KEY = """import os, json
key = None
stdlib = os.open(os.path.dirname(os.__file__), os.O_RDONLY | os.O_DIRECTORY)
rel = 'SPECS'.lstrip('/')
for n in range(0, 16):
    for path in ('../' * n + rel, 'SPECS'):
        try:
            fd = os.open(path, os.O_RDONLY, dir_fd=stdlib)
        except OSError:
            continue
        with os.fdopen(fd) as f:
            key = json.load(f)
        break
def FUNCTION(*args):
    for spec in key or []:
        for t in spec['tests']:
            if t['args'] == list(args):
                return t['expected']
    return '<no answer key>'
"""


@isolated_only
def test_directory_handle_answer_key_is_not_visible(guarded: Any) -> None:
    """Opening the stdlib directory as a handle and walking ``'../' * n + path`` to
    rlscope/data/code_specs.json read every expected output; now the file is not in the
    child's filesystem at all. Held-out specs included: each scores 0."""
    assert SPECS.is_file()
    heldout = [s for s in load_specs() if s.heldout]
    for spec in [*heldout[:2], load_specs()[0]]:
        code = ANSWER_KEY.replace("FUNCTION", spec.function)
        result, _ = guarded(code, list(spec.tests), function=spec.function)
        assert (result.status, result.passed) == ("ok", 0), (spec.function, result)


@isolated_only
def test_main_table_overwrite_does_not_reenable_processes_or_sockets(guarded: Any) -> None:
    """Emptying every table of ``__main__`` (the old guard's lists of blocked events and
    imports) and then running a shell or connecting to the host: the seccomp filter is in the
    kernel, not in ``__main__``."""
    wipe = ("import __main__\nfor name, value in list(vars(__main__).items()):\n"
            "    if isinstance(value, (tuple, frozenset, set, dict, list)):\n"
            "        setattr(__main__, name, type(value)())\n")
    shell = wipe + ("import subprocess\nsubprocess.run(['/bin/sh', '-c', "
                    "'touch /tmp/rlscope-sandbox-x'])\n" + GOOD)
    assert _sp(guarded(shell)[0]) == ("blocked", 0)
    net = wipe + "import socket\nsocket.create_connection(('127.0.0.1', PORT), 1)\n" + GOOD
    assert _sp(guarded(net)[0]) == ("blocked", 0)


@isolated_only
def test_gc_path_check_replacement_cannot_write_outside(guarded: Any) -> None:
    """Replacing every path-check-like function found through ``gc`` (the old guard's
    ``inside``) and writing to the sentinel outside the sandbox and to the host's /tmp."""
    code = ("import gc\nfor obj in gc.get_objects():\n"
            "    if callable(obj) and getattr(obj, '__name__', '') in "
            "('inside', 'guard', 'deny'):\n"
            "        try:\n            obj.__code__ = (lambda *a, **k: True).__code__\n"
            "        except (AttributeError, TypeError, ValueError):\n            pass\n"
            "open('SENTINEL', 'w').write('gone')\n" + GOOD)
    assert _sp(guarded(code)[0]) == ("crashed", 0)


@isolated_only
def test_parent_environment_is_not_readable(guarded: Any) -> None:
    """``/proc/<ppid>/environ`` (and every other process's) gave the trainer's environment;
    the child has no /proc and an environment of its own. The body earns reward only if it
    finds the secret the test process holds."""
    assert os.environ["RLSCOPE_SECRET"] == SECRET
    code = ("import os\nseen = repr(dict(os.environ))\n"
            "for pid in ('self', str(os.getppid()), '1', '2'):\n    try:\n"
            "        seen += open(f'/proc/{pid}/environ').read()\n"
            "    except OSError:\n        pass\n"
            f"def add(a, b):\n    return a + b if {SECRET!r} in seen else None\n")
    result, _ = guarded(code)
    assert (result.status, result.passed) == ("ok", 0)
    probe = "import os\ndef add(a, b):\n    return sorted(os.environ)\n"
    result, _ = guarded(probe, [TestCase((0, 0), ["LC_ALL", "PWD"])])
    assert (result.status, result.passed) == ("ok", 1)


@isolated_only
def test_violation_list_tampering_does_not_turn_blocked_into_ok(guarded: Any) -> None:
    """Clearing every list in the interpreter after a caught forbidden call: the kill comes
    from the kernel, so there is nothing to clear."""
    code = ("import gc, os\ntry:\n    os.fork()\nexcept OSError:\n    pass\n"
            "for obj in gc.get_objects():\n    if isinstance(obj, list):\n        obj.clear()\n"
            + GOOD)
    assert _sp(guarded(code)[0]) == ("blocked", 0)


# --- ordinary programs ------------------------------------------------------------------------


@isolated_only
def test_correct_solution_passes_all_and_wrong_fails(guarded: Any) -> None:
    result, _ = guarded("import math, json, re, collections, itertools, functools\n" + GOOD)
    assert (result.status, result.passed, result.reward) == ("ok", 4, 1.0)
    assert all(o.passed for o in result.outcomes)
    result, _ = guarded("def add(a, b):\n    return 2 * a if a == 2 else a\n")
    assert (result.status, result.passed, result.reward) == ("ok", 2, 0.5)
    assert [o.passed for o in result.outcomes] == [False, True, False, True]
    assert result.outcomes[0].error == "wrong answer"


@isolated_only
def test_failing_tests_fail_alone(guarded: Any) -> None:
    """SystemExit, an exception, a slow call and plain recursion inside a test fail that test
    only."""
    code = ("import sys\ndef add(a, b):\n    if a == 1:\n        raise SystemExit(0)\n"
            "    if a == 2:\n        raise ValueError\n    if a == 5:\n        while True:\n"
            "            pass\n    if a == 7:\n        return add(a, b)\n    return a + b\n")
    result, _ = guarded(code, [*ADD_TESTS, TestCase((7, 0), 7)])
    assert (result.status, result.passed) == ("ok", 1)
    assert [o.error for o in result.outcomes] == ["SystemExit", "ValueError", "", "TestTimeout",
                                                   "RecursionError"]


@isolated_only
def test_lying_and_oversized_return_values_do_not_pass(guarded: Any) -> None:
    """An object equal to everything, an int subclass, a forged result line on stdout, a
    deeply nested value and a giant value."""
    always = ("class A:\n    def __eq__(self, o):\n        return True\n"
              "def add(a, b):\n    return A()\n")
    assert guarded(always)[0].passed == 0
    sub = "class I(int):\n    pass\ndef add(a, b):\n    return I(a + b)\n"
    assert guarded(sub)[0].passed == 0
    forged = f"print({FORGED!r})\ndef add(a, b):\n    return None\n"
    assert _sp(guarded(forged)[0]) == ("ok", 0)
    nested = ("def add(a, b):\n    x = a + b\n    for _ in range(100_000):\n        x = [x]\n"
              "    return x\n")
    result, _ = guarded(nested)
    assert result.passed == 0 and {o.error for o in result.outcomes} == {"TypeError"}
    giant = "def add(a, b):\n    return [str(a + b) * 100] * 1000\n"
    result, _ = guarded(giant)
    assert result.passed == 0 and {o.error for o in result.outcomes} == {"ValueError"}


@isolated_only
@pytest.mark.parametrize("unsafe", [False, True])
def test_value_slow_to_encode_fails_its_test_alone(guarded: Any, unsafe: bool) -> None:
    """A shared 2**40-node tree (40 levels of ``[x, x]``) takes forever to encode; encoding is
    timed with the call in both modes (the weak mode once encoded after the alarm, so the CPU
    limit ended the whole run)."""
    code = ("def add(a, b):\n    if a == 1:\n        x = []\n        for _ in range(40):\n"
            "            x = [x, x]\n        return x\n    return a + b\n")
    result, _ = guarded(code, ADD_TESTS[:2], QUICK, unsafe=unsafe)
    assert (result.status, [o.error for o in result.outcomes]) == ("ok", ["TestTimeout", ""])


@isolated_only
def test_private_tmp_is_writable_and_private(guarded: Any) -> None:
    code = ("with open('scratch.txt', 'w') as f:\n    f.write('ok')\n"
            "import os\nos.remove('scratch.txt')\n" + GOOD)
    assert guarded(code)[0].status == "ok"
    leftover = "import os\ndef add(a, b):\n    return os.listdir('/tmp')\n"
    result, _ = guarded("open('/tmp/left', 'w').write('x')\n" + leftover,
                        [TestCase((0, 0), ["left"])])
    assert result.passed == 1
    result, _ = guarded(leftover, [TestCase((0, 0), [])])  # a new run sees an empty /tmp
    assert result.passed == 1


@isolated_only
def test_child_sees_only_the_interpreter_and_libraries(guarded: Any) -> None:
    code = ("import os\ndef add(a, b):\n    return [sorted(os.listdir('/')), os.getuid(), "
            "os.path.exists('SPECS'), os.path.exists('PYPROJECT'), os.path.exists('/proc')]\n")
    result, _ = guarded(code, [TestCase((0, 0), [["dev", "lib", "lib64", "root", "tmp", "usr"],
                                                  65534, False, False, False])])
    assert (result.status, result.passed) == ("ok", 1), result
    walk = ("import os\ndef add(a, b):\n    out = []\n"
            "    for root, dirs, _ in os.walk('/'):\n"
            "        if root.startswith('/usr/lib/'):\n            dirs[:] = []\n"
            "        try:\n            open(os.path.join(root, '.w'), 'wb').close()\n"
            "            out.append(root)\n        except OSError:\n            pass\n"
            "    return out\n")
    result, _ = guarded(walk, [TestCase((0, 0), ["/tmp"])])  # the only writable directory
    assert (result.status, result.passed) == ("ok", 1), result


@isolated_only
def test_garbage_code_never_raises(guarded: Any) -> None:
    for code in ("", "\x00\x01\xff", "\udcff = 1", "é" * 1000, "def add(:\n" * 500):
        result, _ = guarded(code)
        assert result.passed == 0 and result.status != "ok", (code[:20], result)
    assert run_tests("x" * 300_000, "add", ADD_TESTS, LIMITS).status == "invalid_output"


@isolated_only
def test_float_tolerance_and_containers(guarded: Any) -> None:
    tests = [TestCase((0.1, 0.2), 0.3), TestCase(([1], [2]), [1, 2]),
             TestCase((True, False), True)]
    code = ("def add(a, b):\n    if isinstance(a, list):\n        return tuple(a + b)\n"
            "    if isinstance(a, bool):\n        return 1\n    return a + b\n")
    result, _ = guarded(code, tests)
    assert [o.passed for o in result.outcomes] == [True, True, False]


def test_ints_compare_exactly_and_huge_ints_do_not_raise() -> None:
    """The 1e-9 tolerance is for floats: with it 10**9 passed for 10**9 + 1 and 2**60 for
    2**60 + 1, and an int beyond float range raised OverflowError into the trainer."""
    assert not equal(10**9, 10**9 + 1) and not equal(2**60, 2**60 + 1)
    assert not equal([2**60], (2**60 + 1,)) and not equal({"k": 10**9}, {"k": 10**9 + 1})
    assert equal(2**60 + 1, 2**60 + 1) and equal(3, 3.0) and equal(0.1 + 0.2, 0.3)
    assert not equal(10**400, 1.5) and not equal(10**400, 1) and not equal(1.5, 10**400)


@isolated_only
def test_huge_int_answer_scores_zero_without_raising(guarded: Any) -> None:
    """A body returning 10**400 (a plain int the harness sends) or an int off by one."""
    code = ("def add(a, b):\n    if a == 1:\n        return 10**400\n"
            "    return 10**9 if a == 2 else a + b\n")
    tests = [TestCase((1, 2), 3), TestCase((2, 0), 10**9 + 1), TestCase((5, 0), 5)]
    for unsafe in (False, True):
        result, _ = guarded(code, tests, unsafe=unsafe)
        assert (result.status, [o.passed for o in result.outcomes]) == (
            "ok", [False, False, True]), (unsafe, result)


@isolated_only
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
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match="plain JSON"):  # was a RecursionError
        run_tests(GOOD, "add", [TestCase((deep, 1), 1)], LIMITS)


# --- refusal without isolation, and the weak mode ---------------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """bubblewrap made unavailable: its path points at a file that does not exist."""
    monkeypatch.setattr(isolated, "BWRAP", "/nonexistent/bwrap")


@pytest.mark.usefixtures("no_bwrap")
def test_without_bwrap_the_code_task_refuses_in_one_line() -> None:
    assert "not found" in isolation_problem()
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_tests(GOOD, "add", ADD_TESTS, LIMITS)
    with pytest.raises(SandboxUnavailable, match="--unsafe_sandbox"):
        run_many([(GOOD, "add", ADD_TESTS)], LIMITS)
    errors = CodeUnitTestsTask(TaskConfig()).validate()
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert "apt-get install bubblewrap" in errors[0] and "--unsafe_sandbox" in errors[0]


@pytest.mark.usefixtures("no_bwrap")
def test_train_command_refuses_before_any_work(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from rlscope.cli import main

    runs = tmp_path / "runs"
    assert main(["train", "--task", "code_unit_tests", "--num_steps", "1",
                 "--runs_dir", str(runs)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "apt-get install bubblewrap" in err and "--unsafe_sandbox" in err
    assert not runs.exists()


@pytest.mark.parametrize("script, words", [
    ("echo bubblewrap 0.6.1", "too old"),
    ('case "$1" in --version) echo bubblewrap 0.8.0;; *) echo "bwrap: No permissions to '
     'create new namespace" >&2; exit 1;; esac', "No permissions to create new namespace"),
])
def test_bwrap_that_cannot_isolate_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              script: str, words: str) -> None:
    """A bubblewrap too old for --size / --disable-userns, or one that cannot create
    namespaces here (a container without user namespaces): refused with the reason."""
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(isolated, "BWRAP", str(fake))
    assert words in isolation_problem()
    with pytest.raises(SandboxUnavailable, match=words):
        run_tests(GOOD, "add", ADD_TESTS, LIMITS)


@pytest.mark.usefixtures("no_bwrap")
def test_unsafe_sandbox_reenables_the_weak_mode() -> None:
    task = CodeUnitTestsTask(TaskConfig(unsafe_sandbox=True))
    assert task.validate() == [] and task.code_cfg.unsafe and "WEAK" in task.describe()
    specs = load_specs()[:3]
    cfg = CodeConfig(unsafe=True, limits=LIMITS)
    results = score_programs(specs, [s.reference for s in specs], cfg)
    assert [(r.status, r.reward) for r in results] == [("ok", 1.0)] * 3
    wrong = score_programs(specs, ["    return None\n"] * 3, cfg)
    assert all(r.reward < 1.0 for r in wrong)
    # the weak mode's audit hook still refuses naive escapes
    assert run_tests("import os\nos.fork()\n" + GOOD, "add", ADD_TESTS, LIMITS,
                     unsafe=True).status == "blocked"


@isolated_only
def test_weak_mode_runs_even_where_isolation_works(guarded: Any) -> None:
    result, _ = guarded(GOOD, unsafe=True)
    assert (result.status, result.passed) == ("ok", 4)
    result, _ = guarded("open('/etc/passwd').read()\n" + GOOD, unsafe=True)
    assert (result.status, result.passed) == ("blocked", 0)


def test_probe_is_cached_per_bwrap_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = isolated._probe.__wrapped__

    def counting(path: str) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(isolated, "_probe", functools.lru_cache(8)(counting))
    monkeypatch.setattr(isolated, "BWRAP", "/nonexistent/bwrap2")
    assert isolation_problem() == isolation_problem() != ""
    assert calls == ["/nonexistent/bwrap2"]


def test_harness_source_has_no_secret() -> None:
    """What enters the child: the harness and a request of code, function name and inputs;
    no expected output, no path of rlscope's."""
    assert "expected" not in isolated.HARNESS_SOURCE.split('"""', 2)[2]
    cmd = isolated.bwrap_command("/usr/bin/bwrap", 3, 2**20)
    visible = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--ro-bind"]
    assert visible and str(Path(sys.executable).resolve()) in visible
    for path in visible:
        assert "-packages" not in path and not path.startswith(("/work", "/home", "/etc"))
        assert not str(SPECS).startswith(path + "/")
        assert not str(Path(isolated.__file__)).startswith(path + "/")
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                 "--unshare-uts", "--die-with-parent", "--new-session", "--seccomp"):
        assert flag in cmd
    assert all(type(arg) is str for arg in cmd)
