"""Everything rlscope loads (``--init``, ``--resume``, ``--rm_path``, sft and rm outputs) is
read with ``weights_only=True``: a crafted pickle is refused in one line and runs nothing; a
truncated or corrupt file is reported; the real payloads round-trip."""

from __future__ import annotations

import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope import checkpoint
from rlscope.checkpoint import CheckpointError, UnsafeCheckpointError, load_init, safe_load
from rlscope.cli import main
from rlscope.config import RunConfig, TrainConfig
from rlscope.policy import ModelConfig
from rlscope.policy.reward_model import (
    build_reward_model,
    load_reward_model,
    reward_model_errors,
    save_reward_model,
)
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.replay import ReplayConfig
from rlscope.supervised.sft import SftConfig, save_sft
from rlscope.tasks import TaskConfig
from rlscope.train import train


class _Payload:
    """Unpickling this runs ``touch <marker>`` (the attack of issue 13)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(params=["torch_zip", "raw_pickle"])
def crafted(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """A crafted ``.pt`` (torch's zip format or a bare pickle) and the marker it would create."""
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    payload = {"policy": _Payload(marker), "kind": "reward_model"}
    if request.param == "torch_zip":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    return path, marker


def _tiny_run(tmp_path: Path, replay: ReplayConfig | None = None, **run: Any) -> Path:
    cfg = TrainConfig(method="reinforce", task_options=TaskConfig(seq_len=3, eval_batches=1,
                                                                   eval_batch_size=4),
                      model=ModelConfig(d_model=16, n_layers=1),
                      replay=replay or ReplayConfig(),
                      run=RunConfig(**{"num_steps": 2, "batch_size": 4, "eval_every": 0,
                                       "device": "cpu", "progress": False, "doctor_every": 0,
                                       "runs_dir": str(tmp_path), "threads": 1, **run}))
    return train(cfg).run_dir


def test_a_crafted_pickle_is_refused_for_init_and_runs_nothing(crafted: tuple[Path, Path]
                                                               ) -> None:
    path, marker = crafted
    policy = TinyTransformer(TinyConfig(vocab_size=5, max_len=8))
    with pytest.raises(UnsafeCheckpointError) as error:
        load_init(str(path), policy, torch.device("cpu"))
    message = str(error.value)
    assert "\n" not in message and str(path) in message
    # it crosses from a --jobs worker process intact
    assert str(pickle.loads(pickle.dumps(error.value))) == message
    assert "not an rlscope checkpoint" in message and "unsafe" in message
    assert not marker.exists()


def test_a_crafted_pickle_is_refused_for_rm_path(crafted: tuple[Path, Path]) -> None:
    path, marker = crafted
    errors = reward_model_errors(str(path), "preference_rm", 4, 4)
    assert len(errors) == 1 and "not an rlscope checkpoint" in errors[0] and str(path) in errors[0]
    with pytest.raises(UnsafeCheckpointError):
        load_reward_model(str(path), "preference_rm", 4, 4, torch.device("cpu"))
    assert not marker.exists()


def test_a_crafted_newest_checkpoint_stops_resume_and_runs_nothing(
        tmp_path: Path, crafted: tuple[Path, Path]) -> None:
    path, marker = crafted
    run_dir = _tiny_run(tmp_path, name="run", checkpoint_every=1)
    (run_dir / "checkpoints" / "step_9.pt").write_bytes(path.read_bytes())
    with pytest.raises(UnsafeCheckpointError, match=r"step_9\.pt: refused"):
        _tiny_run(tmp_path, resume=str(run_dir), checkpoint_every=1, num_steps=12)
    assert not marker.exists()


@pytest.mark.parametrize("crafted", ["torch_zip"], indirect=True)
def test_the_cli_refuses_a_crafted_init_in_one_line(
        tmp_path: Path, crafted: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    path, marker = crafted
    assert main(["train", "--init", str(path), "--num_steps", "1", "--device", "cpu",
                 "--no-progress", "--runs_dir", str(tmp_path / "runs")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "not an rlscope checkpoint" in lines[0], lines
    assert str(path) in lines[0]
    assert not marker.exists()


def _tensor_byte(path: Path) -> int:
    """The offset of the first byte of the largest tensor stored in a torch zip file."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size)
    with path.open("rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)  # the local file header; its name and extra field follow
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


def test_corrupt_and_truncated_files_are_reported(tmp_path: Path) -> None:
    run_dir = _tiny_run(tmp_path, name="run")
    good = run_dir / "checkpoints" / "step_2.pt"
    data = bytearray(good.read_bytes())
    truncated, flipped, empty = tmp_path / "t.pt", tmp_path / "f.pt", tmp_path / "e.pt"
    truncated.write_bytes(bytes(data[: len(data) // 2]))
    data[_tensor_byte(good)] ^= 0xFF  # a weight's byte: it still unpickles, only the CRC shows
    flipped.write_bytes(bytes(data))
    empty.write_bytes(b"")
    assert torch.load(flipped, weights_only=True)["step"] == 2  # torch alone does not notice
    for path, reason in ((truncated, "truncated or corrupt"), (flipped, "CRC mismatch"),
                         (empty, "truncated or corrupt"), (tmp_path / "none.pt", "no such")):
        with pytest.raises(CheckpointError, match=reason) as error:
            safe_load(path, "--init")
        assert not isinstance(error.value, UnsafeCheckpointError)
        assert str(path) in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(CheckpointError, match="not an rlscope checkpoint"):
        torch.save([torch.zeros(1)], tmp_path / "list.pt")
        safe_load(tmp_path / "list.pt", "--init")


def test_a_checkpoint_round_trips_under_weights_only(tmp_path: Path) -> None:
    """Replay buffer, staleness queue, generator and optimizer state all load with
    ``weights_only=True`` (what `checkpoint.load` uses)."""
    run_dir = _tiny_run(tmp_path, name="run", delay=1, num_steps=3)
    payload = torch.load(run_dir / "checkpoints" / "step_3.pt", weights_only=True)
    assert payload["format"] == checkpoint.FORMAT and len(payload["queue"]) == 1
    assert isinstance(payload["generator"], torch.Tensor) and payload["optimizer"]["state"]
    run_dir = _tiny_run(tmp_path, ReplayConfig(replay_capacity=3), name="replay", num_steps=3)
    payload = torch.load(run_dir / "checkpoints" / "step_3.pt", weights_only=True)
    assert len(payload["replay"]["batches"]) == 3


def test_a_format_1_checkpoint_still_resumes(tmp_path: Path) -> None:
    """Checkpoints of the previous format (no ``format`` key) hold only tensors and plain
    containers too, so they resume as they are."""
    run_dir = _tiny_run(tmp_path, name="run", num_steps=2)
    path = run_dir / "checkpoints" / "step_2.pt"
    old = torch.load(path, weights_only=True)
    del old["format"]
    torch.save(old, path)
    resumed = _tiny_run(tmp_path, resume=str(run_dir), num_steps=3)
    assert resumed == run_dir
    assert (run_dir / "checkpoints" / "step_3.pt").exists()


def test_sft_and_reward_model_outputs_load_weights_only(tmp_path: Path) -> None:
    model = ModelConfig(d_model=16, n_layers=1)
    policy = TinyTransformer(TinyConfig(vocab_size=5, max_len=12, d_model=16, n_layers=1))
    save_sft(tmp_path, policy, SftConfig(task="token_reversal", model=model))
    target = TinyTransformer(TinyConfig(vocab_size=5, max_len=12, d_model=16, n_layers=1))
    payload = load_init(str(tmp_path), target, torch.device("cpu"))
    assert payload["model"]["d_model"] == 16
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(),
                                                   target.state_dict().values(), strict=True))
    rm = build_reward_model(model, vocab_size=5, max_len=8)
    save_reward_model(tmp_path, rm, model, "preference_rm", TaskConfig(), 5, 4, 4, {})
    loaded = load_reward_model(str(tmp_path), "preference_rm", 4, 4, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(rm.state_dict().values(),
                                                   loaded.state_dict().values(), strict=True))


@pytest.mark.parametrize("crafted", ["torch_zip"], indirect=True)
def test_rlscope_rm_refuses_a_crafted_init(tmp_path: Path, crafted: tuple[Path, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, marker = crafted
    assert main(["rm", "--init", str(path), "--num_steps", "1", "--device", "cpu",
                 "--no-progress", "--runs_dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "not an rlscope checkpoint" in err and str(path) in err and "Traceback" not in err
    assert not marker.exists()
