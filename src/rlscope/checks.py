"""Checks of user input that every command shares, each returning the problems as one-line
messages (empty when there are none): finite floats and non-negative counts over a whole
frozen-dataclass config, the device, files to read, directories to write, optional modules,
and a lower bound on one training step's memory against what the device has free.

Torch is imported only inside the device and memory checks, so the field and path checks are
cheap to import.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

HF_ARCHS = ("llama", "qwen2", "hf")
"""--arch values built with transformers."""
# Optional modules → the extra that installs them (pyproject's optional-dependencies).
EXTRAS = {"transformers": "hf", "peft": "hf", "fastapi": "serve", "uvicorn": "serve",
          "tinker": "serve", "tinker_cookbook": "cookbook", "selenium": "dev"}


def field_errors(cfg: object, prefix: str = "", signed: Iterable[str] = ("seed",),
                 aliases: Mapping[str, str] | None = None) -> list[str]:
    """Every float value of the frozen dataclass ``cfg`` (nested ones and tuples included) must
    be finite and every int value >= 0, except in the fields named in ``signed`` (where a
    negative value means something); ``None`` (an unset override) and booleans pass. Messages
    name the dotted field (a nested config's name replaced by its entry in ``aliases``, e.g.
    ``components`` → ``method``), its value and its flag."""
    signed = frozenset(signed)
    errors: list[str] = []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            nested = (aliases or {}).get(f.name, f.name)
            errors += field_errors(value, f"{prefix}{nested}.", signed)
            continue
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, float) and not math.isfinite(v):
                errors.append(f"{name}={v} must be a finite number (--{f.name})")
                break
            if isinstance(v, int) and not isinstance(v, bool) and v < 0 \
                    and f.name not in signed:
                errors.append(f"{name}={v} must be >= 0 (--{f.name})")
                break
    return errors


def device_errors(name: str, field: str = "run.device") -> list[str]:
    """Why ``name`` (cpu, cuda, cuda:N, mps or auto) is not a device of this machine."""
    if name == "auto":
        return []
    import torch

    hint = "use cpu, cuda, cuda:N or auto"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return [f"{field}={name!r} is not a device: {hint}"]
    if device.type == "cpu":
        return []
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return [f"{field}={name!r} but CUDA is not available on this machine: use "
                    "--device cpu (or auto)"]
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return [f"{field}={name!r} but this machine has {count} CUDA device(s), "
                    f"cuda:0..cuda:{count - 1}: pick one of those"]
        return []
    if device.type == "mps":
        return [] if torch.backends.mps.is_available() else [
            f"{field}={name!r} but MPS is not available on this machine: {hint}"]
    return [f"{field}={name!r}: device type {device.type!r} is not supported; {hint}"]


def readable_errors(path: str, flag: str, what: str) -> list[str]:
    """Why ``path`` (a file or directory ``flag`` names) cannot be read; ``what`` says what
    to give instead."""
    p = Path(path)
    if not p.exists():
        return [f"{flag} {path}: no such file or directory; {what}"]
    if not os.access(p, os.R_OK):
        return [f"{flag} {path}: not readable (permission denied); {what}"]
    return []


def writable_dir_errors(path: str, flag: str) -> list[str]:
    """Why the directory ``path`` cannot be created or written (checked on it, or on its
    nearest existing parent, by creating and removing a temporary file; nothing is left)."""
    p = Path(path).expanduser().absolute()
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"{flag} {path}: {existing} is a file, not a directory; give a directory "
                "path you can write to"]
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        return [f"{flag} {path}: cannot write in {existing} ({e.strerror or e}); give a "
                "directory you can write to"]
    return []


def module_errors(module: str, needed_by: str) -> list[str]:
    """A one-line install hint when the optional ``module`` is missing (empty when present)."""
    if importlib.util.find_spec(module) is not None:
        return []
    extra = EXTRAS.get(module)
    install = f"pip install 'rlscope[{extra}]'" if extra else f"pip install {module}"
    return [f"{needed_by} needs {module}: {install}"]


def model_module_errors(model: object) -> list[str]:
    """The install hints a model config (``arch``, ``lora_rank``) needs: transformers for the
    Hugging Face architectures, peft for LoRA."""
    arch, rank = getattr(model, "arch", "tiny"), getattr(model, "lora_rank", 0)
    errors = module_errors("transformers", f"--arch {arch}") if arch in HF_ARCHS else []
    return errors + (module_errors("peft", "--lora_rank") if rank > 0 else [])


def install_hint(error: ModuleNotFoundError) -> str:
    """One line for a missing optional module: which extra installs it."""
    module = (error.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    install = f"pip install 'rlscope[{extra}]'" if extra else f"pip install {module or '…'}"
    return f"this command needs {module or 'a missing module'}: {install}"


@dataclass(frozen=True)
class MemoryTerm:
    """One part of a step's memory estimate."""

    what: str
    """What the bytes hold, for the message."""
    bytes: int
    """Its size (a lower bound)."""
    fix: str
    """What shrinks it, e.g. ``lower --batch_size``."""


def available_memory(device: str) -> int | None:
    """Free bytes on ``device`` (``cuda``/``cuda:N``: the CUDA driver's free memory; anything
    else: the host's available memory), ``None`` when it cannot be read."""
    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index
        free, _ = torch.cuda.mem_get_info(0 if index is None else index)
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def memory_errors(terms: list[MemoryTerm], device: str, skip_below: int = 256 * 2**20
                  ) -> list[str]:
    """Why a step whose largest allocations, held together, are ``terms`` cannot fit on
    ``device``: the estimate, the free memory and what shrinks the largest term.
    An estimate under ``skip_below`` bytes fits anywhere, so the device is not queried then
    (no CUDA context is created for a small run)."""
    total = sum(t.bytes for t in terms)
    if total < skip_below:
        return []
    free = available_memory(device)
    if free is None or total <= free:
        return []
    top = max(terms, key=lambda t: t.bytes)
    return [f"memory: one step needs at least {_gib(total)} on {device} but {_gib(free)} is "
            f"free; the largest part is {top.what} ({_gib(top.bytes)}): {top.fix}"]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def job_errors(cfg: object) -> list[str]:
    """`field_errors` plus, for the fields ``cfg`` has, the device (``device``), the output
    directory (``runs_dir``), the run name (``name``) and the model's optional modules
    (``model``): the checks every command that writes a directory shares (sft, rm, demo;
    train has its own in `rlscope.config.validate`)."""
    from rlscope.paths import check_name_component

    errors = field_errors(cfg)
    device = getattr(cfg, "device", None)
    if isinstance(device, str):
        errors += device_errors(device, "device")
    name = getattr(cfg, "name", "")
    if isinstance(name, str) and name and (problem := check_name_component(name, "--name")):
        errors.append(problem)
    runs_dir = getattr(cfg, "runs_dir", None)
    if isinstance(runs_dir, str):
        errors += writable_dir_errors(runs_dir, "--runs_dir")
    return errors + model_module_errors(getattr(cfg, "model", None))
