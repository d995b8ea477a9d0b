"""``rlscope doctor PATH``: options and the command itself (no torch is imported)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from rlscope.doctor.diagnosis import run_doctor
from rlscope.doctor.findings import DoctorConfig
from rlscope.doctor.importers import FORMATS, DoctorError
from rlscope.doctor.render import findings_json, to_html, to_json, to_markdown, to_terminal

OUTPUTS = ("terminal", "markdown", "json", "html")


@dataclass(frozen=True)
class DoctorCommand:
    """Diagnose a training run: an rlscope run directory, a verl console log, a TRL
    trainer_state.json, a W&B CSV export, a tinker-cookbook metrics.jsonl, or any CSV/JSONL
    with a step column."""

    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="PATH")] = ""
    """The run directory or log file (not with --eval)."""
    format: str = "auto"
    """Input format: auto (sniff), run, verl, trl, wandb (CSV export), tinker, jsonl, json
    (an array of step objects), csv, tensorboard (a directory of events.out.tfevents.*) or
    wandb_run (a W&B offline run directory or run-*.wandb file)."""
    output: str = "terminal"
    """terminal (rich), markdown, json, or html (a fragment for the report)."""
    out: str = ""
    """Write the output to this file instead of standard output."""
    write_findings: bool = True
    """For an rlscope run directory, also write its findings.json."""
    eval: str = ""
    """A labelled corpus directory (cases with expected.toml, see docs/doctor.md): print the
    doctor's precision and recall per rule on it instead of diagnosing PATH."""
    json: bool = False
    """Shorthand for --output json."""
    thresholds: DoctorConfig = field(default_factory=DoctorConfig)


def run(cmd: DoctorCommand) -> int:
    """Print the diagnosis; 2 for an unusable input, 0 otherwise."""
    if cmd.format not in FORMATS:
        sys.stderr.write(f"error: --format {cmd.format!r} is unknown; valid: "
                         f"{', '.join(FORMATS)}\n")
        return 2
    if cmd.output not in OUTPUTS:
        sys.stderr.write(f"error: --output {cmd.output!r} is unknown; valid: "
                         f"{', '.join(OUTPUTS)}\n")
        return 2
    output = "json" if cmd.json else cmd.output
    if cmd.eval:
        return run_eval(cmd, output)
    if not cmd.path:
        sys.stderr.write("error: give a run directory or log file (PATH), or --eval DIR\n")
        return 2
    try:
        diagnoses = run_doctor(cmd.path, cmd.format, cmd.thresholds)
    except DoctorError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except OSError as e:
        sys.stderr.write(f"error: cannot read {cmd.path}: {e}\n")
        return 2
    path = Path(cmd.path)
    if cmd.write_findings and path.is_dir() and diagnoses and diagnoses[0].table.fmt == "run":
        (path / "findings.json").write_text(json.dumps(findings_json(diagnoses[0]), indent=2,
                                                       default=float))
    if output == "terminal" and not cmd.out:
        to_terminal(diagnoses)
        return 0
    text = {"terminal": to_markdown, "markdown": to_markdown, "json": to_json,
            "html": to_html}[output](diagnoses)
    if cmd.out:
        Path(cmd.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


def run_eval(cmd: DoctorCommand, output: str) -> int:
    """Precision and recall per rule on the corpus in ``cmd.eval``: a Markdown table, or JSON
    with --output json / --json; 2 for an unusable corpus."""
    from rlscope.doctor.evaluate import evaluate, to_table

    try:
        result = evaluate(cmd.eval, cmd.thresholds)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    text = json.dumps(result.as_dict(), indent=2) if output == "json" else to_table(result)
    if cmd.out:
        Path(cmd.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0
