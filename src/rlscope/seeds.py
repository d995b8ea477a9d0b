"""Several seeds of one configuration, one after another or in worker processes.

``--num_seeds N`` runs seeds s, s+1, ..., s+N−1. With ``--jobs J > 1`` each seed runs in its
own worker process (spawned, so no state is shared), J at a time. A seed's results do not
depend on where it ran: every random stream derives from the seed alone. Bit-identical
floating point also needs the same CPU thread count per run (``--threads``), since PyTorch's
CPU reductions split work by thread.

The tidy ``--output`` CSV gains a row per evaluation as each happens (under a file lock), so a
crash loses nothing already finished.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from rlscope.config import TrainConfig
from rlscope.train import RunResult, train


def seed_configs(cfg: TrainConfig) -> list[TrainConfig]:
    """One config per seed; a named run gets ``<name>_s<seed>`` when there are several."""
    configs = []
    for i in range(cfg.run.num_seeds):
        seed = cfg.run.seed + i
        name = f"{cfg.run.name}_s{seed}" if cfg.run.name and cfg.run.num_seeds > 1 \
            else cfg.run.name
        configs.append(dataclasses.replace(
            cfg, run=dataclasses.replace(cfg.run, seed=seed, name=name, num_seeds=1)))
    return configs


def _train_quietly(cfg: TrainConfig) -> RunResult:
    return train(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, progress=False)))


def run_seeds(cfg: TrainConfig) -> list[RunResult]:
    """Train every seed of ``cfg``; results in seed order."""
    configs = seed_configs(cfg)
    if cfg.run.jobs <= 1 or len(configs) == 1:
        return [train(c) for c in configs]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=cfg.run.jobs, mp_context=context) as pool:
        return list(pool.map(_train_quietly, configs))
