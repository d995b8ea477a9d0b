"""Run directories, resumable checkpoints, and safe loading of every weights file.

A checkpoint holds the policy, value head and reference weights, the optimizer state, the
run's generator state, and the loop state (step, KL coefficient, entropy coefficient and its
window, fallback streak, the staleness queue and the replay buffer), so a resumed run
continues bit for bit. Files are written atomically (`atomic_save`), hold tensors and plain
containers only, and everything rlscope loads goes through `safe_load`
(``weights_only=True``): a crafted pickle is refused before any of it runs. A resume uses the
newest intact checkpoint (`newest_intact`) and may change only `RESUME_MAY_CHANGE`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlscope.distributed import DataParallel, local
from rlscope.files import (
    LATEST,
    SFT_FILE,
    CheckpointError,
    UnsafeCheckpointError,
    atomic_save,
    atomic_write_text,
    safe_load,
)
from rlscope.policy.base import Policy

FORMAT = 2
"""``format`` of the checkpoints written now: plain tensors and containers, read with
``weights_only=True``. Format 1 (no ``format`` key) holds the same kinds of objects and loads
the same way."""
STEP_FILE = re.compile(r"step_(\d+)\.pt")
STEP_DIR = re.compile(r"step_(\d+)")
"""A sharded checkpoint (``--fsdp``, `save_sharded`): a torch.distributed.checkpoint
directory of the policy's and value head's weights and the optimizer state, with
`SHARDED_STATE` beside them."""
SHARDED_STATE = "state.pt"
"""Inside a sharded checkpoint: everything else (reference weights, generator, loop state),
as in a ``step_<N>.pt`` file."""
RESUME_KEYS = ("policy", "optimizer", "generator", "step", "beta", "fallback_streak", "queue")
"""What a training checkpoint must hold to be resumed."""


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


def _state(module: Policy | torch.nn.Module | None) -> dict[str, Any] | None:
    return None if module is None else module.state_dict()


def save(run_dir: Path, policy: Policy, value_head: torch.nn.Module | None,
         ref: Policy | None, optimizer: torch.optim.Optimizer,
         generator: torch.Generator, state: Any, companion: dict[str, Any] | None = None
         ) -> Path:
    """Write ``checkpoints/step_<N>.pt`` atomically (see `atomic_save`), then point
    ``latest.pt`` at it (atomically too). Earlier checkpoints are kept, so the previous one is
    intact until the new one is complete. The payload is tensors, numbers, strings and
    containers only, so `load` reads it with ``weights_only=True``. ``companion``: the task's
    second model's state (`rlscope.tasks.base.TrainsCompanion`), stored under "companion"."""
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "policy": policy.state_dict(), "value_head": _state(value_head), "ref": _state(ref),
        "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
        "step": state.step, "beta": state.beta, "fallback_streak": state.fallback_streak,
        "entropy_coef": state.entropy_coef, "entropy_history": list(state.entropy_history),
        **state.source.state_dict(),  # the batch source: "queue" and "replay"
    }
    if companion:
        payload["companion"] = companion
    path = atomic_save(payload, folder / f"step_{state.step}.pt")
    atomic_write_text(folder / LATEST, path.name)
    return path


def save_state(run_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Checkpoint a run of another step kind (`rlscope.steps`): ``state`` (its modules',
    optimizers' and generators' states: tensors, numbers, strings and containers) at ``step``,
    written and pointed at like `save`; `load_state` reads it back."""
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = atomic_save({"format": FORMAT, "step": step, "state": state},
                       folder / f"step_{step}.pt")
    atomic_write_text(folder / LATEST, path.name)
    return path


def load_state(run_dir: Path, device: torch.device | str
               ) -> tuple[int, dict[str, Any], list[str]]:
    """The step and state of the newest intact `save_state` checkpoint of ``run_dir``, with
    the notices about newer files skipped."""
    payload, _, notices = newest_intact(run_dir, device, ("step", "state"))
    return int(payload["step"]), payload["state"], notices


def _loop_payload(ref: Policy | None, generator: torch.Generator, state: Any
                  ) -> dict[str, Any]:
    """What a checkpoint holds besides the trained modules and the optimizer."""
    return {
        "format": FORMAT, "ref": _state(ref), "generator": generator.get_state(),
        "step": state.step, "beta": state.beta, "fallback_streak": state.fallback_streak,
        "entropy_coef": state.entropy_coef, "entropy_history": list(state.entropy_history),
        **state.source.state_dict(),  # the batch source: "queue" and "replay"
    }


def _trained(policy: Policy, value_head: torch.nn.Module | None) -> torch.nn.ModuleDict:
    """The optimizer's modules under one root (keys ``policy.*``, ``value_head.*``)."""
    modules: dict[str, Any] = {"policy": policy}
    if value_head is not None:
        modules["value_head"] = value_head
    return torch.nn.ModuleDict(modules)


def is_sharded(module: Policy | torch.nn.Module) -> bool:
    """Whether ``module``'s weights are sharded over ranks (FSDP2's DTensors)."""
    return any(local(p) is not p for p in module.parameters())


def save_sharded(run_dir: Path, policy: Policy, value_head: torch.nn.Module | None,
                 ref: Policy | None, optimizer: torch.optim.Optimizer,
                 generator: torch.Generator, state: Any, parallel: DataParallel) -> Path:
    """Every rank writes its shards of the weights and optimizer state with
    torch.distributed.checkpoint into ``checkpoints/step_<N>.tmp/``, rank 0 adds
    `SHARDED_STATE`; after a barrier rank 0 renames the directory ``step_<N>`` and points
    ``latest.pt`` at it, so a ``step_<N>`` directory is always complete. Collective."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = run_dir / "checkpoints"
    final, tmp = folder / f"step_{state.step}", folder / f"step_{state.step}.tmp"
    if parallel.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    parallel.barrier()
    model_sd, optim_sd = get_state_dict(_trained(policy, value_head), optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)
    if parallel.is_main:
        atomic_save(_loop_payload(ref, generator, state) | {"sharded": True},
                    tmp / SHARDED_STATE)
    parallel.barrier()
    if parallel.is_main:
        old = folder / f"step_{state.step}.old"
        if final.exists():  # the same step saved again (the final save)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        atomic_write_text(folder / LATEST, final.name)
    parallel.barrier()
    return final


def _load_sharded(path: Path, policy: Policy, value_head: torch.nn.Module | None,
                  optimizer: torch.optim.Optimizer) -> None:
    """Read a sharded checkpoint's weights and optimizer state into the modules as they are
    laid out now: sharded over any number of ranks, or whole in one process (DCP reshards)."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    trained = _trained(policy, value_head)
    model_sd, optim_sd = get_state_dict(trained, optimizer)
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=path)  # in place
    set_state_dict(trained, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def _load_whole_into_sharded(payload: dict[str, Any], policy: Policy,
                             value_head: torch.nn.Module | None,
                             optimizer: torch.optim.Optimizer) -> None:
    """An ordinary checkpoint's (whole) weights and optimizer state into sharded modules: the
    optimizer's tensors, numbered in parameter order, named as the modules' parameters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    trained = _trained(policy, value_head)
    weights = {f"policy.{k}": v for k, v in payload["policy"].items()}
    if value_head is not None:
        weights |= {f"value_head.{k}": v for k, v in payload["value_head"].items()}
    names = [f"{prefix}.{n}" for prefix, module in trained.items()
             for n, p in module.named_parameters() if p.requires_grad]
    optim = payload["optimizer"]
    named: dict[str, Any] = {"state": {names[i]: v for i, v in optim["state"].items()},
             "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                              for g in optim["param_groups"]]}
    set_state_dict(trained, optimizer, model_state_dict=weights, optim_state_dict=named,
                   options=StateDictOptions(full_state_dict=True))


def checkpoint_files(run_dir: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoints/step_<N>.pt`` and sharded ``step_<N>/``
    directory, newest step first."""
    found = []
    for path in (run_dir / "checkpoints").glob("step_*"):
        match = STEP_FILE.fullmatch(path.name) or (
            STEP_DIR.fullmatch(path.name) if path.is_dir() else None)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


def newest_intact(run_dir: Path, device: torch.device | str,
                  keys: tuple[str, ...] = RESUME_KEYS) -> tuple[dict[str, Any], Path, list[str]]:
    """The payload and file of the newest checkpoint of ``run_dir`` that loads and holds
    ``keys``, with one notice per newer file skipped (truncated or corrupt, e.g. killed
    mid-write by an older rlscope or damaged on disk, or written by another step kind). A file
    refused as unsafe is never skipped: it raises."""
    files = checkpoint_files(run_dir)
    if not files:
        raise CheckpointError("--resume", run_dir, "no checkpoint to resume (no "
                              "checkpoints/step_<N>.pt; set --checkpoint_every to write them)")
    notices: list[str] = []
    for step, path in files:
        sharded = path.is_dir()
        if sharded and not (path / ".metadata").is_file():
            notices.append(f"skipping checkpoint {path}: no .metadata (an incomplete sharded "
                           "checkpoint)")
            continue
        try:
            payload = safe_load(path / SHARDED_STATE if sharded else path, "--resume", device)
        except UnsafeCheckpointError:
            raise
        except CheckpointError as error:
            notices.append(f"skipping checkpoint {path}: {error.reason}")
            continue
        missing = [k for k in keys
                   if k not in payload and not (sharded and k in ("policy", "optimizer"))]
        if missing or payload["step"] != step:
            notices.append(f"skipping checkpoint {path}: not a training checkpoint of step "
                           f"{step} (missing {missing})" if missing else
                           f"skipping checkpoint {path}: it holds step {payload['step']}")
            continue
        return payload, path, notices
    raise CheckpointError("--resume", run_dir, f"no intact checkpoint ({'; '.join(notices)}); "
                          "start the run again without --resume")


def load(run_dir: Path, policy: Policy, value_head: torch.nn.Module | None,
         ref: Policy | None, optimizer: torch.optim.Optimizer,
         generator: torch.Generator, state: Any, device: torch.device,
         companion: Callable[[dict[str, Any]], None] | None = None
         ) -> tuple[Any, list[str]]:
    """Restore everything `save` wrote from the newest intact checkpoint (`newest_intact`);
    returns the restored loop state and the notices about skipped files. Nothing on disk
    changes (see `adopt`). ``companion`` receives the saved "companion" state (``{}`` when
    the checkpoint has none)."""
    payload, path, notices = newest_intact(run_dir, device)
    if companion is not None:
        companion(payload.get("companion", {}))
    if payload.get("sharded"):  # a --fsdp checkpoint, onto any number of ranks
        _load_sharded(path, policy, value_head, optimizer)
    elif is_sharded(policy):  # an ordinary checkpoint onto --fsdp ranks
        _load_whole_into_sharded(payload, policy, value_head, optimizer)
    else:
        policy.load_state_dict(payload["policy"])
        if value_head is not None:
            value_head.load_state_dict(payload["value_head"])
        optimizer.load_state_dict(payload["optimizer"])
    if ref is not None:
        ref.load_state_dict(payload["ref"])
    generator.set_state(payload["generator"])
    state.source.load_state_dict(payload)
    return dataclasses.replace(
        state, step=payload["step"], beta=payload["beta"],
        fallback_streak=payload["fallback_streak"],
        # checkpoints written before adaptive entropy control lack these: keep the initial c
        entropy_coef=payload.get("entropy_coef", state.entropy_coef),
        entropy_history=list(payload.get("entropy_history", []))), notices


def init_weights_path(path: str) -> Path:
    """The weights file `--init` names: ``path`` itself, or inside a directory ``sft.pt``
    (an `rlscope sft` output) or the latest checkpoint of a training run."""
    p = Path(path)
    if p.is_dir():
        if (p / SFT_FILE).exists():
            return p / SFT_FILE
        latest = p / "checkpoints" / LATEST
        if latest.exists():
            found = p / "checkpoints" / latest.read_text().strip()
            if found.is_dir():
                raise FileNotFoundError(f"--init {path}: its latest checkpoint {found.name} is "
                                        "sharded (a --fsdp run): continue that run with "
                                        "--resume, or give a step_<N>.pt file")
            return found
        raise FileNotFoundError(f"--init {path}: the directory holds neither {SFT_FILE} nor "
                                f"checkpoints/{LATEST}")
    if not p.exists():
        raise FileNotFoundError(f"--init {path}: no such file or directory")
    return p


def load_init(path: str, policy: Policy | torch.nn.Module, device: torch.device) -> dict[str, Any]:
    """Load the policy weights of ``path`` (see `init_weights_path`) into ``policy``; returns
    the whole payload. Raises ValueError, naming the parameters, when shapes differ."""
    payload = safe_load(init_weights_path(path), "--init", device)
    if "policy" not in payload:
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


def adopt(run_dir: Path, step: int) -> None:
    """Make ``checkpoints/step_<step>.pt`` the run's latest once a resume from it goes ahead:
    newer (skipped) files are renamed ``*.corrupt``, temporary files of cut-off writes are
    removed and ``latest.pt`` points at it, so the directory says what the run continues
    from."""
    folder = run_dir / "checkpoints"
    name = f"step_{step}.pt"
    for other_step, other in checkpoint_files(run_dir):
        if other_step > step:
            os.replace(other, other.with_name(other.name + ".corrupt"))
        elif other_step == step:
            name = other.name  # a file or a sharded directory
    for stale in (*folder.glob("*.tmp"), *folder.glob("*.old")):
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    atomic_write_text(folder / LATEST, name)


RESUME_MAY_CHANGE: dict[str, str] = {
    "run.num_steps": "how far to train: the run continues from the checkpoint's step",
    "run.resume": "the directory being resumed",
    "run.name": "names a new run's directory; --resume names the directory instead",
    "run.runs_dir": "the parent of a new run's directory; --resume names the directory instead",
    "run.jobs": "worker processes for several seeds; a resumed run is one seed",
    "run.nproc": "data-parallel ranks: every rank count gives the same update (the weights are "
                 "replicated; docs/scaling.md)",
    "run.fsdp": "whether the ranks shard the weights: the same update either way; a sharded "
                "checkpoint loads onto any number of ranks, sharded or not (docs/scaling.md)",
    "run.threads": "CPU threads: how the same computation is scheduled (PyTorch's CPU "
                   "reductions may round differently in the last bits, as in sweeps)",
    "run.progress": "the console progress bar only",
    "run.doctor_every": "how often console alerts are checked; findings.json reads the whole "
                        "run at the end",
    "run.checkpoint_every": "when checkpoints are written; saving draws no random numbers",
    "run.log_samples": "rows written to samples.jsonl; writing them changes no state",
    "run.samples_every": "steps whose samples are written; writing them changes no state",
    "run.env_workers": "where rewards are scored: the same scores in a pool of Ray actors",
}
"""The only settings a ``--resume`` may change (dotted `TrainConfig` paths), each with why it
cannot change what the run computes. Everything else (method, lr, task, model, seed, device,
evaluation schedule, --output, ...) must equal the run's ``config.json``: a resumed run is the
same run, continued."""


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(stored: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any]
                   ) -> list[str]:
    """``field: stored → current`` for each setting outside `RESUME_MAY_CHANGE` where the
    ``config`` of a run's config.json (``stored``) and the resuming one differ (JSON-shaped
    dicts). A field that ``stored`` lacks (written by an older rlscope) counts as its
    default, ``defaults``."""
    old, new, default = _flat(stored), _flat(current), _flat(defaults)
    return [f"{key}: {old.get(key, default.get(key))!r} -> {new[key]!r}"
            for key in new if key not in RESUME_MAY_CHANGE
            and new[key] != old.get(key, default.get(key))]
