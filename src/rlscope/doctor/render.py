"""The doctor's outputs: terminal (rich), Markdown, JSON, and an HTML fragment for the report.

All four show the same content in the same order: the source and what was read, the findings
(most severe first), the learning verdict, the checks that could not run and why, the trend,
phase-time and validation tables, translated names with their notes, and skipped lines.
"""

from __future__ import annotations

import html
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from rlscope.doctor.diagnosis import Diagnosis
from rlscope.doctor.findings import SEVERITIES, Finding

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
MAX_TREND_ROWS = 25


def ordered(findings: list[Finding]) -> list[Finding]:
    """Most severe first; the learning verdict last among equals."""
    return sorted(findings, key=lambda f: (-SEVERITIES.index(f.severity),
                                           f.id == "learning_verdict"))


def _evidence(f: Finding) -> str:
    parts = []
    for k, v in f.evidence.items():
        if isinstance(v, dict):
            small = len(v) <= 6 and all(not isinstance(b, (dict, list)) for b in v.values())
            v = ", ".join(f"{a}={b}" for a, b in v.items()
                          if small or a in ("first_mean", "last_mean", "change", "direction",
                                            "first", "last", "temperature", "top_k", "top_p",
                                            "replay_sampling_mask")) or "…"
        parts.append(f"{k}={v}")
    return "; ".join(parts)


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _header(d: Diagnosis) -> str:
    t = d.table
    steps = f"steps {t.steps[0]:g}–{t.steps[1]:g}" if t.steps else "no steps"
    return (f"{t.source} ({t.fmt}): {len(t.names())} metrics, {t.n_points} values, {steps}"
            + (f", {t.n_problems} lines skipped" if t.n_problems else ""))


def to_json(diagnoses: list[Diagnosis]) -> str:
    return json.dumps([d.as_dict() for d in diagnoses], indent=2, default=float)


def _trend_rows(d: Diagnosis) -> list[list[str]]:
    rows = []
    for name, tr in list(d.trends.items())[:MAX_TREND_ROWS]:
        rows.append([name, _fmt(tr.first_mean), _fmt(tr.last_mean), _fmt(tr.change),
                     tr.direction, f"{tr.ups}/{tr.downs}"])
    return rows


def _unavailable_lines(d: Diagnosis) -> list[str]:
    return [f"{rule}: {u}" for rule, u in d.unavailable.items()]


def to_markdown(diagnoses: list[Diagnosis]) -> str:
    out: list[str] = []
    for d in diagnoses:
        out += [f"## {d.table.source}", "", _header(d), ""]
        findings = ordered(d.findings)
        out += ["### Findings", ""]
        if not findings:
            out.append("No finding.")
        for f in findings:
            cause = f" Likely cause: {', '.join(f.causes)}." if f.causes else ""
            out += [f"- **{f.severity}** `{f.id}`: {f.title}.{cause}",
                    f"  - evidence: {_evidence(f)}",
                    f"  - mechanism: {f.mechanism}",
                    f"  - actions: {'; '.join(f.actions)}",
                    f"  - confidence: {f.confidence:.2f}"]
        out.append("")
        if d.unavailable:
            out += ["### Unavailable checks", ""]
            out += [f"- {line}" for line in _unavailable_lines(d)] + [""]
        if d.trends:
            out += ["### Trends", "", "| metric | first | last | change | beyond noise | up/down |",
                    "| --- | --- | --- | --- | --- | --- |"]
            out += ["| " + " | ".join(r) + " |" for r in _trend_rows(d)] + [""]
        if d.phases:
            out += ["### Time", "", "| phase | mean s | share of step time |",
                    "| --- | --- | --- |"]
            out += [f"| {k} | {_fmt(m)} | {s:.0%} |" for k, (m, s) in d.phases.items()] + [""]
        if d.validation:
            out += ["### Validation", "", "| metric | evaluations | first | last | best |",
                    "| --- | --- | --- | --- | --- |"]
            out += [f"| {k} | {v['evaluations']:g} | {_fmt(v['first'])} | {_fmt(v['last'])} | "
                    f"{_fmt(v['best'])} |" for k, v in d.validation.items()] + [""]
        if d.table.original:
            out += ["### Translated names", ""]
            out += [f"- `{src}` → `{dst}`" + (f": {d.table.notes[dst]}" if dst in d.table.notes
                                               else "")
                    for dst, src in sorted(d.table.original.items())] + [""]
        if d.table.import_notes:
            out += ["### Import notes", ""] + [f"- {n}" for n in d.table.import_notes] + [""]
        if d.table.problems:
            out += ["### Skipped", ""] + [f"- {p}" for p in d.table.problems[:20]] + [""]
    return "\n".join(out)


def to_html(diagnoses: list[Diagnosis]) -> str:
    """A self-contained ``<section>`` (no scripts, inline styles) for the HTML report."""
    e = html.escape
    parts = ['<section class="rlscope-doctor">']
    colors = {"critical": "#b00020", "warning": "#9a6700", "info": "#0a5fb4"}
    for d in diagnoses:
        parts.append(f"<h2>{e(d.table.source)}</h2><p>{e(_header(d))}</p><ul>")
        for f in ordered(d.findings):
            parts.append(
                f'<li><strong style="color:{colors[f.severity]}">{e(f.severity)}</strong> '
                f"<code>{e(f.id)}</code>: {e(f.title)}<br><small>{e(_evidence(f))}</small>"
                f"<br>{e(f.mechanism)}<br><em>{e('; '.join(f.actions))}</em></li>")
        parts.append("</ul>")
        if d.unavailable:
            parts.append("<p><strong>Unavailable checks</strong>: "
                         + e("; ".join(_unavailable_lines(d))) + "</p>")
        if d.trends:
            parts.append("<table><tr><th>metric</th><th>first</th><th>last</th><th>change</th>"
                         "<th>beyond noise</th><th>up/down</th></tr>")
            parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                      for r in _trend_rows(d)]
            parts.append("</table>")
    parts.append("</section>")
    return "\n".join(parts)


def to_terminal(diagnoses: list[Diagnosis], console: Console | None = None) -> None:
    console = console or Console()
    for d in diagnoses:
        console.rule(f"[bold]{d.table.source}")
        console.print(_header(d))
        findings = ordered(d.findings)
        if not findings:
            console.print("[green]No finding.[/green]")
        for f in findings:
            style = SEVERITY_STYLE[f.severity]
            cause = f" [dim](likely cause: {', '.join(f.causes)})[/dim]" if f.causes else ""
            console.print(f"[{style}]{f.severity:>8}[/{style}] [bold]{f.id}[/bold]: "
                          f"{f.title}{cause}")
            console.print(f"           evidence: {_evidence(f)}", highlight=False)
            console.print(f"           why: {f.mechanism}", highlight=False)
            console.print(f"           try: {'; '.join(f.actions)}", highlight=False)
        if d.unavailable:
            console.print("[dim]unavailable checks: " + "; ".join(_unavailable_lines(d))
                          + "[/dim]")
        for title, cols, rows in _tables(d):
            table = Table(title=title, title_justify="left")
            for i, col in enumerate(cols):
                table.add_column(col, no_wrap=i > 0, overflow="fold", max_width=None if i
                                 else 40)
            for row in rows:
                table.add_row(*row)
            console.print(table)
        for note in d.table.import_notes:
            console.print(f"[yellow]import: {note}[/yellow]", highlight=False)
        if d.table.problems:
            console.print(f"[dim]{d.table.n_problems} lines skipped, e.g. "
                          + "; ".join(str(p) for p in d.table.problems[:3]) + "[/dim]")


def _tables(d: Diagnosis) -> list[tuple[str, list[str], list[list[str]]]]:
    out: list[tuple[str, list[str], list[list[str]]]] = []
    if d.trends:
        out.append(("trends", ["metric", "first", "last", "change", "trend", "up/down"],
                    _trend_rows(d)))
    if d.phases:
        out.append(("time", ["phase", "mean s", "share of step time"],
                    [[k, _fmt(m), f"{s:.0%}"] for k, (m, s) in d.phases.items()]))
    if d.validation:
        out.append(("validation", ["metric", "evaluations", "first", "last", "best"],
                    [[k, f"{v['evaluations']:g}", _fmt(v["first"]), _fmt(v["last"]),
                      _fmt(v["best"])] for k, v in d.validation.items()]))
    return out


def findings_json(d: Diagnosis) -> dict[str, Any]:
    """What a run directory's ``findings.json`` holds."""
    return d.as_dict()
