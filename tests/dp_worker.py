"""Runs training jobs for tests/test_distributed.py, alone or as one rank under torchrun.

``python dp_worker.py JOBS.json OUT_DIR``: JOBS.json lists ``{"name", "args"}`` (`rlscope
train` arguments); for each, ``OUT_DIR/<name>.rank<RANK>.pt`` holds the run's metrics and
evaluations, and, after every update, the trainable parameters and the gradients of the
update's last optimizer step (the summed global gradient under data parallel; whole tensors,
gathered from the shards under --fsdp), and how many rows this rank's learner computed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

import rlscope.learner as learner
import rlscope.train as train_module
from rlscope.cli import _tyro_parse
from rlscope.config import TrainConfig
from rlscope.distributed import full


def run_job(args: list[str]) -> dict[str, Any]:
    """Train ``args`` with the learner instrumented; the record described above."""
    steps: list[dict[str, list[torch.Tensor | None]]] = []
    rows = [0]
    real_update, real_micro = train_module.update, learner.micro_batch_loss

    def counted(*a: Any, **k: Any) -> Any:
        rows[0] += a[3].batch_size  # (spec, policy, value_head, batch, ...)
        return real_micro(*a, **k)

    def recorded(plan: Any, policy: Any, value_head: Any, optimizer: Any, *a: Any,
                 **k: Any) -> Any:
        result = real_update(plan, policy, value_head, optimizer, *a, **k)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        steps.append({"grads": [None if p.grad is None else full(p.grad).clone()
                                for p in params],
                      "params": [full(p.detach()).clone() for p in params]})
        return result

    train_module.update, learner.micro_batch_loss = recorded, counted  # type: ignore[assignment]
    try:
        cfg = _tyro_parse(TrainConfig, args, "dp_worker")
        assert isinstance(cfg, TrainConfig)
        result = train_module.train(cfg)
    finally:
        train_module.update, learner.micro_batch_loss = real_update, real_micro
    return {"metrics": result.metrics, "evals": result.evals, "steps": steps, "rows": rows[0],
            "status": result.status, "run_dir": str(result.run_dir)}


def main(jobs_file: str, out_dir: str) -> None:
    rank = os.environ.get("RANK", "0")
    for job in json.loads(Path(jobs_file).read_text()):
        torch.save(run_job(job["args"]), Path(out_dir) / f"{job['name']}.rank{rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
