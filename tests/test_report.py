"""`rlscope report` on a hand-built sweep, a 3-step CPU run and broken inputs: the sections,
table rows and values, the findings, the samples, the figures, and no network reference."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_dirs import CROSSINGS, FAILED, NAMES, SEEDS, make_sweep

from rlscope.cli import main
from rlscope.metrics.sinks import iter_jsonl
from rlscope.report.build import DEFAULT_METRICS, build_report
from rlscope.report.figures import PALETTE, slug

SECTIONS = ["config", "curves", "final", "crossings", "findings", "samples", "environment"]


class Page(HTMLParser):
    """Section ids, rows per table (by id, or by class for repeated tables), resource
    attributes and the text of each table's cells."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.rows: dict[str, list[list[str]]] = {}
        self.resources: list[str] = []
        self.classes: list[str] = []
        self._table: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.classes += a.get("class", "").split()
        self.resources += [v for k, v in a.items() if k in ("src", "href")]
        if tag == "section" and "id" in a:
            self.sections.append(a["id"])
        elif tag == "table":
            key = a.get("id") or (a.get("class", "").split() or ["(none)"])[-1]
            self._table.append(key)
            self.rows.setdefault(key, [])
        elif tag == "tr" and self._table and a.get("class"):
            self.rows[self._table[-1]].append([])
        elif tag == "td" and self._table and self.rows[self._table[-1]]:
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[self._table[-1]][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table" and self._table:
            self._table.pop()


def _no_network(text: str) -> None:
    for ref in ('src="http', "src='http", 'href="http', "href='http", "url(http", "@import"):
        assert ref not in text.lower(), ref


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    sweep = make_sweep(tmp_path_factory.mktemp("report") / "sweep")
    report = build_report(sweep)
    return sweep, report.html.read_text()


def test_sweep_report_sections_and_tables(sweep_report: tuple[Path, str]) -> None:
    sweep, text = sweep_report
    page = Page(text)
    assert page.sections == SECTIONS
    n_runs = len(NAMES) * len(SEEDS)
    assert len(page.rows["final-table"]) == len(NAMES)
    assert len(page.rows["runs-table"]) == n_runs + 1  # the failed run is listed too
    assert len(page.rows["components-table"]) == len(NAMES)
    assert len(page.rows["crossings-table"]) == len(CROSSINGS) - 1
    assert page.rows["samples-table"] and all(r[0] == "9" for r in page.rows["samples-table"])
    assert len(page.rows["samples-table"]) == 4 * len(NAMES)
    assert page.classes.count("report-figure") == len(DEFAULT_METRICS)
    assert page.classes.count("findings-name") == len(NAMES)
    assert page.classes.count("findings-run") == n_runs  # the failed run has no metrics
    assert "manifest-table" in page.rows and ["seeds", "[0, 1, 2]"] in page.rows["manifest-table"]
    assert not any(r[0] == "runs" for r in page.rows["manifest-table"])  # shown as runs-table
    assert "rlscope-doctor" in page.classes
    assert ["torch_version", "2.13.0+cpu"] in page.rows["environment-table"]
    # alpha's final test errors at step 9 are 0.4375, 0.9375, 1.4375: mean 0.9375, sd 0.5
    alpha = page.rows["final-table"][0]
    assert alpha[:3] == ["alpha", "grpo", "3"] and alpha[3] == "0.9375 ± 0.5 (3)"
    for metric in DEFAULT_METRICS:
        for ext in ("png", "svg"):
            assert (sweep / "figures" / f"{slug(metric)}.{ext}").stat().st_size > 0


def test_sweep_report_colours_match_the_figures(sweep_report: tuple[Path, str]) -> None:
    _, text = sweep_report
    final = text[text.index('id="final-table"'):text.index("</table>", text.index(
        'id="final-table"'))]
    assert re.findall(r'background:(#[0-9A-Fa-f]{6})"></span>(\w+)', final) == [
        (PALETTE[0], "alpha"), (PALETTE[1], "beta")]


def test_report_makes_no_network_reference(sweep_report: tuple[Path, str]) -> None:
    _, text = sweep_report
    _no_network(text)
    page = Page(text)
    assert page.resources and all(r.startswith(("data:", "#")) for r in page.resources)
    assert "default-src 'none'" in text and "<script" not in text
    svgs = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', text)
    assert len(svgs) == len(DEFAULT_METRICS)
    for data in svgs:
        _no_network(base64.b64decode(data).decode("utf-8"))


def test_run_report_from_a_three_step_cpu_run(tmp_path: Path) -> None:
    from rlscope.config import RunConfig, TrainConfig
    from rlscope.tasks import TaskConfig
    from rlscope.train import train

    result = train(TrainConfig(
        run=RunConfig(num_steps=3, batch_size=16, eval_every=2, progress=False,
                      runs_dir=str(tmp_path / "runs"), name="tiny", device="cpu"),
        task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=16)))
    report = build_report(result.run_dir)
    assert report.html == result.run_dir / "report.html"
    text = report.html.read_text()
    _no_network(text)
    page = Page(text)
    assert page.sections == [s for s in SECTIONS if s != "crossings"]
    assert len(page.rows["final-table"]) == 1
    assert page.rows["final-table"][0][:3] == ["tiny", "grpo", "1"]
    assert ["method", "grpo"] in page.rows["options-table"]
    samples = list(iter_jsonl(result.run_dir / "samples.jsonl"))
    last = max(s["step"] for s in samples)
    shown = page.rows["samples-table"]
    assert 0 < len(shown) <= 6 and all(r[0] == str(last) for r in shown)
    assert page.classes.count("findings-run") == 1
    assert ["device", "cpu"] in page.rows["environment-table"]
    assert [f.metric for f in report.figures] == list(DEFAULT_METRICS)
    assert "mean ± SEM" not in text  # one run: no bands, no SEM wording in the titles


def test_cli_report_options_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    sweep = make_sweep(tmp_path / "sweep")
    out = tmp_path / "elsewhere" / "r.html"
    assert main(["report", str(sweep), "--out", str(out), "--metrics", "reward/mean",
                 "not/logged", "--samples", "2", "--no_doctor"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    text = out.read_text()
    page = Page(text)
    assert page.classes.count("report-figure") == 1
    assert "Not logged: not/logged" in text and "The doctor was not run" in text
    assert len(page.rows["samples-table"]) == 2 * len(NAMES)
    # alpha's final rewards at step 9 are 2.125, 2.375, 2.625; "not/logged" gets no column
    assert page.rows["final-table"][0] == ["alpha", "grpo", "3", "2.375 ± 0.25 (3)"]
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "neither results.csv" in capsys.readouterr().err


def test_cli_help_documents_report(capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--help"]) == 0
    assert "report" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["report", "--help"])
    assert info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--out", "--metrics", "--samples", "--no_doctor", "PATH"):
        assert flag in help_text


def test_report_on_a_crashed_run_and_a_sweep_missing_a_run_dir(tmp_path: Path) -> None:
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 0.5}\n{"step": 1, "rew')
    page = Page(build_report(crashed).html.read_text())
    assert len(page.rows["final-table"]) == 1 and "samples-table" not in page.rows

    sweep = make_sweep(tmp_path / "sweep")
    for f in (sweep / "runs" / "beta_s2").iterdir():
        f.unlink()
    (sweep / "runs" / "beta_s2").rmdir()
    for name in ("crossings.csv", "sweep.json"):
        (sweep / name).unlink()
    text = build_report(sweep).html.read_text()
    page = Page(text)
    assert "crossings" not in page.sections and "manifest-table" not in page.rows
    runs = {r[0]: r for r in page.rows["runs-table"]}
    assert len(runs) == len(NAMES) * len(SEEDS) + 1  # without sweep.json, from runs/
    assert runs["beta_s2"][4] == "no run directory" and runs[FAILED[0]][3] == str(FAILED[2])
    assert "beta_s2: no run directory" in text


def test_failed_run_shows_its_status_and_error(sweep_report: tuple[Path, str]) -> None:
    _, text = sweep_report
    runs = {r[0]: r for r in Page(text).rows["runs-table"]}
    run, name, seed, error = FAILED
    assert runs[run][1:5] == [name, "dg", str(seed), "failed"]
    assert runs[run][-1] == error and runs[run][7] == "doctor could not run"
    assert runs["alpha_s0"][4:8] == ["completed", "10", "1.5", "1 info"]
