"""`rlscope bench`: throughput and latency of sampling, learning and the whole loop, as JSON.

Every speed-up is reported as a ratio against a baseline measured in the same process (the KV
cache against full recompute), plus absolute numbers for the machine it ran on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlscope.batch import PromptBatch
from rlscope.config import OptimConfig, RunConfig, TrainConfig
from rlscope.methods import MethodConfig
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling.sampler import SamplingConfig, generate
from rlscope.tasks import TaskConfig
from rlscope.train import train
from rlscope.utils import environment_info, resolve_device


@dataclass(frozen=True)
class BenchConfig:
    """What to measure."""

    device: str = "auto"
    """cpu, cuda or auto."""
    batch_size: int = 96
    """Rows per sampler / learner call."""
    prompt_len: int = 11
    """Prompt tokens (token_reversal with seq_len 10 has 11)."""
    new_tokens: tuple[int, ...] = (10, 128)
    """Completion lengths at which the sampler is timed."""
    repeats: int = 10
    """Timed repetitions per measurement (the median is reported)."""
    loop_steps: int = 300
    """Steps of the full sandbox run (grpo, token_reversal, group 8, 4 inner epochs)."""
    skip_loop: bool = False
    """Only time the sampler and learner."""
    cuda_graphs: bool = True
    """Replay the sampler and the loop's learner from CUDA graphs on CUDA (False: the eager
    baseline)."""
    output: str = ""
    """Also write the JSON here."""


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_sampler(cfg: BenchConfig, device: torch.device) -> dict[str, float]:
    torch.manual_seed(0)
    max_new = max(cfg.new_tokens)
    policy = TinyTransformer(TinyConfig(vocab_size=3, max_len=cfg.prompt_len + max_new))
    policy = policy.to(device).eval()
    g = torch.Generator().manual_seed(0)
    prompts = PromptBatch(tokens_BP=torch.randint(0, 3, (cfg.batch_size, cfg.prompt_len),
                                                  generator=g)).to(device)
    seeds_B = torch.arange(cfg.batch_size, device=device)
    out: dict[str, float] = {}
    for n in cfg.new_tokens:
        for use_cache in (True, False):
            scfg = SamplingConfig(use_cache=use_cache, decode_graphs=cfg.cuda_graphs)
            secs = _timed(functools.partial(generate, policy, prompts, scfg, seeds_B, n),
                          device, cfg.repeats)
            key = "cache" if use_cache else "recompute"
            out[f"sampler_{key}_tokens_per_s@{n}"] = cfg.batch_size * n / secs
        out[f"sampler_cache_speedup@{n}"] = (out[f"sampler_cache_tokens_per_s@{n}"]
                                             / out[f"sampler_recompute_tokens_per_s@{n}"])
    return out


def bench_learner(cfg: BenchConfig, device: torch.device) -> dict[str, float]:
    """One forward + backward + Adam step on ``batch_size × (prompt_len + 10)`` tokens."""
    torch.manual_seed(0)
    T = cfg.prompt_len + 10
    policy = TinyTransformer(TinyConfig(vocab_size=3, max_len=T)).to(device).train()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    tokens = torch.randint(0, 3, (cfg.batch_size, T), device=device)

    def step() -> None:
        logits, _ = policy(tokens)
        loss = -logits.log_softmax(-1).gather(-1, tokens[..., None]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    secs = _timed(step, device, cfg.repeats)
    return {"learner_pass_ms": secs * 1e3, "learner_tokens_per_s": cfg.batch_size * T / secs}


def bench_loop(cfg: BenchConfig, device: torch.device) -> dict[str, float]:
    """The sandbox's standard GRPO step and a full run with evaluation every 20 steps.

    Selection is off so that every step trains on all 96 rows: with mixed-group selection a
    solved task drops most rows and the run stops out of regime, which times less work.
    """
    train_cfg = TrainConfig(
        method="grpo", task="token_reversal", task_options=TaskConfig(seq_len=10),
        components=MethodConfig(selection="none"),
        optim=OptimConfig(),
        run=RunConfig(num_steps=cfg.loop_steps, batch_size=96, group_size=8, inner_epochs=4,
                      eval_every=20, device=str(device), progress=False,
                      runs_dir="runs/bench", log_samples=0, cuda_graphs=cfg.cuda_graphs))
    warm = dataclasses.replace(train_cfg, run=dataclasses.replace(train_cfg.run, num_steps=3))
    train(warm)
    result = train(train_cfg)
    steps = result.metrics[5:] or result.metrics
    med = {k: statistics.median(m[k] for m in steps)
           for k in ("time/step", "time/sample", "time/score", "time/learn", "time/ref")}
    return {"loop_run_wall_s": result.wall_time_s, "loop_steps": float(cfg.loop_steps),
            "loop_step_ms_median": med["time/step"] * 1e3,
            "loop_sample_ms_median": med["time/sample"] * 1e3,
            "loop_score_ms_median": med["time/score"] * 1e3,
            "loop_learn_ms_median": med["time/learn"] * 1e3,
            "loop_prepare_ms_median": med["time/ref"] * 1e3,
            "loop_eval_s_total": sum(e["time/eval"] for e in result.evals),
            "loop_final_test_error": result.final_eval["eval/test_error"],
            "loop_steps_run": float(len(result.metrics))}


def run_bench(cfg: BenchConfig) -> dict[str, object]:
    device = resolve_device(cfg.device)
    results: dict[str, object] = {"environment": environment_info(device)}
    results |= bench_sampler(cfg, device)
    results |= bench_learner(cfg, device)
    if not cfg.skip_loop:
        results |= bench_loop(cfg, device)
    text = json.dumps(results, indent=2)
    sys.stdout.write(text + "\n")
    if cfg.output:
        with open(cfg.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return results
