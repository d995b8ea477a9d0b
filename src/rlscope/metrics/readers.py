"""Readers for where training logs usually live: TensorBoard event files and W&B offline runs.

Both yield raw ``(step, name, value)`` points per run; `rlscope.doctor.importers` translates
the names and builds the tables. The readers import their packages lazily (the doctor stays
importable without them) and raise `MissingReader` with the one-line install hint when the
package is absent.

- TensorBoard: a directory holding ``events.out.tfevents.*`` files (anywhere below it; one
  run per directory that holds event files), read with TensorBoard's own
  ``EventAccumulator``. Scalars written with ``add_scalar`` come back as scalar events
  (TensorBoard ≥ 2 stores them as tensors; both are read).
- W&B: an offline run directory (``wandb/offline-run-*`` or ``wandb/run-*``, holding
  ``run-<id>.wandb``), a ``wandb/`` folder with several of them, or the ``.wandb`` file itself.
  The file is W&B's transaction log: a 7-byte header (``:W&B``, magic, version) and then records
  framed like LevelDB's log (32 KiB blocks; each chunk a 7-byte header: checksum, length, type
  full/first/middle/last), each record a ``wandb.proto.wandb_internal_pb2.Record`` protobuf.
  The decoding uses the ``wandb`` package's own protobuf definitions; the framing is read by
  `rlscope.metrics.wandb_log` (the W&B sink waits there for a finished file), because ``wandb``
  ≥ 0.20 no longer ships a Python reader for it (its sync runs in the Go
  core). History rows give the step (``train/global_step`` where a framework logs one, else
  ``_step``) and every numeric item; W&B's bookkeeping keys
  (``_runtime``, ``_timestamp``, ``_wandb``...) are skipped. A truncated file (a crashed run)
  yields the records before the cut.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

# BadLog and wait_for_wandb are re-exported (BadLog is raised by both readers)
from rlscope.metrics.wandb_log import BadLog as BadLog
from rlscope.metrics.wandb_log import wait_for_wandb as wait_for_wandb
from rlscope.metrics.wandb_log import wandb_chunks

INSTALL_HINT = "install rlscope[logging] (pip install 'rlscope[logging]')"
TB_GLOB = "events.out.tfevents.*"

Point = tuple[float, str, float]
STEP_METRICS = ("train/global_step", "trainer/global_step", "global_step")
"""Step metrics that frameworks log into W&B history (transformers' and OpenRLHF's callbacks);
when a row has one, it is the row's step instead of W&B's ``_step`` counter, which also counts
evaluation and other log calls."""


class MissingReader(ImportError):
    """The package needed to read this format is not installed."""


def is_tensorboard_dir(path: Path) -> bool:
    return path.is_dir() and next(path.rglob(TB_GLOB), None) is not None


def wandb_files(path: Path) -> list[Path]:
    """The ``run-*.wandb`` files of an offline run directory, a ``wandb/`` folder or a
    project directory holding one (empty when there are none)."""
    if path.is_file():
        return [path] if path.suffix == ".wandb" else []
    found = sorted(path.glob("run-*.wandb")) or sorted(path.glob("*run-*/run-*.wandb")) \
        or sorted(path.glob("wandb/*run-*/run-*.wandb"))
    return [f for f in found if not f.parent.is_symlink()]  # wandb/latest-run links to a run


def tensorboard_runs(path: Path) -> dict[str, list[Point]]:
    """Scalar points per run directory (relative to ``path``; ``.`` for ``path`` itself)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import (
            SCALARS,
            TENSORS,
            EventAccumulator,
        )
    except ImportError:
        raise MissingReader(f"reading TensorBoard event files needs the tensorboard package: "
                            f"{INSTALL_HINT}") from None
    run_dirs = sorted({f.parent for f in path.rglob(TB_GLOB)})
    runs: dict[str, list[Point]] = {}
    for run_dir in run_dirs:
        acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0, TENSORS: 0})
        try:
            acc.Reload()
        except Exception as error:  # TensorBoard's own errors (DataLossError, ...)
            raise BadLog(f"{run_dir}: unreadable event file ({error.__class__.__name__}: "
                         f"{str(error)[:80]})") from None
        points: list[Point] = []
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            points += [(float(e.step), tag, float(e.value)) for e in acc.Scalars(tag)]
        for tag in tags.get("tensors", []):
            for event in acc.Tensors(tag):
                value = _tensor_scalar(event.tensor_proto)
                if value is not None:
                    points.append((float(event.step), tag, value))
        name = str(run_dir.relative_to(path)) if run_dir != path else "."
        runs[name] = points
    return runs


def _tensor_scalar(proto: object) -> float | None:
    """A scalar summary stored as a tensor (TensorBoard 2's add_scalar), else None."""
    try:
        from tensorboard.util import tensor_util

        array = tensor_util.make_ndarray(proto)
    except (ImportError, ValueError, TypeError):
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    return float(array.reshape(()))


def wandb_points(path: Path) -> Iterator[Point]:
    """Numeric history items of one ``run-*.wandb`` file as (step, name, value)."""
    try:
        from google.protobuf.message import DecodeError
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise MissingReader(f"reading W&B run files needs the wandb package: "
                            f"{INSTALL_HINT}") from None
    for index, chunk in enumerate(wandb_chunks(path.read_bytes())):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        try:
            record.ParseFromString(chunk)
        except DecodeError:
            raise BadLog(f"record {index} is not a W&B record") from None
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, float] = {}
        step: float | None = None
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            try:
                value = json.loads(item.value_json)
            except json.JSONDecodeError:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key == "_step":
                step = float(value)
            elif not key.startswith("_") and math.isfinite(float(value)):
                row[key] = float(value)
        if record.history.HasField("step"):
            step = float(record.history.step.num)
        own = next((k for k in STEP_METRICS if k in row), None)
        if own is not None:  # the framework's own step (TRL, OpenRLHF), not W&B's counter
            step = row.pop(own)
        if step is None:
            continue
        for key, value in row.items():
            yield step, key, value


def wandb_runs(path: Path) -> dict[str, list[Point]]:
    """Points per W&B run (named by the run directory) below ``path``."""
    return {(f.parent.name if f.parent != path else f.stem): list(wandb_points(f))
            for f in wandb_files(path)}
