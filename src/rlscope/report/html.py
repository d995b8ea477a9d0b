"""The report as one self-contained HTML page: inline CSS, figures as ``data:`` URIs, no script.

The page makes no network request: every resource is inline, and a Content-Security-Policy
(``default-src 'none'; img-src data:; style-src 'unsafe-inline'``) makes the browser refuse any
that slipped in, so a report opens the same offline, from an e-mail or from an archive.

Sections, in order, each a ``<section id=...>``: ``config`` (method components, task, key
options; for a sweep the manifest and the run list), ``curves``, ``final``, ``crossings``
(sweeps that wrote ``crossings.csv``), ``findings`` (the doctor, per run; for a sweep each
name's runs collapsed under the name), ``samples`` and ``environment``. Every table has a
stable id or class and every data row a class (``final-row``, ``run-row``, ...), so tests and
scripts can count rows.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from rlscope.doctor.diagnosis import Diagnosis
from rlscope.doctor.render import to_html as doctor_html
from rlscope.metrics.sinks import iter_jsonl
from rlscope.report.figures import FigureFiles, Style, slug
from rlscope.report.load import ReportInput, RunInfo, run_records
from rlscope.report.tidy import final_values, finite

ENV_KEYS = ("rlscope_version", "git_commit", "python_version", "torch_version", "device",
            "device_name", "torch_threads", "platform")
COMPONENTS = ("advantage", "gate", "objective", "agg", "kl", "entropy_coef", "selection",
              "overlong", "correction")
MAX_TOKENS = 64
"""Token lists longer than this are cut in the samples table (the count of the rest is shown)."""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
 margin:0 auto;max-width:1200px;padding:1rem 2rem;color:#1a1a1a;line-height:1.4}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem}
nav a{margin-right:1rem} .meta{color:#555;font-size:.9rem}
.table-wrap{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
span.tokens{display:block;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.8rem;
 overflow-wrap:anywhere;max-width:28rem}
.name{white-space:nowrap}
.swatch{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;margin-right:.4rem;
 vertical-align:middle}
.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:1rem}
figure{margin:0} figure img{width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85rem;color:#555}
pre{background:#f8f8f8;padding:.5rem;overflow:auto;font-size:.8rem;max-height:30rem}
details{margin:.4rem 0} summary{cursor:pointer;font-weight:600}
.error{color:#b00020}
"""


class Html(str):
    """Markup that is already escaped: table cells of this type are inserted as they are."""


def esc(value: Any) -> str:
    """``value`` as text safe inside HTML elements and quoted attributes."""
    return html.escape(str(value))


def cell(value: Any) -> str:
    """A ``<td>``: `Html` as it is, floats to 4 significant digits (right-aligned), anything
    else escaped."""
    if isinstance(value, Html):
        return f"<td>{value}</td>"
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    return f"<td>{esc(value)}</td>"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], row_class: str,
          table_id: str = "", table_class: str = "") -> str:
    """A ``<table>`` with a header row and body rows of class ``row_class``."""
    classes = " ".join(c for c in ("rlscope-table", table_class) if c)
    attrs = (f' id="{esc(table_id)}"' if table_id else "") + f' class="{esc(classes)}"'
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "\n".join(f'<tr class="{row_class}">' + "".join(cell(c) for c in r) + "</tr>"
                     for r in rows)
    return (f'<div class="table-wrap"><table{attrs}><thead><tr>{head}</tr></thead><tbody>\n'
            f"{body}\n</tbody></table></div>")


def swatch(name: str, styles: dict[str, Style]) -> Html:
    """The name with its figure colour, so tables and figures read together."""
    color = styles[name].color if name in styles else "#999"
    return Html(f'<span class="name"><span class="swatch" style="background:{esc(color)}">'
                f"</span>{esc(name)}</span>")


def _compact(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _component(key: str, spec: dict[str, Any]) -> str:
    value = spec.get(key)
    if key == "kl" and isinstance(value, dict):
        if not value.get("coef"):
            return "off"
        return (f"{value.get('coef')} · {value.get('estimator')} to {value.get('target')} "
                f"({value.get('place')}, {value.get('control')})")
    if isinstance(value, dict):
        return str(value.get("name", _compact(value)))
    return "" if value is None else str(value)


def _first_per_name(runs: list[RunInfo]) -> dict[str, RunInfo]:
    """Each name's first run (lowest seed) with a config, else its first run."""
    out: dict[str, RunInfo] = {}
    for r in runs:
        if r.name not in out or (not out[r.name].config and r.config):
            out[r.name] = r
    return out


def components_table(inp: ReportInput, styles: dict[str, Style]) -> str:
    """One row per name: its method's components (from its first run's ``method_spec``), the
    task, and the method's description and source."""
    header = ["name", "method", "task", *COMPONENTS, "description", "source"]
    rows = []
    for name, r in _first_per_name(inp.runs).items():
        spec = r.config.get("method_spec", {})
        rows.append([swatch(name, styles), r.method, r.config.get("config", {}).get("task", ""),
                     *(_component(k, spec) for k in COMPONENTS), spec.get("description", ""),
                     spec.get("source", "")])
    return table(header, rows, "component-row", "components-table")


def key_options(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The options a reader looks for first, from a run's ``config.json``."""
    cfg, derived = config.get("config", {}), config.get("derived", {})
    run, model = cfg.get("run", {}), cfg.get("model", {})
    sampling, optim = cfg.get("sampling", {}), cfg.get("optim", {})
    overrides = {k: v for k, v in cfg.get("components", {}).items() if v is not None}
    items = [
        ("method", cfg.get("method")), ("task", cfg.get("task")),
        ("task description", config.get("task_description")),
        ("steps", run.get("num_steps")), ("batch size", run.get("batch_size")),
        ("group size", derived.get("group_size")), ("prompts / step", derived.get("num_prompts")),
        ("inner epochs × minibatches",
         f"{run.get('inner_epochs')} × {run.get('num_minibatches')}" if run else None),
        ("max new tokens", derived.get("max_new_tokens")),
        ("model", " ".join(f"{k}={v}" for k, v in model.items() if v not in ("", None))),
        ("sampling", " ".join(f"{k}={sampling.get(k)}" for k in ("temperature", "top_k", "top_p")
                              if k in sampling)),
        ("optimizer", " ".join(f"{k}={v}" for k, v in optim.items())),
        ("seed", run.get("seed")), ("component overrides", _compact(overrides) if overrides else
                                    "none"),
    ]
    return [(k, str(v)) for k, v in items if v not in (None, "")]


def config_section(inp: ReportInput, styles: dict[str, Style],
                   diagnoses: dict[str, list[Diagnosis] | str]) -> str:
    """Components per name; for a run its key options and full config, for a sweep the
    manifest and one row per run (status, steps, wall time, the doctor's finding counts)."""
    parts = ['<section id="config"><h2>Configuration</h2>', "<h3>Method components</h3>",
             components_table(inp, styles)]
    if inp.kind == "run":
        config = inp.runs[0].config
        parts += ["<h3>Key options</h3>",
                  table(["option", "value"], key_options(config), "option-row", "options-table")]
        if config:
            parts.append("<details><summary>Full config.json</summary><pre>"
                         f"{esc(json.dumps(config, indent=2, default=str))}</pre></details>")
    else:
        if inp.manifest:
            # the per-run records are the Runs table below
            skip = {"runs"} if run_records(inp.manifest) else set()
            manifest = [(k, _compact(v)) for k, v in inp.manifest.items() if k not in skip]
            parts += ["<h3>Manifest (sweep.json)</h3>",
                      table(["key", "value"], manifest, "manifest-row", "manifest-table"),
                      "<details><summary>Full sweep.json</summary><pre>"
                      f"{esc(json.dumps(inp.manifest, indent=2, default=str))}</pre></details>"]
        rows = []
        for r in inp.runs:
            status = r.status.get("status") or r.record.get("status") or (
                "" if r.run_dir else "no run directory")
            wall = finite(r.status.get("wall_time_s", r.record.get("wall_time_s")))
            rows.append([r.run, swatch(r.name, styles), r.method, r.seed, status,
                         r.status.get("steps", ""), "" if wall is None else f"{wall:.1f}",
                         _finding_counts(diagnoses.get(r.run)),
                         _compact(r.record.get("error") or "")])
        parts += ["<h3>Runs</h3>", table(["run", "name", "method", "seed", "status", "steps",
                                          "wall s", "findings", "error"], rows, "run-row",
                                         "runs-table")]
    parts.append("</section>")
    return "\n".join(parts)


def _finding_counts(diag: list[Diagnosis] | str | None) -> str:
    if diag is None:
        return ""
    if isinstance(diag, str):
        return "doctor could not run"
    counts = Counter(f.severity for d in diag for f in d.findings)
    return ", ".join(f"{counts[s]} {s}" for s in ("critical", "warning", "info") if counts[s]) \
        or "none"


def curves_section(figures: list[FigureFiles], metrics: Sequence[str], kind: str) -> str:
    """The figures as ``data:`` SVG images (scalable, and their element ids cannot clash with
    the page's as inline SVG would), and the requested metrics that no run logged."""
    shown = {f.metric for f in figures}
    missing = [m for m in metrics if m not in shown]
    what = ("mean across seeds (line) ± standard error of the mean (band)" if kind == "sweep"
            else "one run")
    parts = ['<section id="curves"><h2>Curves</h2>',
             f'<p class="meta">Full trajectories, {what}. Files: '
             f'{esc(figures[0].png.parent) if figures else "none"}</p><div class="figures">']
    for f in figures:
        data = base64.b64encode(f.svg.read_bytes()).decode("ascii")
        parts.append(f'<figure class="report-figure" id="figure-{esc(slug(f.metric))}">'
                     f'<img src="data:image/svg+xml;base64,{data}" alt="{esc(f.metric)} by step">'
                     f"<figcaption>{esc(f.metric)} ({esc(f.svg.name)}, {esc(f.png.name)})"
                     "</figcaption></figure>")
    parts.append("</div>")
    if missing:
        parts.append(f'<p class="meta">Not logged: {esc(", ".join(missing))}</p>')
    parts.append("</section>")
    return "\n".join(parts)


def final_section(inp: ReportInput, metrics: Sequence[str], styles: dict[str, Style]) -> str:
    """One row per name: method, number of runs, and mean ± sd (n) of each metric's final
    value (`tidy.final_values`); metrics no run logged get no column."""
    finals = final_values(inp.rows, metrics)
    shown = [m for m in metrics if any(m in per for per in finals.values())]
    methods = {r.name: r.method for r in inp.runs}
    rows = []
    for name in inp.names:
        per = finals.get(name, {})
        n = max((v.n for v in per.values()), default=0)
        rows.append([swatch(name, styles), methods.get(name, ""), n,
                     *(Html(f'<span class="num">{per[m].text()}</span>') if m in per else ""
                       for m in shown)])
    return ('<section id="final"><h2>Final values</h2><p class="meta">Each run\'s value at the '
            "last step it logged the metric; mean ± sample sd (number of runs).</p>"
            + table(["name", "method", "runs", *shown], rows, "final-row", "final-table")
            + "</section>")


def compact_number(cell: str) -> str:
    """A CSV cell with a non-integer number shown to 4 significant digits (others as read)."""
    try:
        value = float(cell)
    except ValueError:
        return cell
    return cell if not math.isfinite(value) or value.is_integer() else f"{value:.4g}"


def crossings_section(inp: ReportInput, styles: dict[str, Style]) -> str:
    """``crossings.csv`` as it is (its columns are the sweep's to choose); a ``name`` column
    gets the names' colours."""
    if inp.crossings is None:
        return ""
    header, rows = inp.crossings
    col = header.index("name") if "name" in header else -1
    shown = [[swatch(c, styles) if i == col else compact_number(c) for i, c in enumerate(r)]
             for r in rows]
    return ('<section id="crossings"><h2>Crossings</h2>'
            + table(header, shown, "crossing-row", "crossings-table") + "</section>")


def findings_section(inp: ReportInput, diagnoses: dict[str, list[Diagnosis] | str]) -> str:
    """The doctor's HTML per run; for a sweep, each name's runs inside a collapsed
    ``<details>`` whose summary counts their findings by severity."""
    if not diagnoses:
        return ('<section id="findings"><h2>Findings</h2><p class="meta">The doctor was not run '
                "(--no_doctor).</p></section>")

    def one(r: RunInfo) -> str:
        diag = diagnoses.get(r.run)
        if diag is None:
            return f'<p class="meta">{esc(r.run)}: no run directory.</p>'
        if isinstance(diag, str):
            return f'<p class="error">{esc(r.run)}: {esc(diag)}</p>'
        return f'<div class="findings-run" data-run="{esc(r.run)}">{doctor_html(diag)}</div>'

    parts = ['<section id="findings"><h2>Findings</h2>']
    if inp.kind == "run":
        parts.append(one(inp.runs[0]))
    else:
        for name in inp.names:
            runs = [r for r in inp.runs if r.name == name]
            ran = [diagnoses.get(r.run) for r in runs]
            counts = _finding_counts([d for diag in ran if isinstance(diag, list) for d in diag])
            parts.append(f'<details class="findings-name" data-name="{esc(name)}"><summary>'
                         f"{esc(name)}: {len(runs)} run(s); findings: {esc(counts)}</summary>"
                         + "\n".join(one(r) for r in runs) + "</details>")
    parts.append("</section>")
    return "\n".join(parts)


def _tokens(value: Any) -> str:
    if isinstance(value, list):
        shown = " ".join(str(t) for t in value[:MAX_TOKENS])
        rest = len(value) - MAX_TOKENS
        return shown + (f" … (+{rest})" if rest > 0 else "")
    return str(value)


def last_samples(r: RunInfo, n: int) -> list[dict[str, Any]]:
    """Up to ``n`` rows of the last step logged in the run's ``samples.jsonl``."""
    if r.run_dir is None:
        return []
    rows = list(iter_jsonl(r.run_dir / "samples.jsonl"))
    steps = [s for s in (finite(x.get("step")) for x in rows) if s is not None]
    if not steps:
        return []
    last = max(steps)
    return [x for x in rows if finite(x.get("step")) == last][:n]


def samples_section(inp: ReportInput, n: int, styles: dict[str, Style]) -> str:
    """The last logged step's rollouts: the run's, or for a sweep each name's first run's."""
    parts = ['<section id="samples"><h2>Sample rollouts</h2><p class="meta">The last logged '
             f"step, at most {n} rows per run (token ids); for a sweep, each name's first "
             "run.</p>"]
    for name, r in _first_per_name(inp.runs).items():
        rows = [[_step(x.get("step")), Html(f'<span class="tokens">{esc(_tokens(x.get("prompt")))}'
                                           "</span>"),
                 Html(f'<span class="tokens">{esc(_tokens(x.get("completion")))}</span>'),
                 _num(x.get("reward")), _num(x.get("advantage"))] for x in last_samples(r, n)]
        parts.append(f"<h3>{swatch(name, styles)} <small>({esc(r.run)})</small></h3>")
        parts.append(table(["step", "prompt", "completion", "reward", "advantage"], rows,
                           "sample-row", table_class="samples-table") if rows
                     else '<p class="meta">No samples logged.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def _num(value: Any) -> float | str:
    x = finite(value)
    return "" if x is None else x


def _step(value: Any) -> int | float | str:
    """Steps print in full (``12000``, not ``1.2e+04``)."""
    x = finite(value)
    return "" if x is None else int(x) if x.is_integer() else x


def environment_section(inp: ReportInput) -> str:
    """Versions, commit, device and platform from ``config.json``; where runs differ, each
    value with its number of runs."""
    rows = []
    for key in ENV_KEYS:
        seen = Counter(str(r.config[key]) for r in inp.runs if r.config.get(key) is not None)
        if seen:
            rows.append([key, "; ".join(v if len(seen) == 1 else f"{v} ({c} runs)"
                                        for v, c in seen.most_common())])
    return ('<section id="environment"><h2>Machine and versions</h2>'
            + table(["key", "value"], rows, "env-row", "environment-table") + "</section>")


def title(inp: ReportInput) -> str:
    """The page title: the directory, and the method and task (run) or the counts (sweep)."""
    if inp.kind == "sweep":
        return (f"rlscope sweep report: {inp.path.name} ({len(inp.names)} names, "
                f"{len(inp.runs)} runs)")
    cfg = inp.runs[0].config.get("config", {})
    return f"rlscope run report: {inp.path.name} ({cfg.get('method', '?')} on " \
           f"{cfg.get('task', '?')})"


def render(inp: ReportInput, metrics: Sequence[str], figures: list[FigureFiles],
           styles: dict[str, Style], diagnoses: dict[str, list[Diagnosis] | str],
           samples: int) -> str:
    """The whole page. ``diagnoses``: run id → the doctor's diagnoses, or why it could not run;
    empty when the doctor was not asked for."""
    from rlscope import __version__

    sections = [config_section(inp, styles, diagnoses), curves_section(figures, metrics, inp.kind),
                final_section(inp, metrics, styles), crossings_section(inp, styles),
                findings_section(inp, diagnoses), samples_section(inp, samples, styles),
                environment_section(inp)]
    nav = " ".join(f'<a href="#{s}">{s}</a>' for s in ("config", "curves", "final", "crossings",
                                                        "findings", "samples", "environment")
                   if s != "crossings" or inp.crossings is not None)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,">'
            f"<title>{esc(title(inp))}</title><style>{CSS}</style></head>\n<body>"
            f"<header><h1>{esc(title(inp))}</h1><p class=\"meta\">{esc(inp.path)} · generated "
            f"{when} by rlscope {__version__}</p><nav>{nav}</nav></header>\n"
            + "\n".join(s for s in sections if s) + "\n</body></html>\n")
