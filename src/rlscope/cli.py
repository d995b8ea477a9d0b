"""The `rlscope` command line: train, sft, sweep, demo, bench, methods, tasks, doctor, report,
serve, probe.

Heavy imports (torch) happen inside the commands so ``rlscope --help`` answers at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from rlscope.config import TrainConfig

COMMANDS_HELP = """usage: rlscope COMMAND [OPTIONS]

Observable RL post-training for language-model policies.

commands:
  train     train one method on one task (`rlscope train --help` lists every option)
  sft       supervised warm start on a task's pairs or a JSONL file (`rlscope sft --help`)
  rm        train a reward model on a task's preference pairs (`rlscope rm --help`)
  sweep     run a TOML manifest of runs × seeds in parallel and aggregate (`rlscope sweep --help`)
  demo      train reinforce, grpo and dg on token_reversal on CPU and compare them (~1 min)
  bench     sampler / learner / loop throughput as JSON (`rlscope bench --help`)
  methods   list the update-rule presets and their components
  tasks     list the tasks and their options
  doctor    diagnose a run directory or a verl / TRL / W&B / tinker log (`rlscope doctor --help`)
  report    a self-contained HTML report and figures for a run or sweep (`rlscope report --help`)
  serve     a local Tinker-compatible server for the tinker SDK (`rlscope serve --help`)
  probe     a measurement that is not a training run: writes NAME.csv and summary.md
            (`rlscope probe --help` lists the probes)

options (before or after COMMAND):
  --debug   show the full traceback of an error (otherwise one line: `error: ...`)

exit codes: 0 success, 1 error while running, 2 invalid configuration or usage
"""


def _tyro_parse(cls: type, args: list[str], prog: str) -> object:
    import tyro

    return tyro.cli(cls, args=args, prog=prog, config=(tyro.conf.OmitArgPrefixes,),
                    use_underscores=True)


def _train_parse(args: list[str], defaults: TrainConfig) -> TrainConfig:
    """``args`` parsed over ``defaults`` (a step kind's own defaults, `StepKind.defaults`)."""
    import tyro

    from rlscope.config import TrainConfig

    return tyro.cli(TrainConfig, args=args, prog="rlscope train", default=defaults,
                    config=(tyro.conf.OmitArgPrefixes,), use_underscores=True)


def cmd_train(args: list[str]) -> int:
    from rlscope.config import ConfigError, TrainConfig, validate
    from rlscope.seeds import run_seeds
    from rlscope.steps import ROLLOUT, validate_run, with_kind_defaults

    cfg = _tyro_parse(TrainConfig, args, "rlscope train")
    assert isinstance(cfg, TrainConfig)
    cfg = with_kind_defaults(cfg, lambda defaults: _train_parse(args, defaults))
    try:
        kind = validate_run(cfg)
    except ConfigError as e:
        _print_error(str(e))
        return 2
    from rlscope import distributed

    if cfg.run.nproc < 1:
        _print_error(f"run.nproc={cfg.run.nproc}: give 1 or more processes")
        return 2
    if (cfg.run.nproc > 1 or distributed.launched()) and cfg.run.jobs > 1:
        _print_error(f"run.jobs={cfg.run.jobs}: data parallel runs one seed at a time over its "
                     "ranks: drop --jobs (or --nproc)")
        return 2
    layout = distributed.check_layout(validate(cfg)[2].num_prompts, cfg.run.nproc) \
        if kind == ROLLOUT else []
    if layout and not distributed.launched():  # refused before any process starts
        _print_error(layout[0])
        return 2
    if cfg.run.nproc > 1 and not distributed.launched():  # relaunch through torchrun
        import subprocess

        return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc_per_node", str(cfg.run.nproc), "-m", "rlscope.cli",
                                "train", *_without_option(args, "--nproc")])
    table = Table(title=f"{cfg.method} on {cfg.task}")
    from rlscope.files import CheckpointError

    try:
        results = run_seeds(cfg)
    except (ConfigError, CheckpointError) as e:  # found by train: --resume, --init checks
        _print_error(str(e))
        return 2
    if distributed.launched():
        distributed.shutdown()
        if int(os.environ.get("RANK", "0")) != 0:  # rank 0 reports the run
            return 0
    # vector_pareto has no test error: its table shows best@1 and best@9 (COMPANIONS.md §2)
    scores = ["best@1", "best@9"] if any("eval/best@1" in r.final_eval for r in results) \
        else ["test_error"]
    for col in ("seed", "status", *scores, "entropy", "wall s", "run dir"):
        table.add_column(col)
    for result in results:
        if result.reason:
            Console(stderr=True, highlight=False, soft_wrap=True).print(
                f"seed {result.seed} {result.status}: {escape(result.reason)}")
        final = result.final_eval
        table.add_row(str(result.seed), result.status,
                      *(f"{final.get(f'eval/{col}', float('nan')):.4f}" for col in scores),
                      f"{final.get('eval/entropy', float('nan')):.4f}",
                      f"{result.wall_time_s:.1f}", str(result.run_dir))
    Console().print(table)
    return 0


def _without_option(args: list[str], name: str) -> list[str]:
    """``args`` without ``name VALUE`` / ``name=VALUE`` (torchrun's parser would take
    ``--nproc`` for its own ``--nproc-per-node``; under torchrun its count is used)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(f"{name}="):
            out.append(arg)
    return out


def cmd_sft(args: list[str]) -> int:
    from rlscope.supervised.rlm_sft import RLM_TASK, rlm_sft, rlm_sft_errors
    from rlscope.supervised.sft import SftConfig, sft, validate_sft

    cfg = _tyro_parse(SftConfig, args, "rlscope sft")
    assert isinstance(cfg, SftConfig)
    rlm = cfg.task == RLM_TASK  # the tree step's warm start (no Task object)
    if _report_errors(rlm_sft_errors(cfg) if rlm else validate_sft(cfg)):
        return 2
    result = rlm_sft(cfg) if rlm else sft(cfg)
    _start_end_table(f"sft on {cfg.task}", result.evals, {
        "heldout loss": "sft/heldout_loss", "test_error": "eval/test_error"})
    Console().print(f"wrote {result.out_dir} in {result.wall_time_s:.1f} s; continue with "
                    f"rlscope train --task {cfg.task} --init {result.out_dir}")
    return 0


def cmd_rm(args: list[str]) -> int:
    from rlscope.supervised.rm import RmConfig, train_rm, validate_rm

    cfg = _tyro_parse(RmConfig, args, "rlscope rm")
    assert isinstance(cfg, RmConfig)
    if _report_errors(validate_rm(cfg)):
        return 2
    from rlscope.files import CheckpointError

    try:
        result = train_rm(cfg)
    except CheckpointError as e:  # --init refused (unsafe, truncated or corrupt)
        _report_errors([str(e)])
        return 2
    _start_end_table(f"reward model on {cfg.task}", result.evals, {
        "held-out loss": "rm/heldout_loss", "held-out accuracy": "rm/heldout_accuracy",
        "probe accuracy": "rm/probe_accuracy"})
    Console().print(f"wrote {result.out_dir} in {result.wall_time_s:.1f} s; continue with "
                    f"rlscope train --task {cfg.task} --rm_path {result.out_dir}")
    return 0


def _report_errors(errors: list[str]) -> bool:
    """Print a configuration's problems to stderr; True when there are any."""
    if errors:
        _print_error("invalid configuration:\n  - " + "\n  - ".join(errors))
    return bool(errors)


def _print_error(message: str) -> None:
    """``error: message`` on stderr, in red on a terminal; never wrapped (each problem stays
    on one line) and never read as rich markup (``rlscope[hf]`` survives)."""
    Console(stderr=True, soft_wrap=True, highlight=False).print(
        f"[red]error:[/red] {escape(message)}")


def _start_end_table(title: str, evals: list[dict[str, float]], columns: dict[str, str]
                     ) -> None:
    """The first and last evaluation of a supervised job, one column per metric (only the
    last when it evaluated once, e.g. with --eval_every 0)."""
    table = Table(title=title)
    for col in ("", *columns):
        table.add_column(col)
    rows = [("start", evals[0]), ("end", evals[-1])] if len(evals) > 1 else \
        [("end", evals[-1] if evals else {})]
    for label, row in rows:
        table.add_row(label, *(f"{row.get(k, float('nan')):.4f}" for k in columns.values()))
    Console().print(table)


def cmd_demo(args: list[str]) -> int:
    from rlscope.checks import job_errors
    from rlscope.demo import DemoConfig, demo_errors, run_demo

    cfg = _tyro_parse(DemoConfig, args, "rlscope demo")
    assert isinstance(cfg, DemoConfig)
    if _report_errors(job_errors(cfg) + demo_errors(cfg)):
        return 2
    run_demo(cfg, Console())
    return 0


def cmd_bench(args: list[str]) -> int:
    from rlscope.bench import BenchConfig, run_bench
    from rlscope.checks import job_errors

    cfg = _tyro_parse(BenchConfig, args, "rlscope bench")
    assert isinstance(cfg, BenchConfig)
    if _report_errors(job_errors(cfg)):
        return 2
    run_bench(cfg)
    return 0


def cmd_methods(args: list[str]) -> int:
    from rlscope.methods.catalog import describe, render_list

    if args and args[0] in ("-h", "--help"):
        sys.stdout.write("usage: rlscope methods [NAME]\n\nWithout NAME, list every "
                         "update-rule preset with its components. With NAME (case-"
                         "insensitive; CamelCase aliases work), show that preset in full:\n"
                         "components, the settings each reads with their flags, source and "
                         "valid regime.\n")
        return 0
    if args:
        try:
            sys.stdout.write(describe(args[0]))
        except ValueError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
        return 0
    sys.stdout.write(render_list())
    return 0


def cmd_doctor(args: list[str]) -> int:
    from rlscope.doctor.command import DoctorCommand, run

    cmd = _tyro_parse(DoctorCommand, args, "rlscope doctor")
    assert isinstance(cmd, DoctorCommand)
    return run(cmd)


def cmd_report(args: list[str]) -> int:
    from rlscope.report.command import ReportCommand, run

    cmd = _tyro_parse(ReportCommand, args, "rlscope report")
    assert isinstance(cmd, ReportCommand)
    return run(cmd)


def cmd_serve(args: list[str]) -> int:
    from rlscope.checks import device_errors, field_errors
    from rlscope.serve.command import run
    from rlscope.serve.config import ServeConfig

    cfg = _tyro_parse(ServeConfig, args, "rlscope serve")
    assert isinstance(cfg, ServeConfig)
    if _report_errors(field_errors(cfg) + device_errors(cfg.device, "device")):
        return 2
    return run(cfg)


def cmd_sweep(args: list[str]) -> int:
    from rlscope.sweep.command import SweepCommand, run

    cmd = _tyro_parse(SweepCommand, args, "rlscope sweep")
    assert isinstance(cmd, SweepCommand)
    return run(cmd)


def cmd_tasks(args: list[str]) -> int:
    from rlscope.tasks import TASKS, TaskConfig, make_task

    table = Table(title="tasks (rlscope train --task NAME; details in docs/tasks.md)")
    for col in ("task", "family", "what it is", "options"):
        table.add_column(col)
    for name in TASKS:
        task = make_task(name, TaskConfig())
        doc = " ".join((task.__doc__ or "").strip().split("\n\n")[0].split())
        table.add_row(name, task.family, doc, " ".join(f"--{o}" for o in task.options))
    from rlscope.steps import STEPS

    for kind, record in STEPS.items():  # the tasks of the other step kinds
        for name, summary in record.tasks.items():
            table.add_row(name, f"{kind} step", summary, "")
    Console().print(table)
    return 0


def cmd_probe(args: list[str]) -> int:
    from rlscope.probes import PROBES, run_probe

    if not args or args[0] in ("-h", "--help") or args[0] not in PROBES:
        usage = ("usage: rlscope probe NAME [OPTIONS]\n\nMeasurements that are not training "
                 "runs; each writes <out_dir>/NAME.csv (a row per seed and setting) and "
                 "summary.md. `rlscope probe NAME --help` lists a probe's options.\n\nprobes:\n"
                 + "".join(f"  {n:<20}{p.description}\n" for n, p in PROBES.items()))
        if args and args[0] in ("-h", "--help"):
            sys.stdout.write(usage)
            raise SystemExit(0)
        if args:
            _print_error(f"unknown probe {args[0]!r}; valid probes: {', '.join(PROBES)}")
        else:
            sys.stderr.write(usage)
        return 2
    cfg = _tyro_parse(PROBES[args[0]].config, args[1:], f"rlscope probe {args[0]}")
    try:
        result, csv_path, summary_path = run_probe(args[0], cfg)  # type: ignore[arg-type]
    except ValueError as e:
        _print_error(str(e))
        return 2
    sys.stdout.write(summary_path.read_text())
    sys.stdout.write(f"\n{len(result.rows)} rows: {csv_path}; summary: {summary_path}\n")
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": cmd_train, "sft": cmd_sft, "rm": cmd_rm, "demo": cmd_demo, "bench": cmd_bench,
    "methods": cmd_methods, "tasks": cmd_tasks, "doctor": cmd_doctor, "report": cmd_report,
    "sweep": cmd_sweep, "serve": cmd_serve, "probe": cmd_probe,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; an exception it raises becomes one line ``error: Type: message`` on
    stderr (exit code 2 for an invalid configuration or a missing optional module, 1 for any
    other error), or its traceback with ``--debug``."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(COMMANDS_HELP)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        sys.stderr.write(f"rlscope: unknown command {argv[0]!r}\n\n{COMMANDS_HELP}")
        return 2
    if debug:
        return COMMANDS[argv[0]](argv[1:])
    try:
        return COMMANDS[argv[0]](argv[1:])
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except Exception as e:
        return _report_exception(e)


def _report_exception(error: Exception) -> int:
    """Print ``error`` as `main` describes; returns the exit code."""
    from rlscope.checks import install_hint

    hint = " (run again with --debug for the traceback)"
    config = sys.modules.get("rlscope.config")  # loaded whenever it raised its ConfigError
    if config is not None and isinstance(error, config.ConfigError):
        _print_error(str(error))
        return 2
    if isinstance(error, ModuleNotFoundError):
        _print_error(install_hint(error) + hint)
        return 2
    message = " ".join(str(error).split()) or "(no message)"
    _print_error(f"{type(error).__name__}: {message}{hint}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
