"""A sweep's processes: workers never outlive their sweep (SIGKILL of the parent, at start-up or
mid-run), SIGTERM stops the workers and records the runs as interrupted, the rerun of a killed
sweep gives the results of an uninterrupted one, and a lock refuses a second sweep on the same
output folder. Linux only (/proc, PR_SET_PDEATHSIG)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import rlscope
from rlscope.cli import main
from rlscope.sweep.manifest import parse_manifest
from rlscope.sweep.processes import OutputLock, SweepLocked
from rlscope.sweep.runner import SweepOptions, run_sweep

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="needs /proc and PR_SET_PDEATHSIG")

FOUR = """
[sweep]
name = "four"
seeds = [0, 1]

[defaults]
task = "token_reversal"
num_steps = 24
batch_size = 16
seq_len = 4
eval_batches = 1
eval_batch_size = 16
eval_every = 8
checkpoint_every = 4
device = "cpu"

[runs.grpo]
method = "grpo"

[runs.dg]
method = "dg"
"""
SRC = str(Path(rlscope.__file__).resolve().parents[1])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _state(pid: int) -> str | None:
    """A process's state letter (R, S, Z, ...), None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    """Running or sleeping: not gone and not a zombie (the container's init may not reap
    orphans)."""
    return _state(pid) not in (None, "Z", "X")


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def _workers(pid: int) -> set[int]:
    """The sweep worker processes among ``pid``'s children (not, say, a passing git)."""
    found = set()
    for child in _children(pid):
        try:
            if b"rlscope.sweep.worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(child)
        except OSError:
            continue
    return found


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _start_sweep(tmp_path: Path, out: Path) -> subprocess.Popen[bytes]:
    manifest = tmp_path / "four.toml"
    manifest.write_text(FOUR)
    return subprocess.Popen(
        [sys.executable, "-m", "rlscope.cli", "sweep", str(manifest), "--output", str(out),
         "--jobs", "2", "--threads", "1", "--no_report"],
        stdout=(tmp_path / "sweep.out").open("wb"), stderr=subprocess.STDOUT, env=_env())


def _metric_lines(out: Path) -> int:
    return sum(len(p.read_bytes().splitlines())
               for p in out.glob("runs/*/metrics.jsonl"))


def _results(out: Path) -> list[tuple[str, ...]]:
    """results.csv without timings, in a canonical order."""
    with (out / "results.csv").open() as f:
        return sorted(tuple(row.values()) for row in csv.DictReader(f)
                      if not row["metric"].startswith(("time/", "throughput/")))


def test_die_with_parent_kills_the_worker_of_a_killed_parent(tmp_path: Path) -> None:
    """The mechanism alone, without torch: a parent starts a child that asks to die with it;
    SIGKILL of the parent kills the child. A child whose parent is already gone exits at once."""
    child = ("import sys, time\nfrom rlscope.sweep.processes import die_with_parent\n"
             "die_with_parent(int(sys.argv[1]))\nprint('ready', flush=True)\ntime.sleep(60)\n")
    parent = ("import os, subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())])\n"
              "print(p.pid, flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE,
                            env=_env())
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    _wait(lambda: _state(pid) in ("S", "R"), 30, "the child")
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    _wait(lambda: not _alive(pid), 5, f"child {pid} to die with its parent")

    orphan = subprocess.run([sys.executable, "-c", child, str(os.getpid() + 10**6)],
                            capture_output=True, env=_env(), timeout=60)
    assert (orphan.returncode, orphan.stdout) == (1, b"")


def test_kill_9_at_startup_leaves_no_worker(tmp_path: Path) -> None:
    """SIGKILL of a --jobs 2 sweep as soon as its two workers exist (still starting up, before
    or after they ask to die with it): neither survives, and the lock is free again."""
    out = tmp_path / "out"
    proc = _start_sweep(tmp_path, out)
    _wait(lambda: len(_workers(proc.pid)) >= 2 or proc.poll() is not None, 120,
          "two workers")
    workers = _workers(proc.pid)
    assert len(workers) == 2, (tmp_path / "sweep.out").read_text()
    proc.kill()
    proc.wait()
    _wait(lambda: not any(_alive(w) for w in workers), 5, f"workers {workers} to die")
    with OutputLock(out) as lock:
        assert lock.fd is not None


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_equals_an_uninterrupted_sweep(tmp_path: Path) -> None:
    """SIGKILL of a --jobs 2 sweep while its runs train and checkpoint: no worker survives,
    and running it again (resuming or restarting the killed runs) gives the results.csv of a
    sweep that was never interrupted, timings aside."""
    reference = tmp_path / "reference"
    run_sweep(parse_manifest(FOUR, output=reference), SweepOptions(threads=1))
    out = tmp_path / "out"
    proc = _start_sweep(tmp_path, out)
    _wait(lambda: _metric_lines(out) >= 10 or proc.poll() is not None, 120, "training")
    workers = _workers(proc.pid)
    assert workers and proc.poll() is None, (tmp_path / "sweep.out").read_text()
    proc.kill()
    proc.wait()
    _wait(lambda: not any(_alive(w) for w in workers), 5, f"workers {workers} to die")
    done = sum((out / "runs" / r / "status.json").exists()
               for r in ("grpo_s0", "grpo_s1", "dg_s0", "dg_s1"))
    assert done < 4  # the kill did interrupt the sweep
    again = run_sweep(parse_manifest(FOUR, output=out), SweepOptions(jobs=2, threads=1))
    assert [r.status for r in again.records] == ["completed"] * 4, [
        (r.run, r.plan, r.reason, r.error) for r in again.records]
    assert _results(out) == _results(reference)


def test_sigterm_stops_the_workers_and_records_the_interrupted_runs(tmp_path: Path) -> None:
    """SIGTERM as soon as the workers exist (mid-run is the same path, and slower to reach):
    the sweep stops them, records the runs it had given them as interrupted, says how to
    resume, exits with 128 + SIGTERM and frees the lock."""
    out = tmp_path / "out"
    proc = _start_sweep(tmp_path, out)
    _wait(lambda: len(_workers(proc.pid)) >= 2 or proc.poll() is not None, 120,
          "two workers")
    workers = _workers(proc.pid)
    assert len(workers) == 2 and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not any(_alive(w) for w in workers)
    printed = (tmp_path / "sweep.out").read_text()
    assert "sweep four: stopped by SIGTERM" in printed and "run the same command again" in printed
    statuses = [r["status"] for r in json.loads((out / "sweep.json").read_text())["runs"]]
    assert "interrupted" in statuses and "pending" not in statuses
    with OutputLock(out) as lock:
        assert lock.fd is not None


def test_a_second_sweep_on_the_same_output_is_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """While one sweep holds an output folder, another is refused with one line naming the
    holder's pid, and writes nothing; a sweep on another folder is not affected."""
    manifest = tmp_path / "m.toml"
    manifest.write_text(FOUR)
    out = tmp_path / "out"
    with OutputLock(out):
        assert main(["sweep", str(manifest), "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: another sweep (pid {os.getpid()}) is running on {out}: wait "
                       f"for it to finish or stop it (lock: {out / 'sweep.lock'})\n")
        assert sorted(p.name for p in out.iterdir()) == ["sweep.lock"]
        with pytest.raises(SweepLocked):
            OutputLock(out).acquire()
        with OutputLock(tmp_path / "other"):
            pass
    with OutputLock(out) as lock:  # released: free again
        assert (out / "sweep.lock").read_text() == f"{os.getpid()}\n" and lock.fd is not None


@pytest.mark.slow
def test_a_worker_that_dies_fails_only_its_run(tmp_path: Path) -> None:
    """A worker killed mid-run (as the out-of-memory killer would) fails the run it had, with
    how it ended; a new worker takes the remaining runs; the next invocation runs the failed
    one again."""
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_one() -> None:
        _wait(lambda: _metric_lines(out) >= 1 and _workers(os.getpid()), 120, "training")
        killed.append(min(_workers(os.getpid())))
        os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_one)
    killer.start()
    first = run_sweep(parse_manifest(FOUR, output=out), SweepOptions(jobs=2, threads=1))
    killer.join()
    assert killed
    failed = [r for r in first.records if r.status == "failed"]
    assert len(failed) == 1 and failed[0].error == "the worker process was killed by SIGKILL"
    assert sorted(r.status for r in first.records) == ["completed"] * 3 + ["failed"]
    again = run_sweep(parse_manifest(FOUR, output=out), SweepOptions(threads=1))
    assert [r.status for r in again.records] == ["completed"] * 4
    # killed before its run wrote anything (still starting up), after, or after a checkpoint
    assert next(r.plan for r in again.records if r.run == failed[0].run) in (
        "run", "restart", "resume")
