"""Sweep manifests (`rlscope.sweep.manifest`): parsing, grid × seed expansion and ids, the
train flags each option becomes, and every validation error, all reported at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import tyro

from rlscope.config import TrainConfig
from rlscope.sweep.aggregate import DEFAULT_CROSSINGS, CrossingSpec
from rlscope.sweep.manifest import ManifestError, load_manifest, option_argv, parse_manifest

DEFAULTS = """
[defaults]
task = "token_reversal"
num_steps = 3
batch_size = 16
seq_len = 4
eval_batches = 1
eval_batch_size = 16
eval_every = 2
device = "cpu"
"""

DEMO = """
[sweep]
name = "demo"
seeds = [0, 1]
""" + DEFAULTS + """
[runs.grpo]
method = "grpo"
inner_epochs = 4

[runs.filtered_dg]
method = "filtered_dg"
grid = { filter_tau = [0.5, 0.3, 0.2] }
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, "m.toml")
    return info.value.problems


def test_expansion_ids_dirs_and_configs(tmp_path: Path) -> None:
    m = parse_manifest(DEMO, "demo.toml", output=tmp_path / "out")
    assert m.name == "demo" and m.seeds == (0, 1) and m.output == tmp_path / "out"
    # (1 + 3 grid points) × 2 seeds, in manifest order, grid points, then seeds
    assert [(s.id, s.seed) for s in m.runs] == [
        ("grpo", 0), ("grpo", 1),
        ("filtered_dg-filter_tau=0.5", 0), ("filtered_dg-filter_tau=0.5", 1),
        ("filtered_dg-filter_tau=0.3", 0), ("filtered_dg-filter_tau=0.3", 1),
        ("filtered_dg-filter_tau=0.2", 0), ("filtered_dg-filter_tau=0.2", 1)]
    spec = m.runs[5]
    assert spec.run_dir == tmp_path / "out" / "runs" / "filtered_dg-filter_tau=0.3_s1"
    assert spec.entry == "filtered_dg" and spec.grid_point == (("filter_tau", 0.3),)
    cfg = spec.config
    assert cfg.method == "filtered_dg" and cfg.components.filter_tau == 0.3
    assert cfg.run.seed == 1 and cfg.run.name == "filtered_dg-filter_tau=0.3_s1"
    assert cfg.run.runs_dir == str(tmp_path / "out" / "runs") and not cfg.run.progress
    assert cfg.run.num_steps == 3 and cfg.task_options.seq_len == 4
    assert m.runs[0].config.run.inner_epochs == 4 and m.runs[2].config.run.inner_epochs == 1
    assert m.crossings == DEFAULT_CROSSINGS and m.final_metrics is None


def test_the_command_line_gives_the_same_config() -> None:
    """What --dry_run prints is exactly the run: its flags parse to the spec's config."""
    for spec in parse_manifest(DEMO).runs:
        assert spec.command_line.startswith("rlscope train --task token_reversal")
        parsed = tyro.cli(TrainConfig, args=list(spec.argv), use_underscores=True,
                          config=(tyro.conf.OmitArgPrefixes,))
        assert parsed == spec.config


def test_grid_product_and_overrides() -> None:
    text = """
[sweep]
num_seeds = 3
""" + DEFAULTS + """
grid = { lr = [0.001, 0.0003] }
[runs.dg]
method = "dg"
grid = { eta = [1.0, 2.0], batch_size = [16, 32] }
[runs.fixed_lr]
method = "dg"
lr = 0.01
"""
    m = parse_manifest(text)
    assert m.seeds == (0, 1, 2)
    dg = list(dict.fromkeys(s.id for s in m.runs if s.entry == "dg"))
    # 2 lr (from [defaults]) × 2 eta × 2 batch_size grid points, grid options in listed order
    assert len(dg) == 8 and dg[0] == "dg-lr=0.001-eta=1.0-batch_size=16"
    assert dg[-1] == "dg-lr=0.0003-eta=2.0-batch_size=32"
    # a run's plain option replaces the defaults' grid over it
    fixed = [s for s in m.runs if s.entry == "fixed_lr"]
    assert [s.id for s in fixed] == ["fixed_lr"] * 3
    assert all(s.config.optim.lr == 0.01 for s in fixed)
    assert len(m.runs) == (8 + 1) * 3


def test_booleans_arrays_and_strings_become_train_flags() -> None:
    assert option_argv("entropy_diagnostics", True) == ["--entropy_diagnostics"]
    assert option_argv("replay_sampling_mask", False) == ["--no_replay_sampling_mask"]
    assert option_argv("is_geometric", True) == ["--is_geometric", "True"]  # bool | None
    assert option_argv("stop_token_ids", [3, 4]) == ["--stop_token_ids", "3", "4"]
    assert option_argv("lr", 1e-5) == ["--lr", "1e-05"]
    text = DEFAULTS + """
entropy_diagnostics = true
replay_sampling_mask = false
stop_token_ids = [3]
[runs.grpo]
method = "grpo"
"""
    cfg = parse_manifest(text).runs[0].config
    assert cfg.diagnostics.entropy_diagnostics is True
    assert cfg.sampling.replay_sampling_mask is False
    assert cfg.sampling.stop_token_ids == (3,)


def test_seeds_names_and_output_defaults(tmp_path: Path) -> None:
    path = tmp_path / "my_sweep.toml"
    path.write_text(DEFAULTS + "[runs.grpo]\nmethod = \"grpo\"\n")
    m = load_manifest(path)
    # no [sweep]: named after the file, one seed 0, output sweeps/<name>
    assert m.name == "my_sweep" and m.seeds == (0,) and m.output == Path("sweeps/my_sweep")
    assert m.text == path.read_text() and m.source == str(path)
    spaced = tmp_path / "my sweep.toml"
    spaced.write_text(path.read_text())
    assert load_manifest(spaced).name == "my_sweep"
    m = parse_manifest("[sweep]\nname = \"x\"\noutput = \"elsewhere\"\nseeds = [5, 2]\n"
                       "final_metrics = [\"eval/test_error\"]\n"
                       "crossings = [{ metric = \"eval/test_error\", threshold = 0.25 },"
                       " { metric = \"reward/mean\", threshold = 0.9, direction = \">=\" }]\n"
                       + DEFAULTS + "[runs.grpo]\nmethod = \"grpo\"\n")
    assert m.output == Path("elsewhere") and m.seeds == (5, 2)
    assert [s.run for s in m.runs] == ["grpo_s5", "grpo_s2"]
    assert m.final_metrics == ("eval/test_error",)
    assert m.crossings == (CrossingSpec("eval/test_error", 0.25, "<="),
                           CrossingSpec("reward/mean", 0.9, ">="))


@pytest.mark.parametrize(("sweep", "expected"), [
    ("seedz = [0]", "[sweep] seedz: unknown key (did you mean 'seeds'?)"),
    ("seeds = [0]\nnum_seeds = 2", "[sweep] give seeds or num_seeds, not both"),
    ("seeds = [0, 0]", "repeats a seed"),
    ("seeds = [-1]", "must be a non-empty array of non-negative integers"),
    ("num_seeds = 0", "[sweep] num_seeds = 0 must be an integer >= 1"),
    ("name = \"a b\"", "[sweep] name = 'a b': use letters"),
    ("crossings = [{ metric = \"eval/entropy\" }]", "[sweep] crossings entry"),
])
def test_sweep_section_errors(sweep: str, expected: str) -> None:
    problems = _problems(f"[sweep]\n{sweep}\n" + DEFAULTS + "[runs.grpo]\nmethod = \"grpo\"\n")
    assert len(problems) == 1 and expected in problems[0]


@pytest.mark.parametrize(("run", "expected"), [
    # not a train flag, with the close names
    ("num_step = 3", "[runs.r] num_step: not an `rlscope train` option (did you mean "
                     "'num_steps'?)"),
    ("filtr_tau = 0.3", "(did you mean 'filter_tau'?)"),
    # set by the sweep itself
    ("seed = 3", "[runs.r] seed: set by the sweep; list the seeds in [sweep] seeds"),
    ("runs_dir = \"x\"", "[runs.r] runs_dir: set by the sweep"),
    # a value tyro rejects, reported against its option
    ("inner_epochs = \"four\"",
     "[runs.r] inner_epochs = 'four': invalid literal for int() with base 10: 'four'"),
    ("inner_epochs = 2.5", "[runs.r] inner_epochs = 2.5: invalid literal for int()"),
    ("entropy_diagnostics = \"yes\"",
     "[runs.r] entropy_diagnostics = 'yes': expects true or false"),
    ("lr = { a = 1 }", "[runs.r] lr = {'a': 1}: expects a number, string, boolean or array"),
    # grids
    ("grid = { lr = 0.1 }", "[runs.r.grid] lr must be a non-empty array of values"),
    ("grid = { lr = [] }", "[runs.r.grid] lr must be a non-empty array of values"),
    ("lr = 0.1\ngrid = { lr = [0.1] }", "[runs.r] lr is both an option and a grid option"),
    # rejected by rlscope.config.validate: out of the method's regime
    ("batch_size = 15", "[runs.r]: run.batch_size=15 is not divisible by run.group_size=8"),
    ("method = \"replay_dg\"", "[runs.r]: method 'replay_dg' needs a replay buffer"),
    ("method = \"nope\"", "[runs.r]: --method: unknown method 'nope'"),
])
def test_run_option_errors(run: str, expected: str) -> None:
    method = "" if "method" in run else "method = \"grpo\"\n"
    problems = _problems(DEFAULTS + f"[runs.r]\n{method}{run}\n")
    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_grid_point_errors_name_the_point() -> None:
    problems = _problems(DEFAULTS + "[runs.r]\nmethod = \"grpo\"\n"
                         "grid = { batch_size = [16, 15] }\n")
    assert problems == ["[runs.r] at batch_size=15: run.batch_size=15 is not divisible by "
                        "run.group_size=8"]


def test_structure_errors() -> None:
    assert "not valid TOML" in _problems("[runs.r\n")[0]
    assert _problems(DEFAULTS) == ["no runs: add at least one [runs.<name>] table"]
    problems = _problems("[run.r]\nmethod = \"grpo\"\n")
    assert problems[0].startswith("[run]: unknown section (did you mean 'runs'?)")
    assert "[runs] r = 3: each run is a table" in _problems("[runs]\nr = 3\n")[0]
    assert "run names must use letters" in _problems(DEFAULTS + "[runs.\"a b\"]\n")[0]


def test_every_problem_is_reported_at_once() -> None:
    text = """
[sweep]
seedz = [0]
[defaults]
num_step = 3
inner_epochs = "four"
[runs.a]
method = "grpo"
batch_size = 15
[runs.b]
method = "dg"
seed = 1
[runs.c]
method = "grpo"
filter_tau = "abc"
"""
    with pytest.raises(ManifestError) as info:
        parse_manifest(text, "m.toml")
    problems = info.value.problems
    assert len(problems) == 6, problems
    for expected in ("[sweep] seedz", "[defaults] num_step", "[runs.b] seed",
                     "[defaults] inner_epochs = 'four'",
                     # the rest of run a is still validated after inner_epochs is rejected
                     "[runs.a]: run.batch_size=15", "[runs.c] filter_tau = 'abc'"):
        assert sum(expected in p for p in problems) == 1, expected
    assert str(info.value).startswith("m.toml: 6 problems:\n  - ")


def test_the_example_and_the_documented_manifest_parse() -> None:
    root = Path(__file__).resolve().parents[1]
    example = load_manifest(root / "examples" / "sweep_demo.toml")
    assert [s.run for s in example.runs] == ["grpo_s0", "grpo_s1", "dg_s0", "dg_s1"]
    assert example.output == Path("sweeps/sweep_demo")
    docs = (root / "docs" / "training.md").read_text()
    block = docs.split("### The manifest\n\n```toml\n", 1)[1].split("```", 1)[0]
    documented = parse_manifest(block)
    assert len(documented.runs) == (1 + 3) * 3
    assert documented.runs[-1].config.diagnostics.entropy_diagnostics is True
