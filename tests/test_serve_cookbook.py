"""An unmodified tinker-cookbook recipe (math_rl, arithmetic) against `rlscope serve`, then its
resume from the same log_path, then `rlscope doctor` on the run directory the server wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tinker")
pytest.importorskip("fastapi")
pytest.importorskip("tinker_cookbook")
pytest.importorskip("math_verify")  # math_rl imports its grader even for arithmetic

from serve_util import Server, running_server

from rlscope.cli import main as rlscope_main
from rlscope.serve.checkpoints import run_key


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("cookbook")) as srv:
        yield srv


def _math_rl(server: Server, log_path: Path, max_steps: int, behaviour: str) -> str:
    env = {**os.environ, "TINKER_API_KEY": "tml-local", "TINKER_TELEMETRY": "0",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
           f"base_url={server.base_url}", f"model_name={server.tokenizer_dir}",
           "renderer_name=role_colon", "env=arithmetic", "group_size=4", "groups_per_batch=8",
           "max_tokens=8", "lora_rank=8", f"max_steps={max_steps}", "save_every=2",
           "eval_every=0", f"log_path={log_path}", f"behavior_if_log_dir_exists={behaviour}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_math_rl_runs_resumes_and_the_doctor_reads_the_run(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_path = tmp_path / "math_rl"
    _math_rl(server, log_path, max_steps=3, behaviour="delete")
    ckpts = _jsonl(log_path / "checkpoints.jsonl")
    assert [c["name"] for c in ckpts] == ["000002", "final"]
    metrics = _jsonl(log_path / "metrics.jsonl")
    assert len(metrics) == 3
    assert "env/all/reward/total" in metrics[0]
    assert "optim/entropy" in metrics[0]
    # on-policy first step: sampler and learner log-probs agree
    assert abs(float(metrics[0]["optim/kl_sample_train_v1"])) < 1e-4  # type: ignore[arg-type]
    first_run = str(ckpts[-1]["state_path"]).split("/")[2]

    log = _math_rl(server, log_path, max_steps=5, behaviour="resume")
    assert "Resumed training from" in log
    ckpts = _jsonl(log_path / "checkpoints.jsonl")
    assert [c["name"] for c in ckpts] == ["000002", "final", "000004", "final"]
    assert str(ckpts[-1]["state_path"]).split("/")[2] != first_run
    assert [m["step"] for m in _jsonl(log_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]

    run_dir = server.root / run_key(first_run)
    rows = _jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("loss/total", "optim/grad_norm", "sampler/logp_diff_mean",
                "throughput/learn_tokens_per_s", "throughput/sample_tokens_per_s"):
        assert key in rows[0], key
    assert float(rows[0]["sampler/logp_diff_max"]) < 1e-4  # type: ignore[arg-type]
    capsys.readouterr()
    assert rlscope_main(["doctor", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "sampler/logp_diff_mean" in out
    # the unmodified cookbook's own log_path (its metrics.jsonl, config.json, checkpoints)
    # is read as tinker's log, not as an rlscope run directory
    capsys.readouterr()
    assert rlscope_main(["doctor", str(log_path), "--output", "json"]) == 0
    [table] = json.loads(capsys.readouterr().out)
    assert table["format"] == "tinker" and table["steps"] == [0.0, 4.0]
    assert all(f["evidence"].get("framework", "tinker") == "tinker" for f in table["findings"])
