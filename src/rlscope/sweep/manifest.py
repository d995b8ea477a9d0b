"""Sweep manifests: a TOML file of named runs × grid points × seeds, checked before anything runs.

```toml
[sweep]
name = "demo"                 # output defaults to sweeps/<name>
seeds = [0, 1, 2]             # or num_seeds = 3 (seeds 0..2)

[defaults]                    # rlscope train options shared by every run
task = "token_reversal"
num_steps = 100

[runs.grpo]
method = "grpo"
inner_epochs = 4

[runs.filtered_dg]
method = "filtered_dg"
grid = { filter_tau = [0.5, 0.3, 0.2] }   # the cartesian product over every listed option
```

A run's options are exactly `rlscope train`'s flags without the dashes, so every train option
works here. Each is turned into train flags (``true`` → ``--flag``, ``false`` → ``--no_flag``
for switches; arrays → several values) and parsed by the same tyro parser as
`rlscope train`, then checked by `rlscope.steps.validate_run`. Every problem of the whole manifest
(unknown keys with close names suggested, bad values, configurations `validate` rejects) is
collected into one `ManifestError` before any run starts.

Expansion gives one `RunSpec` per (named run × grid point × seed): id
``<run>[-<option>=<value>...]`` (grid options in the order listed) and run directory
``<output>/runs/<id>_s<seed>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import io
import itertools
import re
import shlex
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from rlscope.config import ConfigError, TrainConfig
from rlscope.steps import validate_run, with_kind_defaults
from rlscope.sweep.aggregate import DEFAULT_CROSSINGS, CrossingSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SECTIONS = ("sweep", "defaults", "runs")
SWEEP_KEYS = ("name", "description", "seeds", "num_seeds", "output", "final_metrics",
              "crossings", "band")
BANDS = ("sem", "std")
"""``[sweep] band``: the figures' ribbon, mean ± SEM (default) or mean ± sd across seeds (the
companions' figures, COMPANIONS.md §1); `rlscope.report.build` reads it from the sweep's
``manifest.toml``."""
CROSSING_KEYS = ("metric", "threshold", "direction")
RESERVED = {
    "seed": "list the seeds in [sweep] seeds (or num_seeds)",
    "num_seeds": "list the seeds in [sweep] seeds (or num_seeds)",
    "jobs": "use `rlscope sweep --jobs`",
    "runs_dir": "the sweep writes runs under <output>/runs: set [sweep] output",
    "name": "the sweep names each run directory <id>_s<seed>",
    "resume": "the sweep resumes unfinished runs by itself",
    "output": "the sweep writes results.csv itself",
    "progress": "the sweep shows one line per finished run instead",
}
"""Train options the sweep sets itself, with what to do instead."""
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
NAME_RULE = "use letters, digits, '_', '-', '.' or '+' (not only dots), at most 200 characters"
"""What `name_problem` accepts, as said in its messages."""


def name_problem(name: object) -> str:
    """Why ``name`` cannot name a sweep, a run or a directory inside the output ("" if it
    can): one path component that stays where it is put, so no ``/`` or ``\\``, no absolute
    path, no ``.`` or ``..``."""
    if not isinstance(name, str) or not name:
        return f"must be a non-empty string; {NAME_RULE}"
    if len(name) > 200 or not _NAME.match(name) or not name.strip("."):
        return NAME_RULE
    return ""


class ManifestError(ValueError):
    """A manifest that cannot run; ``problems`` lists every one found."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        if len(problems) == 1:  # one line
            super().__init__(f"{source}: {problems[0]}")
        else:
            super().__init__(f"{source}: {len(problems)} problems:\n"
                             + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: a named run at one grid point with one seed."""

    id: str
    """``<run>`` or ``<run>-<option>=<value>...``: what seeds are aggregated over."""
    entry: str
    """The ``[runs.<entry>]`` table it comes from."""
    seed: int
    """The run's seed."""
    run_dir: Path
    """``<output>/runs/<id>_s<seed>``."""
    grid_point: tuple[tuple[str, Any], ...]
    """The grid options and their values at this point (empty without a grid)."""
    argv: tuple[str, ...]
    """The `rlscope train` flags that give exactly this run."""
    config: TrainConfig
    """The parsed configuration (progress off, run directory and seed set)."""

    @property
    def run(self) -> str:
        """The run directory's name, ``<id>_s<seed>``."""
        return self.run_dir.name

    @property
    def command_line(self) -> str:
        """The equivalent `rlscope train` command."""
        return shlex.join(["rlscope", "train", *self.argv])

    def with_threads(self, threads: int) -> RunSpec:
        """The same run with ``threads`` CPU threads for torch."""
        return dataclasses.replace(
            self, argv=(*self.argv, "--threads", str(threads)),
            config=dataclasses.replace(self.config, run=dataclasses.replace(
                self.config.run, threads=threads)))


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated, expanded manifest."""

    name: str
    """The sweep's name."""
    description: str
    """Free text recorded in sweep.json."""
    source: str
    """Where the manifest came from (its path)."""
    text: str
    """The manifest as written (copied to ``<output>/manifest.toml``)."""
    output: Path
    """The sweep directory: runs, results and tables go under it."""
    seeds: tuple[int, ...]
    """The seeds every grid point runs with."""
    final_metrics: tuple[str, ...] | None
    """Metrics of the final table (None: every evaluation metric)."""
    crossings: tuple[CrossingSpec, ...]
    """Thresholds to report first-crossing steps for."""
    runs: tuple[RunSpec, ...]
    """Every run: named runs in manifest order, then grid points, then seeds."""


# ----------------------------------------------------------------------------- train flags


@functools.cache
def train_options() -> dict[str, Any]:
    """Every `rlscope train` flag name (without dashes) and its type."""

    def leaves(cls: type) -> dict[str, Any]:
        hints = typing.get_type_hints(cls)
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            out |= leaves(kind) if isinstance(kind, type) and dataclasses.is_dataclass(kind) \
                else {f.name: kind}
        return out

    return leaves(TrainConfig)


def _token(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def option_argv(key: str, value: Any) -> list[str]:
    """The train flags for one manifest option; raises ValueError for a value TOML can hold
    but a flag cannot (a table, a date, a non-boolean for a switch)."""
    kind = train_options()[key]
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expects true or false, not {value!r}")
        return [f"--{key}" if value else f"--no_{key}"]
    values = value if isinstance(value, list) else [value]
    for v in values:
        if not isinstance(v, bool | int | float | str):
            raise ValueError(f"expects a number, string, boolean or array of them, not "
                             f"{type(v).__name__} {v!r}")
    return [f"--{key}", *(_token(v) for v in values)]


def _tyro_message(text: str) -> str:
    """The gist of a tyro error box: the lines between its title and the help text."""
    lines = [line.strip().strip("│╭╮╰╯─").strip() for line in text.splitlines()]
    lines = [line for line in lines if line and set(line) - set("-─")]
    gist = []
    for line in lines[1:]:
        if line.startswith(("Argument helptext", "For full helptext")):
            break
        gist.append(line)
    return " ".join(gist) or text.strip()


def _parse_train(argv: list[str]) -> tuple[TrainConfig | None, str]:
    """Parse train flags as `rlscope train` does; ``(config, "")`` or ``(None, error)``."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            cfg = tyro.cli(TrainConfig, args=argv, prog="rlscope train",
                           config=(tyro.conf.OmitArgPrefixes,), use_underscores=True)
            # a step kind's own defaults (VPO's 500 steps, lr 3e-3, ...) under the given flags
            cfg = with_kind_defaults(cfg, lambda defaults: tyro.cli(
                TrainConfig, args=argv, prog="rlscope train", default=defaults,
                config=(tyro.conf.OmitArgPrefixes,), use_underscores=True))
    except SystemExit:
        return None, _tyro_message(captured.getvalue())
    return cfg, ""


# ------------------------------------------------------------------------------- parsing


def _suggest(key: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(candidates), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _fmt(value: Any) -> str:
    """A value as it appears in a run id (directory-safe)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(_fmt(v) for v in value)
    return re.sub(r"[\s/\\\x00]", "_", _token(value))


@dataclass
class _Options:
    """A run's options and grid, each key remembering the table it came from."""

    values: dict[str, tuple[Any, str]]
    grid: dict[str, tuple[list[Any], str]]


def _read_options(table: dict[str, Any], where: str, problems: list[str],
                  base: _Options | None = None) -> _Options:
    """Check one options table (``[defaults]`` or ``[runs.X]``) and lay it over ``base``."""
    opts = _Options(dict(base.values), dict(base.grid)) if base else _Options({}, {})
    known = train_options()
    grid = table.get("grid", {})
    if not isinstance(grid, dict):
        problems.append(f"[{where}] grid must be a table of arrays, e.g. grid = "
                        "{ filter_tau = [0.5, 0.3] }")
        grid = {}
    entries = [(k, v, where) for k, v in table.items() if k != "grid"]
    entries += [(k, v, f"{where}.grid") for k, v in grid.items()]
    for key in set(table) & set(grid):
        problems.append(f"[{where}] {key} is both an option and a grid option; keep one")
    for key, value, source in entries:
        if key in RESERVED:
            problems.append(f"[{source}] {key}: set by the sweep; {RESERVED[key]}")
            continue
        if key not in known:
            problems.append(f"[{source}] {key}: not an `rlscope train` option"
                            f"{_suggest(key, [*(set(known) - set(RESERVED)), 'grid'])}")
            continue
        if source.endswith(".grid"):
            if not isinstance(value, list) or not value:
                problems.append(f"[{source}] {key} must be a non-empty array of values")
                continue
            points = value
        else:
            points = [value]
        bad = False
        for point in points:
            try:
                option_argv(key, point)
            except ValueError as e:
                problems.append(f"[{source}] {key} = {point!r}: {e}")
                bad = True
        if bad:
            continue
        if source.endswith(".grid"):
            opts.values.pop(key, None)
            opts.grid[key] = (value, source)
        else:
            opts.grid.pop(key, None)
            opts.values[key] = (value, source)
    return opts


def _read_sweep(table: Any, default_name: str, problems: list[str]
                ) -> tuple[str, str, str, tuple[int, ...], tuple[str, ...] | None,
                           tuple[CrossingSpec, ...]]:
    """``[sweep]``: name, description, output, seeds, final metrics, crossings."""
    if not isinstance(table, dict):
        problems.append("[sweep] must be a table")
        table = {}
    for key in table:
        if key not in SWEEP_KEYS:
            problems.append(f"[sweep] {key}: unknown key{_suggest(key, SWEEP_KEYS)}; valid "
                            f"keys: {', '.join(SWEEP_KEYS)}")
    name = table.get("name", default_name)
    if name_problem(name):
        problems.append(f"[sweep] name = {name!r}: {name_problem(name)}"
                        if "name" in table else
                        f"the manifest's file name gives the sweep name {name!r}, which "
                        f"cannot name a folder: set [sweep] name ({NAME_RULE})")
        name = "sweep"
    description = str(table.get("description", ""))
    if table.get("band", "sem") not in BANDS:
        problems.append(f"[sweep] band = {table['band']!r}: use \"sem\" (mean ± standard error, "
                        "the default) or \"std\" (mean ± sd across seeds)")
    output = table.get("output", f"sweeps/{name}")
    if not isinstance(output, str) or not output:
        problems.append(f"[sweep] output = {output!r} must be a folder path")
        output = f"sweeps/{name}"
    seeds: tuple[int, ...] = (0,)
    if "seeds" in table and "num_seeds" in table:
        problems.append("[sweep] give seeds or num_seeds, not both")
    elif "seeds" in table:
        raw = table["seeds"]
        if (not isinstance(raw, list) or not raw
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                           for s in raw)):
            problems.append(f"[sweep] seeds = {raw!r} must be a non-empty array of "
                            "non-negative integers")
        elif len(set(raw)) != len(raw):
            problems.append(f"[sweep] seeds = {raw!r} repeats a seed")
        else:
            seeds = tuple(raw)
    elif "num_seeds" in table:
        n = table["num_seeds"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            problems.append(f"[sweep] num_seeds = {n!r} must be an integer >= 1")
        else:
            seeds = tuple(range(n))
    final_metrics = table.get("final_metrics")
    if final_metrics is not None and (not isinstance(final_metrics, list) or not all(
            isinstance(m, str) for m in final_metrics)):
        problems.append(f"[sweep] final_metrics = {final_metrics!r} must be an array of "
                        "metric names")
        final_metrics = None
    crossings: list[CrossingSpec] = []
    raw_crossings = table.get("crossings")
    if raw_crossings is not None:
        if not isinstance(raw_crossings, list):
            raw_crossings = [raw_crossings]
        for c in raw_crossings:
            if not isinstance(c, dict) or set(c) - set(CROSSING_KEYS) or not isinstance(
                    c.get("metric"), str) or not isinstance(c.get("threshold"), int | float) \
                    or c.get("direction", "<=") not in ("<=", ">="):
                problems.append(f"[sweep] crossings entry {c!r} must be a table "
                                "{ metric = \"eval/...\", threshold = NUMBER, direction = "
                                "\"<=\" or \">=\" }")
                continue
            crossings.append(CrossingSpec(c["metric"], float(c["threshold"]),
                                          c.get("direction", "<=")))
    return (name, description, output, seeds,
            None if final_metrics is None else tuple(final_metrics),
            tuple(crossings) if raw_crossings is not None else DEFAULT_CROSSINGS)


def _config_problems(error: ConfigError) -> list[str]:
    text = str(error)
    head = "invalid configuration:"
    if text.startswith(head):
        return [line.strip()[2:] for line in text[len(head):].splitlines() if line.strip()]
    return [text]


def _check_point(values: dict[str, tuple[Any, str]], where: str, problems: list[str]
                 ) -> tuple[list[str], TrainConfig | None]:
    """Parse and validate one grid point's options: its train flags and config, or ``None``
    with the problems recorded. An option tyro rejects is reported against the table it came
    from, and the rest are still validated so that one pass finds every problem."""
    argv = [tok for k, (v, _) in values.items() for tok in option_argv(k, v)]
    cfg, error = _parse_train(argv)
    if cfg is None:
        rejected = {}
        for key, (value, source) in values.items():
            _, one = _parse_train(option_argv(key, value))
            if one:
                rejected[key] = f"[{source}] {key} = {value!r}: " \
                    + one.removeprefix(f"Error parsing --{key}: ")
        problems += list(rejected.values()) or [f"{where}: {error}"]
        rest = {k: v for k, v in values.items() if k not in rejected}
        if rejected:
            _check_point(rest, where, problems)
        return argv, None
    try:
        validate_run(cfg)
    except ConfigError as e:
        problems += [f"{where}: {p}" for p in _config_problems(e)]
        return argv, None
    return argv, cfg


def parse_manifest(text: str, source: str = "<manifest>", output: str | Path | None = None,
                   default_name: str = "sweep", name: str = "") -> Manifest:
    """Parse, check and expand a manifest's text; raise `ManifestError` with every problem.
    ``output`` overrides ``[sweep] output``; ``name`` overrides ``[sweep] name``;
    ``default_name`` names a sweep without either."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(source, [f"not valid TOML: {e}"]) from None
    problems: list[str] = []
    for key in doc:
        if key not in SECTIONS:
            problems.append(f"[{key}]: unknown section{_suggest(key, SECTIONS)}; valid "
                            f"sections: {', '.join(f'[{s}]' for s in SECTIONS)}")
    sweep_table = doc.get("sweep", {})
    if name:
        if name_problem(name):
            problems.append(f"--name {name!r}: {name_problem(name)}")
        elif isinstance(sweep_table, dict):
            sweep_table = {**sweep_table, "name": name}
    name, description, out, seeds, final_metrics, crossing_specs = _read_sweep(
        sweep_table, default_name, problems)
    output_dir = Path(output) if output else Path(out)
    defaults_table = doc.get("defaults", {})
    if not isinstance(defaults_table, dict):
        problems.append("[defaults] must be a table of train options")
        defaults_table = {}
    defaults = _read_options(defaults_table, "defaults", problems)
    runs_table = doc.get("runs", {})
    if not isinstance(runs_table, dict) or not runs_table:
        problems.append("no runs: add at least one [runs.<name>] table")
        runs_table = {}
    specs: list[RunSpec] = []
    ids: dict[str, str] = {}
    for entry, table in runs_table.items():
        where = f"runs.{entry}"
        if not isinstance(table, dict):
            problems.append(f"[runs] {entry} = {table!r}: each run is a table, "
                            f"[runs.{entry}]")
            continue
        if name_problem(entry):
            problems.append(f"[{where}]: run names must {NAME_RULE}")
            continue
        opts = _read_options(table, where, problems, defaults)
        grid_keys = list(opts.grid)
        for combo in itertools.product(*(opts.grid[k][0] for k in grid_keys)):
            point = tuple(zip(grid_keys, combo, strict=True))
            run_id = "-".join([entry, *(f"{k}={_fmt(v)}" for k, v in point)])
            label = f"[{where}]" + (f" at {', '.join(f'{k}={v!r}' for k, v in point)}"
                                    if point else "")
            if run_id in ids:
                problems.append(f"{label}: run id {run_id!r} repeats that of {ids[run_id]}")
                continue
            ids[run_id] = label
            values = dict(opts.values)
            values |= {k: (v, opts.grid[k][1]) for k, v in point}
            argv, cfg = _check_point(values, label, problems)
            if cfg is None:
                continue
            if len(f"{run_id}_s{max(seeds)}".encode()) > 255:
                problems.append(f"{label}: run id {run_id[:40]!r}... is too long for a "
                                "directory name; shorten the run name or the grid values")
                continue
            for seed in seeds:
                run_dir = output_dir / "runs" / f"{run_id}_s{seed}"
                if run_dir.parent != output_dir / "runs" or "\x00" in run_dir.name:
                    problems.append(f"{label}: the run directory name {run_dir.name!r} would "
                                    f"leave {output_dir / 'runs'}")
                    continue
                full = [*argv, "--seed", str(seed), "--runs_dir", str(output_dir / "runs"),
                        "--name", run_dir.name, "--no_progress"]
                seeded = dataclasses.replace(cfg, run=dataclasses.replace(
                    cfg.run, seed=seed, runs_dir=str(output_dir / "runs"), name=run_dir.name,
                    progress=False))
                specs.append(RunSpec(run_id, entry, seed, run_dir, point, tuple(full), seeded))
    problems = list(dict.fromkeys(problems))
    if problems:
        raise ManifestError(source, problems)
    return Manifest(name=name, description=description, source=source, text=text,
                    output=output_dir, seeds=seeds, final_metrics=final_metrics,
                    crossings=crossing_specs, runs=tuple(specs))


def load_manifest(path: str | Path, output: str | Path | None = None, name: str = ""
                  ) -> Manifest:
    """Read and expand a manifest file (``name``, else ``[sweep] name``, else its stem made
    directory-safe, names the sweep)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(str(path), [f"cannot read: {e}"]) from None
    return parse_manifest(text, str(path), output,
                          default_name=re.sub(r"[^A-Za-z0-9_.+-]", "_", path.stem), name=name)
