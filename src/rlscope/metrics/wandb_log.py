"""W&B's offline transaction log (``run-<id>.wandb``): its record framing, and whether a run
file is finished. Torch-free and below the doctor: the W&B sink (`rlscope.metrics.sinks`) waits
here for the file it asked W&B to write, and the doctor's reader (`rlscope.metrics.readers`)
decodes the records.

The file is a 7-byte header (``:W&B``, magic, version) and then records framed like LevelDB's
log (32 KiB blocks; each chunk a 7-byte header: checksum, length, type full/first/middle/last),
each record a ``wandb.proto.wandb_internal_pb2.Record`` protobuf. ``wandb`` ≥ 0.20 no longer
ships a Python reader for the framing (its sync runs in the Go core), so it is read here.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

_WANDB_HEADER = struct.Struct("<4sHB")
_CHUNK_HEADER = struct.Struct("<IHB")
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


class BadLog(ValueError):
    """A file that is not what its name says (not a W&B transaction log, ...)."""


def wandb_chunks(data: bytes) -> Iterator[bytes]:
    """The records of a W&B transaction log (LevelDB log framing after a 7-byte header)."""
    if len(data) < _WANDB_HEADER.size or data[:4] != b":W&B":
        raise BadLog("not a W&B transaction log (no ':W&B' header)")
    pos = _WANDB_HEADER.size
    pending: list[bytes] = []  # joined once at the last chunk: += would copy quadratically
    while pos + _CHUNK_HEADER.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER.size:  # block trailer padding
            pos += left
            continue
        _, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        pos += _CHUNK_HEADER.size
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left - _CHUNK_HEADER.size
            continue
        fragment = data[pos:pos + length]
        pos += length
        if len(fragment) < length:
            return  # truncated: a crashed run
        if kind == _FULL:
            yield fragment
        elif kind == _FIRST:
            pending = [fragment]
        elif kind == _MIDDLE:
            pending.append(fragment)
        elif kind == _LAST:
            yield b"".join([*pending, fragment])
            pending = []
        else:
            raise BadLog(f"unknown record type {kind} at byte {pos - length}")


def wandb_finished(path: Path) -> bool:
    """Whether the ``run-*.wandb`` file holds the run's exit record (W&B writes the file
    asynchronously: right after ``finish()`` it may still be only its header)."""
    try:
        from wandb.proto import wandb_internal_pb2

        for chunk in wandb_chunks(path.read_bytes()):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(chunk)
            if record.WhichOneof("record_type") == "exit":
                return True
    except (ImportError, OSError, BadLog, ValueError):
        return False
    return False


def wait_for_wandb(path: Path, timeout_s: float = 30.0) -> bool:
    """Wait until `wandb_finished` (polling); False when ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while not wandb_finished(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
