"""Checkpoints and training-run records on disk.

``tinker://<run>/weights/<name>`` is ``ROOT/<run>/checkpoints/weights/<name>/`` and
``tinker://<run>/sampler_weights/<name>`` is ``ROOT/<run>/checkpoints/sampler_weights/<name>/``
(``<run>`` is `run_key` of the run id: a safe slug plus a hash of the exact id). A
checkpoint directory holds ``meta.json`` (base model, LoRA settings, step), ``trainable.pt``
(the trainable tensors by parameter name),
``optimizer.pt`` (``weights`` only) and, for LoRA, ``adapter/`` in PEFT format
(``adapter_config.json`` + ``adapter_model.safetensors``). ``ROOT/<run>/run.json`` is the
``TrainingRun`` record ``GET training_runs/{id}`` answers, so both survive a restart.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from rlscope.files import atomic_write_text
from rlscope.policy.hf import HFPolicy
from rlscope.serve.state import TrainingModel, UserError

KINDS = ("weights", "sampler_weights")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
CHECKPOINT_TYPES = {"weights": "training", "sampler_weights": "sampler"}


MAX_ID_CHARS = 256
"""Longest run id or checkpoint name accepted."""


def run_key(run_id: str) -> str:
    """The directory name of a training-run id: a path-safe slug of the id (every character
    outside ``A-Za-z0-9._-`` becomes ``_``, at most 64 kept) plus ``-`` and 12 hex digits of the
    id's SHA-256, so distinct ids never share a directory (``victim/run`` and ``victim:run``
    get different ones) and no id can name ``.``, ``..`` or a path."""
    slug = _UNSAFE.sub("_", run_id)[:64].lstrip(".") or "run"
    return f"{slug}-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"


def parse_tinker_path(path: str) -> tuple[str, str, str]:
    """``tinker://<run>/<weights|sampler_weights>/<name>`` → ``(run, kind, name)``; raises
    UserError for anything else (``..``, empty parts, control characters, overlong ids)."""
    if not isinstance(path, str) or not path.startswith("tinker://"):
        raise UserError(f"checkpoint path {str(path)[:300]!r} must start with tinker://")
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not parts[0] or not parts[2]:
        raise UserError(f"checkpoint path {path[:300]!r} must read "
                        "tinker://<run>/weights|sampler_weights/<name>")
    run, kind, name = parts
    if run in (".", "..") or len(run) > MAX_ID_CHARS or not run.isprintable():
        raise UserError(f"checkpoint path {path[:300]!r}: invalid run id")
    return run, kind, checkpoint_name(name)


def checkpoint_name(name: str) -> str:
    """``name`` if it is safe as one directory name."""
    if not name or "/" in name or "\\" in name or name.startswith(".") \
            or len(name) > MAX_ID_CHARS or not name.isprintable():
        raise UserError(f"checkpoint name {name[:300]!r} must be non-empty, at most "
                        f"{MAX_ID_CHARS} printable characters, with no '/', '\\' or leading '.'")
    return name


def confined(root: Path, relative: Path) -> Path:
    """``root / relative``, resolved, after checking it stays inside ``root`` (symlinks
    included); raises UserError, naming no server path, if it does not."""
    base = root.resolve()
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise UserError("checkpoint path points outside the server's root")
    return target


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def checkpoint_dir(root: Path, path: str) -> Path:
    """The directory of a ``tinker://`` path, confined to ``root``."""
    run, kind, name = parse_tinker_path(path)
    return confined(root, Path(run_key(run), "checkpoints", kind, name))


def save(model: TrainingModel, kind: str, name: str) -> str:
    """Write ``model``'s checkpoint (with the optimizer for ``weights``); its tinker path."""
    out = model.run_dir / "checkpoints" / kind / checkpoint_name(name)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({n: p.detach().cpu() for n, p in model.trainable()}, out / "trainable.pt")
    if kind == "weights":
        torch.save(model.optimizer.state_dict(), out / "optimizer.pt")
    if model.lora.rank > 0:
        # PEFT format; LoRA on lm_head must not drag the whole head into the adapter
        model.policy.unwrap().save_pretrained(  # type: ignore[operator]
            str(out / "adapter"), save_embedding_layers=False)
    atomic_write_text(out / "meta.json", json.dumps({
        "base_model": model.base_model, "spec": model.spec, "lora": model.lora.as_dict(),
        "run_id": model.model_id, "kind": kind, "name": name, "step": model.step,
        "time": iso(time.time())}, indent=2) + "\n")
    return f"tinker://{model.model_id}/{kind}/{name}"


def read_meta(ckpt: Path, path: str) -> dict[str, Any]:
    if not (ckpt / "meta.json").is_file():
        raise UserError(f"no checkpoint at {path}")
    try:
        meta: dict[str, Any] = json.loads((ckpt / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {path} is unreadable ({type(e).__name__})") from e
    return meta


def load_tensors(file: Path, path: str, device: torch.device) -> Any:
    """``torch.load(file, weights_only=True)``: tensors and plain containers only, never a
    pickled object that runs code; raises UserError naming the tinker ``path`` (not the
    server's file) if the file is missing, corrupt or a foreign pickle."""
    try:
        return torch.load(file, map_location=device, weights_only=True)
    except FileNotFoundError as e:
        raise UserError(f"checkpoint {path} is incomplete (no {file.name})") from e
    except Exception as e:
        raise UserError(f"checkpoint {path}: {file.name} is not a plain tensor file "
                        f"({type(e).__name__}); refused") from e


def read_trainable(ckpt: Path, path: str, device: torch.device) -> dict[str, torch.Tensor]:
    """A checkpoint's trainable tensors by parameter name (``weights_only`` load)."""
    state = load_tensors(ckpt / "trainable.pt", path, device)
    if not isinstance(state, dict) or not all(isinstance(n, str) and isinstance(t, torch.Tensor)
                                              for n, t in state.items()):
        raise UserError(f"checkpoint {path}: trainable.pt is not a name → tensor mapping")
    return state


def copy_trainable(policy: HFPolicy, state: dict[str, torch.Tensor], path: str) -> None:
    """Copy trainable tensors into ``policy`` (same base and LoRA settings)."""
    params = dict(policy.named_parameters())
    missing = [n for n in state if n not in params]
    if missing:
        raise UserError(f"checkpoint {path} does not fit this model: {missing[:3]} ...")
    wrong = [n for n, t in state.items() if t.shape != params[n].shape]
    if wrong:
        raise UserError(f"checkpoint {path} does not fit this model: shape of {wrong[:3]}")
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)


def load_trainable(policy: HFPolicy, ckpt: Path, device: torch.device, path: str = "") -> None:
    """`read_trainable` then `copy_trainable`."""
    path = path or ckpt.name
    copy_trainable(policy, read_trainable(ckpt, path, device), path)


def record(path: str) -> dict[str, Any]:
    """The ``Checkpoint`` object of a tinker path, as the REST API returns it."""
    _, kind, name = parse_tinker_path(path)
    return {"checkpoint_id": f"{kind}/{name}", "checkpoint_type": CHECKPOINT_TYPES[kind],
            "time": iso(time.time()), "tinker_path": path}


def run_record(model: TrainingModel) -> dict[str, Any]:
    """The ``TrainingRun`` record of ``model`` (what ``run.json`` holds)."""
    return {
        "training_run_id": model.model_id, "base_model": model.base_model,
        "model_owner": "local", "is_lora": model.lora.rank > 0, "corrupted": False,
        "lora_rank": model.lora.rank if model.lora.rank > 0 else None,
        "last_request_time": iso(model.last_request),
        "last_checkpoint": model.last_checkpoint,
        "last_sampler_checkpoint": model.last_sampler_checkpoint,
        "user_metadata": model.user_metadata or None,
    }


def write_run(model: TrainingModel) -> None:
    """``run.json``: `run_record` of ``model``."""
    atomic_write_text(model.run_dir / "run.json", json.dumps(run_record(model), indent=2) + "\n")


def read_run(root: Path, run_id: str) -> dict[str, Any]:
    if len(run_id) > MAX_ID_CHARS:
        raise UserError("unknown training run (id too long)")
    path = root / run_key(run_id) / "run.json"
    if not path.is_file():
        raise UserError(f"unknown training run {run_id!r}")
    try:
        run: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"training run {run_id!r} is unreadable") from e
    return run


def list_runs(root: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(root.glob("*/run.json")):
        try:
            runs.append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return runs


def list_checkpoints(root: Path, run_id: str) -> list[dict[str, Any]]:
    run_dir = root / run_key(read_run(root, run_id)["training_run_id"])
    out = []
    for kind in KINDS:
        for meta_path in sorted((run_dir / "checkpoints" / kind).glob("*/meta.json")):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue  # unreadable (a crash mid-write): not listed, as in `list_runs`
            out.append({"checkpoint_id": f"{kind}/{meta['name']}",
                        "checkpoint_type": CHECKPOINT_TYPES[kind], "time": meta["time"],
                        "tinker_path": f"tinker://{run_id}/{kind}/{meta['name']}"})
    return out
