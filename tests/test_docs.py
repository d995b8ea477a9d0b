"""Generated documentation stays in sync with the code that generates it."""

from pathlib import Path

import pytest

from rlscope.methods import METHODS
from rlscope.methods.catalog import render_list
from rlscope.methods.catalog import render_markdown as render_methods
from rlscope.metrics.schema import render_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_metrics_doc_is_current() -> None:
    assert (DOCS / "metrics.md").read_text() == render_markdown(), (
        "docs/metrics.md is stale: python -m rlscope.metrics.schema > docs/metrics.md")


def test_methods_doc_is_current() -> None:
    assert (DOCS / "methods.md").read_text() == render_methods(), (
        "docs/methods.md is stale: python -m rlscope.methods.catalog > docs/methods.md")
    assert all(f"| `{name}` |" in render_methods() for name in METHODS)


def test_readme_shows_the_current_methods_listing() -> None:
    readme = (DOCS.parent / "README.md").read_text()
    assert f"```\n$ rlscope methods\n{render_list()}```" in readme, (
        "README.md's `rlscope methods` block is stale: paste the output of `rlscope methods`")


# ------------------------------------------------------------------ the README's commands

README = DOCS.parent / "README.md"


def _readme_commands() -> list[list[str]]:
    """Every `rlscope ...` command the README shows (in bash blocks, after `&&`, and after a
    `$ ` prompt in output blocks), as argv without the program name; comments dropped, a
    placeholder such as ``<name>`` made a plain word."""
    import re
    import shlex

    lines = []
    text = README.read_text().replace("\\\n", " ")
    for block in re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S):
        lines += [part for line in block.splitlines() for part in line.split("&&")]
    # inline `rlscope COMMAND ARGS` in the prose (not the bare `rlscope COMMAND` mentions)
    lines += [c for c in re.findall(r"`(rlscope \w+ [^`\n]+)`", text) if "..." not in c]
    commands = []
    for line in lines:
        line = re.sub(r"\s+#.*$", "", line).strip().removeprefix("$ ")
        if line.startswith("rlscope "):
            commands.append(shlex.split(re.sub(r"<(\w+)>", r"\1", line))[1:])
    return commands


# The options class each command parses with tyro (methods and tasks take only a NAME).
def _config_class(command: str) -> type:
    from rlscope.bench import BenchConfig
    from rlscope.config import TrainConfig
    from rlscope.demo import DemoConfig
    from rlscope.doctor.command import DoctorCommand
    from rlscope.report.command import ReportCommand
    from rlscope.serve.config import ServeConfig
    from rlscope.supervised.rm import RmConfig
    from rlscope.supervised.sft import SftConfig
    from rlscope.sweep.command import SweepCommand

    return {"train": TrainConfig, "sft": SftConfig, "rm": RmConfig, "sweep": SweepCommand,
            "demo": DemoConfig, "bench": BenchConfig, "doctor": DoctorCommand,
            "report": ReportCommand, "serve": ServeConfig}[command]


def test_every_readme_command_parses(capsys: pytest.CaptureFixture[str]) -> None:
    """Each command the README shows names a real subcommand and its flags parse (tyro
    accepts them; `--help` exits 0)."""
    from rlscope.cli import COMMANDS, _tyro_parse

    commands = _readme_commands()
    shown = {argv[0] for argv in commands}
    assert {"demo", "train", "sft", "rm", "sweep", "report", "doctor", "serve", "methods",
            "tasks"} <= shown, shown
    for argv in commands:
        assert argv[0] in COMMANDS, argv
        if argv[0] in ("methods", "tasks"):
            assert len(argv) <= 2, argv
            continue
        cls = _config_class(argv[0])
        if "--help" in argv:
            with pytest.raises(SystemExit) as info:
                _tyro_parse(cls, argv[1:], f"rlscope {argv[0]}")
            assert info.value.code == 0, argv
        else:
            cfg = _tyro_parse(cls, argv[1:], f"rlscope {argv[0]}")
            assert isinstance(cfg, cls), argv
            if argv[0] == "train":
                _check_train_command(argv, cfg)
    capsys.readouterr()


def _check_train_command(argv: list[str], cfg: object) -> None:
    """A README train command validates, unless it reads an earlier command's output
    (--init, --rm_path), needs a GPU, or is the README's example of a rejected config."""
    from rlscope.config import ConfigError, TrainConfig, validate
    from rlscope.steps import validate_run

    assert isinstance(cfg, TrainConfig)
    if {"--init", "--rm_path"} & set(argv) or cfg.run.device.startswith("cuda"):
        return
    if "--group_size" in argv:
        with pytest.raises(ConfigError, match=r"run\.group_size=1: this method compares"):
            validate(cfg)
        return
    validate_run(cfg)  # the check of every step kind (rollout: `validate`)


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    from rlscope.cli import COMMANDS, main

    for command in COMMANDS:
        if command in ("methods",):
            assert main([command, "--help"]) == 0
            continue
        if command == "tasks":
            continue  # takes no options
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0, command
        assert f"rlscope {command}" in capsys.readouterr().out, command


def test_readme_doctor_path_is_where_the_demo_writes() -> None:
    """The README's `rlscope doctor runs/demo/grpo_s0` names the demo's grpo run directory:
    run_demo writes <runs_dir>/<method>_s<seed> (tests/test_cli.py runs it)."""
    from rlscope.demo import DemoConfig

    demo = DemoConfig()
    doctor_paths = [argv[1] for argv in _readme_commands()
                    if argv[0] == "doctor" and "demo" in argv[1]]
    assert doctor_paths, "the README shows no doctor command on a demo run"
    assert "grpo" in demo.methods
    for path in doctor_paths:
        assert path == f"{demo.runs_dir}/grpo_s{demo.seed}", path
    text = README.read_text()
    assert "rlscope doctor runs/grpo_s0" not in text


def test_readme_task_table_lists_every_task() -> None:
    import re

    from rlscope.steps import STEPS
    from rlscope.tasks import TASKS

    text = README.read_text()
    block = text[text.index("$ rlscope tasks\n"):]
    block = block[:block.index("```")]
    listed = re.findall(r"^│ (\w+)\s+│", block, flags=re.M)
    assert listed == list(TASKS) + [t for kind in STEPS.values() for t in kind.tasks]


def test_readme_states_the_test_time_and_a_quick_subset() -> None:
    import re

    text = README.read_text()
    assert re.search(r"about \d+ minutes on 2 cores", text)
    assert "python -m pytest -x tests/test_cli.py tests/test_validation.py" in text
