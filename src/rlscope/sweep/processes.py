"""A sweep's processes: the lock on its output folder and the worker processes that run its runs.

- `OutputLock`: an exclusive ``flock`` on ``<output>/sweep.lock``, held for the sweep's
  lifetime (and by its workers), so a second sweep on the same folder is refused instead of
  racing the first. The kernel drops it when the last process holding it dies, however it
  dies, so a killed sweep never leaves a stale lock.
- `Workers`: at most ``jobs`` worker processes, one per run. Each is started by the sweep's
  thread in its own process group (a terminal's Ctrl-C reaches only the sweep, which stops
  them) and asks the kernel at once for SIGKILL when its parent dies (Linux
  ``PR_SET_PDEATHSIG``; `die_with_parent`), then checks that the parent is still the one that
  started it (the parent may have died before the request). A worker therefore never outlives
  a killed sweep, even one killed with SIGKILL. On SIGTERM or SIGINT the sweep stops its
  workers (SIGTERM to each group, SIGKILL after a grace period) before it exits.
- The workers themselves are `rlscope.sweep.worker` (``python -m rlscope.sweep.worker``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO

LOCK_FILE = "sweep.lock"
PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal the calling process gets when its parent thread exits."""
GRACE_S = 5.0
"""How long stopped workers get to exit after SIGTERM before SIGKILL."""
POLL_S = 0.05
"""How often a stopping sweep looks whether its workers are gone."""


class SweepLocked(RuntimeError):
    """Another sweep holds the output folder's lock."""


class SweepInterrupted(KeyboardInterrupt):
    """The sweep received SIGINT, SIGTERM or SIGHUP; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ------------------------------------------------------------------------------------ lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputLock:
    """An exclusive lock on a sweep's output folder (``<output>/sweep.lock`` holds the
    holder's pid). `acquire` raises `SweepLocked` with a one-line message naming the holder."""

    def __init__(self, output: Path) -> None:
        self.path = output / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise `SweepLocked` without waiting (ValueError when the folder
        cannot be created or written)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ValueError(f"cannot use {self.path.parent} as the sweep's output folder: "
                             f"{e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process"
            if holder.isdigit() and not _alive(int(holder)):
                who = f"a worker of sweep pid {holder}, which is gone"
            raise SweepLocked(f"another sweep ({who}) is running on {self.path.parent}: wait "
                              f"for it to finish or stop it (lock: {self.path})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays; it is locked again by the next sweep)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------------- signals


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into `SweepInterrupted` in this (main) thread, once: a
    second signal while the sweep stops its workers is ignored, so the clean-up finishes.
    Elsewhere than the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise SweepInterrupted(signum)

    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, old in before.items():
            signal.signal(s, old)


# -------------------------------------------------------------------------- worker (child)


def die_with_parent(parent_pid: int) -> None:
    """Make this process die with ``parent_pid``: on Linux the kernel sends SIGKILL when the
    parent exits (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); elsewhere a daemon thread checks
    the parent every half second. Exits at once if the parent is already gone (it may die
    before the request is made)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    else:  # pragma: no cover - not Linux
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


# ------------------------------------------------------------------------- workers (parent)


@dataclass
class _Worker:
    """A started worker process and its pipes."""

    proc: subprocess.Popen[bytes]
    tasks: BinaryIO
    """Where its tasks are written."""
    results: BinaryIO
    """Where its outcomes are read."""
    key: int | None = None
    """The task it is running (None when idle)."""
    started: float = 0.0
    """When that task was sent."""


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "closed its pipe"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class Workers:
    """At most ``jobs`` worker processes running tasks (see the module docstring); each
    process runs one task after another. ``log_of(task)`` is where a task's console output
    goes; ``stderr`` receives what a worker prints outside any task. ``keep_fds`` are passed
    on to each worker (the output lock, so that the lock is held for as long as any worker
    lives)."""

    def __init__(self, jobs: int, log_of: Callable[[Any], Path], stderr: Path,
                 keep_fds: Sequence[int] = ()) -> None:
        self.jobs = jobs
        self.log_of = log_of
        self.stderr = stderr
        self.keep_fds = tuple(keep_fds)
        self.workers: list[_Worker] = []
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # the rlscope this process runs
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self.env = env

    def _start(self) -> _Worker:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        group: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) \
            else {"preexec_fn": os.setpgrp}
        self.stderr.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.stderr.open("ab") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rlscope.sweep.worker", str(os.getpid()),
                     str(task_r), str(result_w)],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=self.env,
                    pass_fds=(task_r, result_w, *self.keep_fds), **group)
        finally:
            os.close(task_r)
            os.close(result_w)
        worker = _Worker(proc, os.fdopen(task_w, "wb"), os.fdopen(result_r, "rb"))
        self.workers.append(worker)
        return worker

    def _send(self, worker: _Worker, key: int, task: Any) -> None:
        log = self.log_of(task)
        log.parent.mkdir(parents=True, exist_ok=True)
        worker.key, worker.started = key, time.perf_counter()
        try:
            pickle.dump((str(log), task), worker.tasks)
            worker.tasks.flush()
        except BrokenPipeError:  # it died; its results pipe reports that
            pass

    def run(self, tasks: Sequence[tuple[int, Any]], failed: Callable[[str, float], Any]
            ) -> Generator[tuple[int, Any], None, None]:
        """Run every ``(key, task)``; yield ``(key, outcome)`` as each ends. A worker that
        dies in a task gives ``failed(how it ended, seconds)`` for it, and a new worker takes
        the next task. However the iteration ends (an exception, a signal, ``close()``), every
        worker is stopped."""
        pending = list(reversed(tasks))
        try:
            while pending or any(w.key is not None for w in self.workers):
                for w in self.workers:
                    if w.key is None and pending:
                        self._send(w, *pending.pop())
                while pending and len(self.workers) < self.jobs:
                    self._send(self._start(), *pending.pop())
                busy = {w.results.fileno(): w for w in self.workers if w.key is not None}
                ready, _, _ = select.select(list(busy), [], [])
                for fd in ready:
                    w = busy[fd]
                    key, seconds = w.key, time.perf_counter() - w.started
                    assert key is not None
                    w.key = None
                    try:
                        outcome = pickle.load(w.results)
                    except (EOFError, pickle.UnpicklingError, OSError):
                        self._drop(w)
                        outcome = failed(f"the worker process {_exit_text(w.proc.returncode)}",
                                         seconds)
                    yield key, outcome
            for w in self.workers:  # no more tasks: idle workers exit
                w.tasks.close()
        finally:
            self.stop()

    def _drop(self, worker: _Worker) -> None:
        """Forget a worker whose pipe closed, once it has exited (SIGKILL after a moment)."""
        try:
            worker.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self._signal(worker, signal.SIGKILL)
            worker.proc.wait()
        self._close(worker)
        self.workers.remove(worker)

    @staticmethod
    def _signal(worker: _Worker, sig: int) -> None:
        try:
            os.killpg(worker.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _close(worker: _Worker) -> None:
        for f in (worker.tasks, worker.results):
            with contextlib.suppress(OSError):
                f.close()

    def stop(self, grace_s: float = GRACE_S) -> None:
        """Stop every worker and its process group: close its task pipe (an idle worker exits),
        then SIGTERM to those still there after half a second, then SIGKILL to those still
        there after ``grace_s``."""
        for w in self.workers:
            self._close(w)
        for sig, wait in ((None, 0.5), (signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            for w in self.workers:
                if sig is not None and w.proc.poll() is None:
                    self._signal(w, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(w.proc.poll() is None
                                                      for w in self.workers):
                time.sleep(POLL_S)
        self.workers = [w for w in self.workers if w.proc.poll() is None]

