"""``rlscope sweep MANIFEST.toml``: options and the command itself."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro
from rich.console import Console
from rich.markup import escape

from rlscope.sweep.manifest import Manifest, ManifestError, load_manifest, name_problem
from rlscope.sweep.plan import safe_plan
from rlscope.sweep.processes import OutputLock, SweepInterrupted, SweepLocked
from rlscope.sweep.runner import (
    SweepOptions,
    SweepResult,
    backend_problem,
    run_sweep,
    with_threads,
)


@dataclass(frozen=True)
class SweepCommand:
    """Run a manifest of runs (named runs × grid points × seeds) and aggregate the results:
    results.csv / results.parquet (tidy), final.md (mean ± sd over seeds), crossings.md and
    curves.csv. Finished runs are skipped, so running a killed sweep again resumes it."""

    manifest: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="MANIFEST.toml")] = ""
    """The TOML manifest (format: docs/training.md, "Sweeps"); or use --builtin."""
    builtin: str = ""
    """A manifest that ships with rlscope instead of a file: evidence (the sandbox's standard
    experiment matrix, docs/evidence/README.md) or rules2026 (each 2025-26 rule beside its
    parent, docs/evidence/rules2026/README.md)."""
    jobs: int = 1
    """Worker processes running runs in parallel (--backend process; with ray it only sets the
    default --threads, cores / jobs)."""
    backend: Literal["process", "ray"] = "process"
    """Where runs execute: process (this process, or --jobs worker processes) or ray (each run
    a Ray task asking for --threads CPUs and, on device cuda, one GPU; needs
    pip install -e '.[ray]'; docs/scaling.md)."""
    address: str = ""
    """With --backend ray: the Ray cluster to join (auto, host:6379 or ray://host:10001); it is
    left running. Empty: start a local cluster for the sweep and shut it down after."""
    threads: int = 0
    """CPU threads for torch per run; 0 = the manifest's threads if set, else cores / jobs."""
    dry_run: bool = False
    """Validate the manifest and print the expanded runs (id, seed, directory, plan and the
    equivalent `rlscope train` command); run nothing."""
    output: str = ""
    """The sweep directory (default: the manifest's [sweep] output, else sweeps/<name>)."""
    name: str = ""
    """The sweep's name (default: the manifest's [sweep] name, else its file name): letters,
    digits, '_', '-', '.' and '+', not only dots."""
    report: bool = True
    """After aggregating, write figures/ and report.html into the sweep directory (needs
    matplotlib, in the base install)."""


BUILTIN = Path(__file__).parent / "builtin"


def manifest_path(cmd: SweepCommand) -> Path:
    """The manifest file of ``cmd`` (ValueError saying what to pass when it names none)."""
    if bool(cmd.manifest) == bool(cmd.builtin):
        raise ValueError("give either a MANIFEST.toml or --builtin NAME")
    if cmd.builtin:
        path = BUILTIN / f"{cmd.builtin}.toml"
        if not path.exists():
            names = ", ".join(sorted(p.stem for p in BUILTIN.glob("*.toml")))
            raise ValueError(f"--builtin {cmd.builtin!r} is unknown; built-in manifests: {names}")
        return path
    return Path(cmd.manifest)


def dry_run(manifest: Manifest, options: SweepOptions) -> str:
    """The expanded runs as text: per run its id, seed, directory, what a real invocation would
    do with it, and the equivalent train command."""
    specs = with_threads(manifest.runs, options)
    ids = list(dict.fromkeys(s.id for s in specs))
    lines = [f"sweep {manifest.name}: {len(specs)} runs ({len(ids)} ids × "
             f"{len(manifest.seeds)} seeds) → {manifest.output}", ""]
    for spec in specs:
        plan, reason = safe_plan(spec)
        lines += [f"{spec.id}  seed {spec.seed}  {spec.run_dir}  [{plan}"
                  + (f": {reason}" if reason else "") + "]", f"  {spec.command_line}"]
    return "\n".join(lines) + "\n"


def run(cmd: SweepCommand) -> int:
    """0 when every run finished, 1 when some failed, 2 for an unusable manifest."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if cmd.jobs < 1 or cmd.threads < 0:
        err.print("[red]error:[/red] --jobs must be >= 1 and --threads >= 0")
        return 2
    if cmd.name and name_problem(cmd.name):
        err.print(f"[red]error:[/red] --name {escape(repr(cmd.name))}: "
                  f"{escape(name_problem(cmd.name))}")
        return 2
    try:
        manifest = load_manifest(manifest_path(cmd), cmd.output or None, cmd.name)
    except ValueError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        return 2
    except ManifestError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        return 2
    options = SweepOptions(jobs=cmd.jobs, threads=cmd.threads, backend=cmd.backend,
                           address=cmd.address)
    if problem := backend_problem(manifest, options):
        err.print(f"[red]error:[/red] {escape(problem)}")
        return 2
    if cmd.dry_run:
        sys.stdout.write(dry_run(manifest, options))
        return 0
    out = Console(highlight=False, soft_wrap=True)
    t0 = time.perf_counter()
    lock = OutputLock(manifest.output)
    try:
        lock.acquire()
    except (SweepLocked, ValueError) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        return 2
    how = f"{cmd.jobs} job(s)" if cmd.backend == "process" else \
        f"on Ray ({cmd.address or 'local cluster'})"
    out.print(f"sweep {manifest.name}: {len(manifest.runs)} runs, {how} → {manifest.output}")
    try:
        result = run_sweep(manifest, options, lambda line: out.print(escape(line)), lock)
        return summarize(cmd, manifest, result, out, time.perf_counter() - t0)
    except SweepInterrupted as e:
        err.print(f"\nsweep {manifest.name}: stopped by {e}; the runs in progress were "
                  f"stopped (see {manifest.output / 'sweep.json'}); run the same command "
                  "again to resume")
        return 128 + e.signum
    finally:
        lock.release()


def summarize(cmd: SweepCommand, manifest: Manifest, result: SweepResult, out: Console,
              seconds: float) -> int:
    """Print a finished sweep's summary and tables, write its report (``--report``); the exit
    status: 1 when some run failed, else 0."""
    agg = result.aggregate
    out.print(f"\nsweep {manifest.name}: {result.count('completed')} completed, "
              f"{result.count('out_of_regime')} out of regime, {result.skipped} skipped, "
              f"{len(result.failed)} failed in {seconds:.1f}s")
    for r in result.failed:
        out.print(f"  [red]failed[/red] {escape(r.run)}: {escape(r.error)}")
    out.print("")
    out.print(escape((manifest.output / "final.md").read_text(encoding="utf-8")))
    out.print("wrote " + ", ".join(str(p) for p in agg.files) + f" ({agg.rows} tidy rows)")
    if agg.parquet_note:
        out.print(f"no results.parquet: {escape(agg.parquet_note)}")
    if cmd.report and agg.rows:
        try:
            from rlscope.report.build import build_report
        except ImportError as e:  # matplotlib missing
            out.print(escape(f"no report: {e} (pip install matplotlib)"))
        else:
            built = build_report(manifest.output)
            out.print(f"wrote {built.html} and {len(built.figures)} figures in "
                      f"{manifest.output / 'figures'}")
    return 1 if result.failed else 0
