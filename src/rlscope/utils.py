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


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit of the git checkout holding ``cwd`` (default: this package), with
    ``+dirty`` appended when tracked files differ from it (a copied working tree over an
    older ``.git`` then does not pass for that commit); None outside a checkout."""
    where = cwd or Path(__file__).resolve().parent

    def git(*args: str) -> subprocess.CompletedProcess[str] | None:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=where,
                                  timeout=5, check=False)
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = status is not None and status.returncode == 0 and bool(status.stdout.strip())
    return head.stdout.strip() + ("+dirty" if dirty else "")


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
