"""Small helpers: device resolution and the environment recorded in ``config.json``."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda when available, else cpu; otherwise the named device (checked)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"run.device={name!r} but CUDA is not available; use cpu or auto")
    return device


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment_info(device: torch.device) -> dict[str, Any]:
    from rlscope import __version__

    info: dict[str, Any] = {
        "rlscope_version": __version__, "torch_version": torch.__version__,
        "python_version": platform.python_version(), "git_commit": git_commit(),
        "device": str(device), "torch_threads": torch.get_num_threads(),
        "platform": platform.platform()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info
