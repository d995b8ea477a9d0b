"""Run directories and resumable checkpoints.

A checkpoint holds the policy, value head and reference weights, the optimizer state, the
run's generator state, and the loop state (step, KL coefficient, entropy coefficient and its
window, fallback streak, the staleness queue and the replay buffer), so a resumed run
continues bit for bit.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from rlscope.batch import RolloutBatch

LATEST = "latest.pt"
SFT_FILE = "sft.pt"
"""The weights file `rlscope sft` writes in its output directory."""


def new_run_dir(cfg: Any, runs_dir: str) -> Path:
    """``runs/<name>``; the default name is ``<method>_<task>_s<seed>_<YYYYmmdd-HHMMSS>``."""
    name = cfg.run.name or (f"{cfg.method}_{cfg.task}_s{cfg.run.seed}_"
                            f"{time.strftime('%Y%m%d-%H%M%S')}")
    path = Path(runs_dir) / name
    suffix = 1
    while path.exists() and any(path.iterdir()):
        path = Path(runs_dir) / f"{name}-{suffix}"
        suffix += 1
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    return path


def _state(module: torch.nn.Module | None) -> dict[str, Any] | None:
    return None if module is None else module.state_dict()


def save(run_dir: Path, policy: torch.nn.Module, value_head: torch.nn.Module | None,
         ref: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
         generator: torch.Generator, state: Any) -> Path:
    """Write ``checkpoints/step_<N>.pt`` atomically and point ``latest.pt`` at it."""
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "policy": policy.state_dict(), "value_head": _state(value_head), "ref": _state(ref),
        "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
        "step": state.step, "beta": state.beta, "fallback_streak": state.fallback_streak,
        "entropy_coef": state.entropy_coef, "entropy_history": list(state.entropy_history),
        "queue": [{f.name: getattr(b, f.name) for f in dataclasses.fields(b)}
                  for b in state.queue],
        "replay": None if state.replay is None else state.replay.state_dict(),
    }
    path = folder / f"step_{state.step}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    latest = folder / LATEST
    tmp_latest = folder / "latest.tmp"
    tmp_latest.write_text(path.name)
    tmp_latest.replace(latest)
    return path


def load(run_dir: Path, policy: torch.nn.Module, value_head: torch.nn.Module | None,
         ref: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
         generator: torch.Generator, state: Any, device: torch.device) -> Any:
    """Restore everything `save` wrote; returns the restored loop state."""
    latest = run_dir / "checkpoints" / LATEST
    if not latest.exists():
        raise FileNotFoundError(f"no checkpoint to resume in {run_dir} (missing {latest})")
    payload = torch.load(run_dir / "checkpoints" / latest.read_text().strip(),
                         map_location=device, weights_only=False)
    policy.load_state_dict(payload["policy"])
    for module, key in ((value_head, "value_head"), (ref, "ref")):
        if module is not None:
            module.load_state_dict(payload[key])
    optimizer.load_state_dict(payload["optimizer"])
    generator.set_state(payload["generator"])
    if state.replay is not None:
        state.replay.load_state_dict(payload["replay"])
    return dataclasses.replace(
        state, step=payload["step"], beta=payload["beta"],
        fallback_streak=payload["fallback_streak"],
        # checkpoints written before adaptive entropy control lack these: keep the initial c
        entropy_coef=payload.get("entropy_coef", state.entropy_coef),
        entropy_history=list(payload.get("entropy_history", [])),
        queue=deque(RolloutBatch(**b) for b in payload["queue"]))


def init_weights_path(path: str) -> Path:
    """The weights file `--init` names: ``path`` itself, or inside a directory ``sft.pt``
    (an `rlscope sft` output) or the latest checkpoint of a training run."""
    p = Path(path)
    if p.is_dir():
        if (p / SFT_FILE).exists():
            return p / SFT_FILE
        latest = p / "checkpoints" / LATEST
        if latest.exists():
            return p / "checkpoints" / latest.read_text().strip()
        raise FileNotFoundError(f"--init {path}: the directory holds neither {SFT_FILE} nor "
                                f"checkpoints/{LATEST}")
    if not p.exists():
        raise FileNotFoundError(f"--init {path}: no such file or directory")
    return p


def load_init(path: str, policy: torch.nn.Module, device: torch.device) -> dict[str, Any]:
    """Load the policy weights of ``path`` (see `init_weights_path`) into ``policy``; returns
    the whole payload. Raises ValueError, naming the parameters, when shapes differ."""
    payload = torch.load(init_weights_path(path), map_location=device, weights_only=False)
    if not isinstance(payload, dict) or "policy" not in payload:
        raise ValueError(f"--init {path}: not an rlscope checkpoint (no 'policy' weights)")
    own = policy.state_dict()
    theirs = payload["policy"]
    missing = sorted(set(own) - set(theirs))
    extra = sorted(set(theirs) - set(own))
    mismatched = [f"{k}: checkpoint {tuple(theirs[k].shape)} vs model {tuple(v.shape)}"
                  for k, v in own.items() if k in theirs and theirs[k].shape != v.shape]
    if missing or extra or mismatched:
        hint = ""
        if "model" in payload:
            hint = (f" The checkpoint was trained with model {payload['model']} on task "
                    f"{payload.get('task')!r} {payload.get('task_options')}: use the same model "
                    "and task options.")
        raise ValueError(f"--init {path} does not fit this policy: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}, shape mismatches {mismatched[:5]}.{hint}")
    policy.load_state_dict(theirs)
    return payload
