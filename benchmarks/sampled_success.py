"""The sampled success of a policy on an interactive task's held-out episodes (temperature 1 by
default): the quantity RL maximises, where the greedy evaluation (``eval/success``) is at its
ceiling (code_repair in docs/recipes.md).

    python benchmarks/sampled_success.py --init runs/sft_cr_s0 --samples 10 --temperature 1 -- \\
        --task code_repair --code_repair_max_reference_chars 50 ... --seed 0

The options after ``--`` are `rlscope train`'s (the task, its options, ``--seed``; the model
must match ``--init``, an `rlscope sft` directory, a run directory or a checkpoint file). Each
of the task's held-out environment seeds (``--eval_batches × --eval_batch_size``, drawn from
``--seed``) is played ``--samples`` times (`rlscope.evaluation.sampled_episodes`: the sampling
seeds are fixed by the episode's index, so a warm start and the RL run from it are compared on
the same episodes and random streams). Prints one JSON line: the solved fraction, the fraction
solved at each turn, the solved fraction per spec where the environment has specs
(code_repair), and the wall seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
import tyro

from rlscope.config import TrainConfig
from rlscope.evaluation import heldout_batch, sampled_episodes
from rlscope.tasks import Interactive, make_task
from rlscope.train import initial_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", required=True, help="rlscope sft directory, run or checkpoint")
    parser.add_argument("--samples", type=int, default=10, help="episodes per held-out seed")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    args, rest = parser.parse_known_args()
    if args.samples < 1 or args.temperature < 0:
        parser.error("--samples must be >= 1 and --temperature >= 0")
    cfg = tyro.cli(TrainConfig, args=[*(a for a in rest if a != "--"), "--init", args.init],
                   config=(tyro.conf.OmitArgPrefixes,), use_underscores=True)
    torch.set_num_threads(cfg.run.threads)
    task = make_task(cfg.task, cfg.task_options)
    if not isinstance(task, Interactive):
        raise SystemExit(f"{cfg.task} is not a multi-turn task")
    policy = initial_policy(cfg, task, torch.device("cpu")).eval()
    env_seeds_B = heldout_batch(task, cfg.run.seed).env_seeds_B
    assert env_seeds_B is not None
    start = time.perf_counter()
    solved_N, turns_N = sampled_episodes(policy, task, env_seeds_B, args.samples,
                                         args.temperature)
    per_spec: dict[str, list[float]] = defaultdict(list)
    for b, seed in enumerate(env_seeds_B.tolist()):  # one environment per held-out seed
        spec = getattr(task.environment_factory.make(int(seed)), "spec", None)
        rows = solved_N[b * args.samples:(b + 1) * args.samples].tolist()
        per_spec[getattr(spec, "function", "all")].extend(rows)
    at_turn = {int(k): float(((turns_N == k) & (solved_N > 0)).float().mean())
               for k in turns_N.unique().tolist()}
    print(json.dumps({
        "init": args.init, "temperature": args.temperature, "episodes": len(solved_N),
        "solved": float(solved_N.mean()), "solved_at_turn": at_turn,
        "per_spec": {k: round(sum(v) / len(v), 3) for k, v in sorted(per_spec.items())},
        "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
