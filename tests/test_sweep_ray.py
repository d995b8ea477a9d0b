"""`rlscope sweep --backend ray` on a local Ray cluster: the same results.csv as the process
backend, a killed run resumes, a failing run is reported and the others finish; and the
backend's configuration errors, refused before anything runs."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from rlscope.cli import main
from rlscope.sweep.manifest import parse_manifest
from rlscope.sweep.ray_backend import device_problem, infeasible, resources
from rlscope.sweep.runner import SweepOptions, backend_problem, run_sweep

FOUR = """
[sweep]
name = "four"
seeds = [0, 1]

[defaults]
task = "token_reversal"
num_steps = 4
batch_size = 16
seq_len = 4
eval_batches = 1
eval_batch_size = 16
eval_every = 2
checkpoint_every = 2
device = "cpu"
threads = 1

[runs.grpo]
method = "grpo"

[runs.dg]
method = "dg"
"""


@pytest.fixture(autouse=True)
def _fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


def _results(out: Path) -> list[tuple[str, ...]]:
    """results.csv without timings, in a canonical order."""
    with (out / "results.csv").open() as f:
        return sorted(tuple(row.values()) for row in csv.DictReader(f)
                      if not row["metric"].startswith(("time/", "throughput/")))


def test_backend_errors_are_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An --address without --backend ray, a run on one named GPU, and Ray missing: one-line
    errors, exit status 2, no sweep folder written."""
    manifest = parse_manifest(FOUR, output=tmp_path / "out")
    assert backend_problem(manifest, SweepOptions(address="auto")) == \
        "--address joins a Ray cluster: add --backend ray"
    with pytest.raises(ValueError, match="unknown: use process or ray"):
        run_sweep(manifest, SweepOptions(backend="slurm"))
    spec = manifest.runs[0]
    on_gpu1 = dataclasses.replace(spec, config=dataclasses.replace(
        spec.config, run=dataclasses.replace(spec.config.run, device="cuda:1")))
    assert device_problem(on_gpu1) == (
        "run grpo_s0: device 'cuda:1' names a GPU, but Ray assigns each run its GPU: use "
        'device = "cuda" with --backend ray')
    assert device_problem(spec) == ""
    assert resources(spec, 0.0) == {"num_cpus": 1.0, "num_gpus": 0.0}
    auto = dataclasses.replace(spec, config=dataclasses.replace(
        spec.config, run=dataclasses.replace(spec.config.run, device="auto", threads=4)))
    assert resources(auto, 2.0) == {"num_cpus": 4.0, "num_gpus": 1.0}
    assert resources(auto, 0.0) == {"num_cpus": 4.0, "num_gpus": 0.0}
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    path = tmp_path / "m.toml"
    path.write_text(FOUR)
    assert main(["sweep", str(path), "--backend", "ray", "--output",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--backend ray needs Ray, which is not installed: pip install -e '.[ray]'" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ray_sweep_equals_the_process_backend_and_resumes_a_killed_run(tmp_path: Path) -> None:
    """Four runs on Ray give the process backend's results.csv (timings aside); then one run
    made to look killed after its step-2 checkpoint resumes on Ray, the others are skipped, and
    the results are the same again."""
    pytest.importorskip("ray")
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    first = run_sweep(parse_manifest(FOUR, output=local))
    assert [r.status for r in first.records] == ["completed"] * 4
    lines: list[str] = []
    second = run_sweep(parse_manifest(FOUR, output=on_ray), SweepOptions(backend="ray"),
                       report=lines.append)
    assert [(r.plan, r.status) for r in second.records] == [("run", "completed")] * 4
    assert sorted(line.split()[1] for line in lines) == ["dg_s0", "dg_s1", "grpo_s0", "grpo_s1"]
    assert _results(on_ray) == _results(local)
    index = json.loads((on_ray / "sweep.json").read_text())
    assert index["backend"] == "ray"
    assert (on_ray / "logs" / "dg_s1.log").read_text().startswith("$ rlscope train ")

    run = on_ray / "runs" / "dg_s0"
    (run / "status.json").unlink()
    (run / "checkpoints" / "step_4.pt").unlink()
    (run / "checkpoints" / "latest.pt").write_text("step_2.pt")
    with (run / "metrics.jsonl").open("a") as f:  # cut off by the kill
        f.write('{"step": 3, "lo')
    third = run_sweep(parse_manifest(FOUR, output=on_ray), SweepOptions(backend="ray"))
    assert [(r.run, r.plan, r.status) for r in third.records] == [
        ("grpo_s0", "skip", "completed"), ("grpo_s1", "skip", "completed"),
        ("dg_s0", "resume", "completed"), ("dg_s1", "skip", "completed")]
    assert third.records[2].reason == "interrupted, checkpoint at step 2"
    assert _results(on_ray) == _results(local)


@pytest.mark.slow
def test_infeasible_names_what_no_node_can_hold() -> None:
    """A task fits if one alive node has both its CPUs and its GPU; else the reason says what to
    change (Ray would leave it pending for ever)."""
    nodes = [{"CPU": 4.0}, {"CPU": 8.0, "GPU": 1.0}]
    assert infeasible({"num_cpus": 8.0, "num_gpus": 1.0}, nodes) == ""
    assert infeasible({"num_cpus": 4.0, "num_gpus": 0.0}, nodes) == ""
    too_many = infeasible({"num_cpus": 16.0, "num_gpus": 0.0}, nodes)
    assert "asks for 16 CPUs" in too_many and "at most 8" in too_many
    gpu_node_cpus = infeasible({"num_cpus": 6.0, "num_gpus": 1.0}, [{"CPU": 4.0, "GPU": 1.0},
                                                                  {"CPU": 8.0}])
    assert "largest node that fits it has 4" in gpu_node_cpus
    no_gpu = infeasible({"num_cpus": 1.0, "num_gpus": 1.0}, [{"CPU": 8.0}])
    assert "no node of the Ray cluster has one" in no_gpu and 'device = "cpu"' in no_gpu
    assert infeasible({"num_cpus": 1.0, "num_gpus": 0.0}, []) != ""


def test_a_failing_run_on_ray_is_reported_and_the_others_finish(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One run starts from a corrupt weights file and fails when training loads it, and one
    asks for more CPUs than the cluster has (it would pend for ever): both are reported
    failed; the others complete, and the failures are in the summary and sweep.json."""
    pytest.importorskip("ray")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_text("not a checkpoint")
    text = FOUR.replace("seeds = [0, 1]", "seeds = [0]") + \
        f'[runs.broken]\nmethod = "grpo"\ninit = "{corrupt}"\n' + \
        '[runs.huge]\nmethod = "grpo"\nthreads = 4096\n'
    manifest = tmp_path / "m.toml"
    manifest.write_text(text)
    out = tmp_path / "out"
    assert main(["sweep", str(manifest), "--output", str(out), "--backend", "ray",
                 "--no_report"]) == 1
    printed = capsys.readouterr().out
    assert "on Ray (local cluster)" in printed
    assert "broken_s0 FAILED: " in printed
    assert "huge_s0 FAILED: " in printed and "asks for 4096 CPUs" in printed
    assert "sweep four: 2 completed, 0 out of regime, 0 skipped, 2 failed" in printed
    index = {r["run"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    assert index["grpo_s0"]["status"] == index["dg_s0"]["status"] == "completed"
    assert index["broken_s0"]["status"] == index["huge_s0"]["status"] == "failed"
    assert "Traceback" in index["broken_s0"]["traceback"]
    assert "Traceback" in (out / "logs" / "broken_s0.log").read_text()


@pytest.mark.slow
def test_sigterm_cancels_the_ray_tasks_and_records_the_runs_interrupted(tmp_path: Path) -> None:
    """SIGTERM mid-sweep: exit status 128 + 15, the unfinished runs are recorded interrupted,
    no Ray worker is left running, and the next invocation finishes them (resumed or run)."""
    pytest.importorskip("ray")
    import os
    import signal
    import subprocess
    import time

    import rlscope

    src = str(Path(rlscope.__file__).resolve().parents[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    manifest = tmp_path / "m.toml"
    manifest.write_text(FOUR.replace("num_steps = 4", "num_steps = 400"))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "rlscope.cli", "sweep", str(manifest),
                             "--output", str(out), "--backend", "ray", "--no_report"],
                            stdout=(tmp_path / "sweep.out").open("wb"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            p.stat().st_size for p in out.glob("runs/*/metrics.jsonl")):
        time.sleep(0.2)
    assert proc.poll() is None, (tmp_path / "sweep.out").read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "sweep.out").read_text()
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert {r["status"] for r in runs} == {"interrupted"}
    # the local cluster went down with the sweep: none of its processes is left
    time.sleep(2)
    left = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(proc.pid)],
                          capture_output=True, text=True).stdout.strip()
    assert left == "", left
    after = run_sweep(parse_manifest(FOUR, output=out), SweepOptions(backend="ray"))
    assert {r.status for r in after.records} == {"completed"}


@pytest.mark.slow
def test_address_joins_a_running_cluster_and_leaves_it_running(tmp_path: Path) -> None:
    """A cluster started by another process (without token authentication, which a join by
    address does not turn on): the sweep runs its run there and leaves the cluster up for its
    owner. The sweep runs in a process of its own too: Ray keeps its authentication mode per
    process, and a later local cluster in this one (the env-worker tests) must not inherit
    the joined cluster's."""
    pytest.importorskip("ray")
    import os
    import subprocess

    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen(
        [sys.executable, "-c", "import ray, sys\n"
         "ray.init(num_cpus=2, include_dashboard=False, logging_level='ERROR')\n"
         "print(ray.get_runtime_context().gcs_address, flush=True)\n"
         "sys.stdin.read()\nprint(len(ray.nodes()), flush=True)\nray.shutdown()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert owner.stdin is not None and owner.stdout is not None
    try:
        address = owner.stdout.readline().strip()
        manifest = tmp_path / "one.toml"
        manifest.write_text(FOUR.replace("seeds = [0, 1]", "seeds = [0]").split("[runs.dg]")[0])
        out = tmp_path / "out"
        sweep = subprocess.run(
            [sys.executable, "-m", "rlscope.cli", "sweep", str(manifest), "--output", str(out),
             "--backend", "ray", "--address", address, "--no_report"],
            env=env, capture_output=True, text=True, timeout=300)
        assert sweep.returncode == 0, sweep.stdout + sweep.stderr
        runs = json.loads((out / "sweep.json").read_text())["runs"]
        assert [(r["run"], r["status"]) for r in runs] == [("grpo_s0", "completed")]
        owner.stdin.close()  # the owner's cluster is still up: it counts its node
        assert owner.stdout.readline().strip() == "1"
        assert owner.wait(timeout=60) == 0
    finally:
        if owner.poll() is None:
            owner.kill()
