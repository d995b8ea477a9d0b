"""The isolated mode (the default): the untrusted code runs under bubblewrap in its own
namespaces with a seccomp filter; the trusted parent judges (docs/sandbox.md).

The child is ``python -I -S -B -c <harness source>`` started by ``bwrap`` with:

- new user, mount, PID, network, IPC, UTS (and, where possible, cgroup) namespaces; uid and
  gid 65534 inside; ``--cap-drop ALL``; ``--disable-userns`` (no nested user namespace);
  ``--new-session`` (no TIOCSTI into the trainer's terminal); ``--die-with-parent``;
- a filesystem of read-only binds of only what the interpreter needs: ``/usr/lib`` (and
  ``/usr/lib64``: the C library and the shared libraries of the stdlib's extension modules),
  the interpreter's executable, its ``libpython`` and its standard-library directory with
  every site-packages / dist-packages directory under it hidden by an empty read-only tmpfs;
  a minimal read-only ``/dev`` (its null, zero, random... nodes usable); a private
  size-capped tmpfs ``/tmp`` (the working directory, the only writable place; the root is
  remounted read-only). No ``/proc``, ``/etc``, ``/home``, ``/root`` (but the path to the
  interpreter), no ``/usr/bin``, no rlscope source or data, no site-packages;
- a seccomp filter (`seccomp_program`, compiled by libseccomp through ``pyseccomp``) that
  kills the process on: new processes (``fork``, ``vfork``, ``clone`` without
  ``CLONE_THREAD``), sockets of any family but ``AF_UNIX``, signals sent with ``kill``,
  ``ptrace`` and other cross-process access, mounts, namespaces (``unshare``, ``setns``),
  ``bpf``, ``perf_event_open``, keyrings, module loading, ``kexec``, ``io_uring``,
  ``userfaultfd`` and other kernel attack surface; ``clone3`` fails with ENOSYS so that the C
  library falls back to ``clone``, which the filter can inspect. A killed child is the status
  ``blocked``;
- rlimits set by the harness before the code is compiled, and the parent's wall timeout,
  which kills the whole process group.

The stdin of the child carries the code and the test inputs only; its stdout carries only the
returned values. The expected outputs never leave the parent.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlscope.sandbox.common import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    TestCase,
    failed,
    judge,
    rlimits,
    run_child,
    well_formed,
)

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
"""The bubblewrap executable (tests point it elsewhere to simulate its absence)."""
INSTALL_HINT = ("install bubblewrap (apt-get install bubblewrap) and pyseccomp "
                "(pip install pyseccomp), or pass --unsafe_sandbox to run generated code in the "
                "weak, escapable subprocess sandbox (docs/sandbox.md)")
HARNESS_SOURCE = Path(__file__).with_name("harness.py").read_text(encoding="utf-8")
SANDBOX_UID = 65534
"""uid and gid of the child inside its user namespace (``nobody``)."""
KILLED_SYSCALLS = (
    "fork", "vfork", "kill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
    "pidfd_send_signal", "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev",
    "kcmp", "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "kexec_load", "kexec_file_load", "bpf", "keyctl", "add_key", "request_key",
    "perf_event_open", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "iopl", "ioperm", "syslog", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
    "fanotify_init", "quotactl", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "lookup_dcookie", "vhangup", "uselib", "personality", "setdomainname", "sethostname")
"""System calls that kill the child (status ``blocked``): none is needed to run a function."""
CLONE_THREAD = 0x00010000
AF_UNIX = 1


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The compiled BPF filter (default allow; `KILLED_SYSCALLS`, ``clone`` without
    ``CLONE_THREAD`` and ``socket`` of a family other than AF_UNIX kill the process;
    ``clone3`` returns ENOSYS). Raises SandboxUnavailable without pyseccomp/libseccomp."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:  # OSError: the C library libseccomp is missing
        raise SandboxUnavailable(f"no seccomp binding ({e}); {INSTALL_HINT}") from e
    fd = os.memfd_create("rlscope-seccomp")
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        for name in KILLED_SYSCALLS:
            try:
                flt.add_rule(sc.KILL_PROCESS, name)
            except OSError:  # no such system call on this architecture
                continue
        flt.add_rule(sc.KILL_PROCESS, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
        flt.add_rule(sc.KILL_PROCESS, "socket", sc.Arg(0, sc.NE, AF_UNIX))
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        flt.export_bpf(os.fdopen(os.dup(fd), "wb"))
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)
    except OSError as e:
        raise SandboxUnavailable(f"could not build the seccomp filter ({e}); "
                                 f"{INSTALL_HINT}") from e
    finally:
        os.close(fd)


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@functools.lru_cache(maxsize=1)
def filesystem_args() -> tuple[str, ...]:
    """bwrap arguments of the child's read-only filesystem: the C libraries, the interpreter,
    its libpython and standard library, site-packages hidden (see the module docstring)."""
    args: list[str] = []
    bound: list[str] = []

    def bind(path: str) -> None:
        if os.path.exists(path) and not _under(path, bound):
            args.extend(["--ro-bind", path, path])
            bound.append(path)

    for lib in ("/usr/lib", "/usr/lib64", "/usr/lib32"):
        bind(lib)
    for top in ("/lib", "/lib64", "/lib32"):  # merged-/usr symlinks, or real directories
        if os.path.islink(top):
            args.extend(["--symlink", os.readlink(top), top])
        elif os.path.isdir(top):
            bind(top)
    executable = os.path.realpath(sys.executable)
    bind(executable)
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = str(sysconfig.get_config_var("LIBDIR") or "")
        soname = str(sysconfig.get_config_var("INSTSONAME") or "")
        if libdir and soname:
            link = os.path.join(libdir, soname)
            real = os.path.realpath(link)
            if os.path.exists(real) and not _under(link, bound):
                bind(real)
                if real != link:
                    args.extend(["--symlink", real, link])
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        bind(os.path.realpath(paths[key]))
    hidden = {os.path.realpath(p) for p in (paths["purelib"], paths["platlib"],
                                            *site.getsitepackages())}
    hidden |= {str(p) for lib in bound if os.path.isdir(lib)
               for pattern in ("*-packages", "python3*/*-packages")
               for p in Path(lib).glob(pattern)}
    for path in sorted(hidden):
        if os.path.isdir(path) and _under(path, bound):
            args.extend(["--tmpfs", path, "--remount-ro", path])
    return (*args, executable)


def bwrap_command(bwrap: str, seccomp_fd: int, tmp_bytes: int, source: str | None = None
                  ) -> list[str]:
    """The full command line of one isolated child reading its request on stdin; ``source``
    is the child's program (`HARNESS_SOURCE` unless given: the REPL passes its own)."""
    *fs, executable = filesystem_args()
    return [bwrap, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try", "--disable-userns",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL",
            "--new-session", "--die-with-parent", *fs,
            "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(tmp_bytes), "--tmpfs", "/tmp", "--remount-ro", "/", "--chdir", "/tmp",
            "--seccomp", str(seccomp_fd), "--hostname", "sandbox",
            executable, "-I", "-S", "-B", "-c", HARNESS_SOURCE if source is None else source]


def _spawn(bwrap: str, tmp_bytes: int, source: str | None = None) -> subprocess.Popen[bytes]:
    """Start one isolated child (its seccomp program handed over on a sealed-off memfd)
    running ``source`` (`bwrap_command`)."""
    program = seccomp_program()
    fd = os.memfd_create("rlscope-seccomp")  # close-on-exec: only this child gets it
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        return subprocess.Popen(
            bwrap_command(bwrap, fd, tmp_bytes, source), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"LC_ALL": "C.UTF-8"},
            close_fds=True, pass_fds=(fd,), start_new_session=True, cwd="/")
    finally:
        os.close(fd)


MIN_BWRAP_VERSION = (0, 8)
"""``--size`` (the /tmp cap) and ``--disable-userns`` need bubblewrap 0.8 (Debian 12,
Ubuntu 24.04)."""


def _version_problem(bwrap: str) -> str:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, timeout=10,
                             env={"LC_ALL": "C.UTF-8"}, check=False).stdout.decode()
        version = tuple(int(x) for x in out.split()[-1].split(".")[:2])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return f"could not read the version of {bwrap}"
    if version < MIN_BWRAP_VERSION:
        return (f"bubblewrap {'.'.join(map(str, version))} is too old (need "
                f"{'.'.join(map(str, MIN_BWRAP_VERSION))} or newer)")
    return ""


@functools.lru_cache(maxsize=8)
def _probe(bwrap: str) -> str:
    if not os.path.isfile(bwrap) or not os.access(bwrap, os.X_OK):
        return f"bubblewrap not found at {bwrap}"
    if problem := _version_problem(bwrap):
        return problem
    try:
        seccomp_program()
    except SandboxUnavailable as e:
        return str(e).split(";")[0]
    limits = SandboxLimits(wall_seconds=10.0)
    request = {"code": "def f(x):\n    return x + 1\n", "function": "f", "args": [[1]],
               "limits": rlimits(limits), "per_test_seconds": 5.0}
    child = run_child(lambda: _spawn(bwrap, limits.tmp_bytes), json.dumps(request).encode(),
                      limits, 1, time.monotonic())
    if isinstance(child, SandboxResult):
        return f"bubblewrap could not run a probe program: {child.reason}"
    stdout, stderr, rc = child
    lines = stdout.strip().splitlines()
    if lines and lines[-1] == b'{"load": "ok", "load_error": "", "tests": ' \
                              b'[{"value": 2, "error": ""}]}':
        return ""
    detail = stderr.decode("utf-8", "replace").strip().splitlines()
    return (f"bubblewrap cannot create the sandbox here (exit {rc}"
            f"{': ' + detail[0][:200] if detail else ''})")


def isolation_problem() -> str:
    """Why the isolated mode cannot run on this machine ("" if it can): a quick probe run,
    cached per bubblewrap path."""
    return _probe(BWRAP)


def require_isolation() -> None:
    """Raise SandboxUnavailable, with the install hint, unless the isolated mode works."""
    if problem := isolation_problem():
        raise SandboxUnavailable(f"code sandbox unavailable: {problem}; {INSTALL_HINT}")


def _parse(stdout: bytes, n_tests: int) -> dict[str, Any] | None:
    """The child's result object (its last stdout line), or None if absent or malformed."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        out = json.loads(lines[-1].decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return out if well_formed(out, n_tests) else None


def run_tests_isolated(code: str, function: str, tests: Sequence[TestCase],
                       limits: SandboxLimits, start: float) -> SandboxResult:
    """`rlscope.sandbox.run_tests` in the isolated mode (arguments and `require_isolation`
    already checked)."""
    n = len(tests)
    payload = json.dumps({"code": code, "function": function,
                          "args": [list(t.args) for t in tests], "limits": rlimits(limits),
                          "per_test_seconds": limits.per_test_seconds}).encode("utf-8")
    child = run_child(lambda: _spawn(BWRAP, limits.tmp_bytes), payload, limits, n, start)
    if isinstance(child, SandboxResult):
        return child
    stdout, stderr, rc = child  # bwrap exits 128 + n when the child dies of signal n
    if rc == 128 + signal.SIGSYS:
        return failed("blocked", "a forbidden system call (seccomp killed the program)", n,
                      start)
    out = _parse(stdout, n)
    if out is None:
        if rc in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            return failed("timeout", f"CPU time limit of {limits.cpu_seconds} s", n, start)
        if rc != 0 or not stdout:
            detail = stderr.decode("utf-8", "replace").strip().splitlines()
            bwrap_error = [d for d in detail if d.startswith("bwrap:")]
            return failed("crashed", f"exited with code {rc} without a result"
                          + (f" ({bwrap_error[0][:200]})" if bwrap_error else ""), n, start)
        return failed("invalid_output", "no well-formed result line", n, start)
    return judge(tests, out, start)
