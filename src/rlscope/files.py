"""Files that must survive a kill and weights files that must not run code.

`atomic_save` and `atomic_write_text` write through a fsynced temporary file and a rename, so a
kill leaves the old file or the new one, never half of one. `safe_load` reads every weights
file rlscope loads (``--init``, ``--resume``, ``--rm_path``, ``sft.pt``, ``rm.pt``) with
``weights_only=True`` after checking the zip's CRCs: a crafted pickle is refused before any
of it runs. The lowest layer (torch only), so that the policy, supervised and training layers
can all use it.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

ZIP_MAGIC = b"PK\x03\x04"
"""How every file `torch.save` writes (and so every rlscope checkpoint) begins."""
UNSAFE_GLOBAL = re.compile(r"unsupported GLOBAL ([\w.]+)", re.IGNORECASE)
"""How torch's weights-only unpickler names the global a refused pickle wanted."""


LATEST = "latest.pt"
"""A text file in ``checkpoints/`` naming the newest complete checkpoint (kept for tools that
read it; `rlscope.checkpoint.load` looks at the files themselves)."""
SFT_FILE = "sft.pt"
"""The weights file `rlscope sft` writes in its output directory."""

class CheckpointError(ValueError):
    """A weights file rlscope will not load (foreign, truncated or corrupt) or a run directory
    with no usable checkpoint; the message is one line: the option, the file, the reason."""

    def __init__(self, what: str, path: Path, reason: str) -> None:
        super().__init__(f"{what} {path}: {reason}")
        self.what, self.path, self.reason = what, path, reason

    def __reduce__(self) -> tuple[type, tuple[str, Path, str]]:  # across worker processes
        return type(self), (self.what, self.path, self.reason)


class UnsafeCheckpointError(CheckpointError):
    """A pickle that needs more than tensors and plain containers: loading it could run code."""


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(payload: dict[str, Any], path: Path) -> Path:
    """``torch.save`` to a temporary file beside ``path``, fsync it, rename it over ``path``
    and fsync the folder: a kill at any moment leaves either the old file or the new one,
    never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` through a fsynced temporary file and a rename (see `atomic_save`)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def safe_load(path: Path, what: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The payload of an rlscope weights file, unpickled with ``weights_only=True`` (tensors,
    numbers, strings and containers only: a pickle that would import or call anything is
    refused before it runs). ``what`` names the option in messages (``--init``, ...).

    Raises `UnsafeCheckpointError` for a file that is not torch's zip format (rlscope writes
    nothing else; it is never unpickled) or whose pickle needs more than that, and
    `CheckpointError` for a missing, empty, truncated or corrupt file (the zip's CRCs are
    checked first) or a payload that is not a dict."""
    if not path.is_file():
        raise CheckpointError(what, path, "no such file")
    with path.open("rb") as f:
        head = f.read(4)
    if not head:
        raise CheckpointError(what, path, "truncated or corrupt (empty file)")
    if head != ZIP_MAGIC:
        raise UnsafeCheckpointError(
            what, path, "refused: not an rlscope checkpoint (not torch's zip format, e.g. a "
            "bare pickle) and unsafe to unpickle, so it was not read")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CheckpointError(what, path, f"truncated or corrupt ({_first_line(error)})"
                              ) from None
    if bad is not None:
        raise CheckpointError(what, path, f"corrupt (CRC mismatch in {bad})")
    try:
        with warnings.catch_warnings():  # torch's hint to retry unsafely is not for our users
            warnings.simplefilter("ignore", UserWarning)
            payload = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as error:
        match = UNSAFE_GLOBAL.search(str(error))
        needs = f"it would import {match.group(1)}" if match else "it needs more than tensors"
        raise UnsafeCheckpointError(
            what, path, f"refused: not an rlscope checkpoint and unsafe to load ({needs}, "
            "which could run code; rlscope reads only tensors and plain containers)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise CheckpointError(what, path, f"truncated or corrupt ({_first_line(error)})"
                              ) from None
    if not isinstance(payload, dict):
        raise CheckpointError(what, path, f"not an rlscope checkpoint (it holds a "
                              f"{type(payload).__name__}, not a dict of weights)")
    return payload
