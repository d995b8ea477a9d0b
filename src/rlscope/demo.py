"""`rlscope demo`: three update rules on token_reversal, on CPU, compared in one table.

The README's main job: it needs no GPU and no download, and takes about a minute on two cores.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from rlscope.config import RunConfig, TrainConfig
from rlscope.train import train


@dataclass(frozen=True)
class DemoConfig:
    """A short comparison of update rules on the sandbox's token_reversal task."""

    methods: tuple[str, ...] = ("reinforce", "grpo", "dg")
    """Presets to compare."""
    num_steps: int = 150
    """Steps per run."""
    grouped_inner_epochs: int = 4
    """Inner epochs for grouped presets (the sandbox's GRPO setting); others use 1."""
    seed: int = 0
    """Seed of every run."""
    device: str = "cpu"
    """Device for the runs."""
    runs_dir: str = "runs/demo"
    """Where the run directories go."""
    progress: bool = True
    """Show progress bars."""
    threads: int = 2
    """CPU threads for torch (0 = torch's default, one per core). Two by default: the tiny
    model gains little from more, the README's table was measured with two, and on a machine
    shared with other jobs one thread per core oversubscribes the CPU and runs 10–20× slower."""


def demo_errors(cfg: DemoConfig) -> list[str]:
    """Why ``cfg`` cannot run (empty when it can); every run's own configuration is checked
    again by `rlscope.config.validate` before it trains."""
    from rlscope.methods import canonical_method_name

    errors = []
    for method in cfg.methods:
        try:
            canonical_method_name(method)
        except ValueError as e:
            errors.append(f"--methods: {e}")
    if not cfg.methods:
        errors.append("--methods: give at least one preset (see `rlscope methods`)")
    if cfg.num_steps < 1:
        errors.append(f"--num_steps={cfg.num_steps} must be >= 1")
    return errors


def run_demo(cfg: DemoConfig, console: Console) -> list[dict[str, float | str]]:
    """Train each preset and print the comparison; returns the table rows."""
    from rlscope.methods import resolve_method

    rows: list[dict[str, float | str]] = []
    for method in cfg.methods:
        grouped = resolve_method(method).grouped
        run = RunConfig(num_steps=cfg.num_steps, seed=cfg.seed, device=cfg.device,
                        runs_dir=cfg.runs_dir, progress=cfg.progress,
                        inner_epochs=cfg.grouped_inner_epochs if grouped else 1,
                        name=f"{method}_s{cfg.seed}", doctor_every=0, threads=cfg.threads)
        result = train(dataclasses.replace(TrainConfig(method=method), run=run))
        first, final = result.evals[0], result.final_eval
        rows.append({"method": method, "initial_error": first["eval/test_error"],
                     "final_error": final["eval/test_error"], "entropy": final["eval/entropy"],
                     "wall_s": result.wall_time_s, "steps": float(len(result.metrics)),
                     "status": result.status, "inner_epochs": float(run.inner_epochs)})
    table = Table(title=f"token_reversal, batch 96, seed {cfg.seed} (random policy: error "
                  "0.667)")
    for col in ("method", "epochs", "steps", "test error", "entropy", "time"):
        table.add_column(col, no_wrap=True)
    for row in rows:
        stopped = row["status"] != "completed"
        table.add_row(str(row["method"]), f"{row['inner_epochs']:.0f}",
                      f"{row['steps']:.0f}" + ("*" if stopped else ""),
                      f"{row['initial_error']:.3f} → {row['final_error']:.3f}",
                      f"{row['entropy']:.3f}", f"{row['wall_s']:.1f} s")
    console.print(table)
    if any(row["status"] != "completed" for row in rows):
        console.print("* stopped early (out_of_regime): every group's rewards were equal for "
                      "10 steps, so grouped advantages carried no signal.")
    console.print(f"Run directories: {cfg.runs_dir}/<method>_s{cfg.seed}  "
                  "(metrics.jsonl, eval.jsonl, samples.jsonl, config.json, checkpoints/)",
                  soft_wrap=True)
    return rows
