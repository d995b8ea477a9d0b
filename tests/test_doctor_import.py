"""Doctor importers: every format on small inline logs, wrapped verl lines, errors that say
what was expected, and fuzzing (random truncation and garbage never raise)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from rich.console import Console

from rlscope.doctor import importers
from rlscope.doctor.diagnosis import run_doctor
from rlscope.doctor.importers import FORMATS, DoctorError, load, sniff
from rlscope.doctor.render import to_json, to_markdown, to_terminal
from rlscope.doctor.rules import diagnose
from rlscope.doctor.verl import parse_value
from rlscope.metrics.readers import wait_for_wandb

VERL_LINES = [
    "(TaskRunner pid=4242) step:1 - actor/entropy:np.float64(0.61) - actor/pg_loss:-0.02 - "
    "critic/score/mean:np.float64(0.25) - response_length/mean:np.float64(180.0) - "
    "timing_s/gen:np.float64(12.5) - timing_s/step:np.float64(20.0) - training/epoch:np.int32(0)",
    "WARNING: something unrelated happened at 12:00",
    "step:2 - actor/entropy:np.float64(0.55) - actor/pg_loss:np.float64(-0.01) - "
    "critic/score/mean:np.float64(0.30) - response_length/mean:np.float64(190.0) - "
    "timing_s/gen:np.float64(13.0) - timing_s/step:np.float64(21.0) - training/epoch:np.int32(0)",
    "step:3 - val-core/openai/gsm8k/acc/mean@8:np.float64(0.41) - "
    "val-core/openai/gsm8k/acc/best@8/mean:np.float64(0.62)",
]


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _wrap(line: str, width: int) -> str:
    return "\n".join(line[i:i + width] for i in range(0, len(line), width))


def test_every_format_has_one_reader_and_auto_can_pick_each() -> None:
    # the registry is the one list of formats; every reader is reachable from `auto` through a
    # sign (a directory without one is read as a run directory, whose reader says what it needs)
    assert FORMATS == ("auto", *importers.READERS)
    signs = importers.DIRECTORY_SIGNS + importers.NAME_SIGNS + importers.TEXT_SIGNS
    assert {fmt for fmt, _ in signs} == set(importers.READERS)
    assert set(importers.DIRECTORY_FORMATS) == {"tinker", "trl", "run", "tensorboard",
                                                 "wandb_run"}
    assert [fmt for fmt, _ in importers.TEXT_SIGNS] == [
        "trl", "json", "tinker", "jsonl", "verl", "wandb", "csv"]


@pytest.mark.parametrize(("text", "value"), [
    ("0.5", 0.5), ("np.float64(0.5)", 0.5), ("np.int32(2)", 2.0), ("-1e-3", -1e-3),
    ("np.float32(nan)", float("nan")), ("True", 1.0), ("tensor(0.25)", 0.25),
    ("tensor(0.25, device='cuda:0')", 0.25), ("np.float64(", None), ("abc", None),
])
def test_verl_values(text: str, value: float | None) -> None:
    got = parse_value(text)
    if value is None:
        assert got is None
    elif value != value:
        assert got is not None and got != got
    else:
        assert got == value


@pytest.mark.parametrize("width", [0, 37, 64, 101])
def test_verl_log_with_wrapped_lines_reads_every_value(tmp_path: Path, width: int) -> None:
    """The same log, unwrapped or wrapped by a terminal at 37, 64 or 101 columns (in the middle
    of keys and numbers), gives the same table."""
    lines = [_wrap(line, width) if width and line.startswith(("(", "step")) else line
             for line in VERL_LINES]
    path = _write(tmp_path, "verl.log", "\n".join(lines) + "\n")
    assert sniff(path) == "verl"
    (table,) = load(path).tables
    entropy = table.first("actor/entropy", "policy/entropy")
    assert entropy is not None
    steps, values = table.series(entropy)
    assert steps.tolist() == [1.0, 2.0] and values.tolist() == [0.61, 0.55]
    length = table.first("length/mean", "response_length/mean")
    assert length is not None and table.values(length).tolist() == [180.0, 190.0]
    val = [n for n in table.names() if n.startswith("val-core/")]
    assert sorted(val) == ["val-core/openai/gsm8k/acc/best@8/mean",
                           "val-core/openai/gsm8k/acc/mean@8"]
    assert table.values("val-core/openai/gsm8k/acc/mean@8").tolist() == [0.41]
    assert table.problems == []


def test_verl_malformed_value_is_reported_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "verl.log", "noise\nstep:1 - a/b:np.float64(0.5) - c/d:oops\n"
                                        "step:2 - a/b:0.75\n")
    (table,) = load(path).tables
    assert table.values("a/b").tolist() == [0.5, 0.75]
    assert [(p.line, "c/d" in p.message) for p in table.problems] == [(2, True)]


def test_a_log_with_many_distinct_names_is_read_in_linear_time(tmp_path: Path) -> None:
    """30,000 distinct metric names (one per line): the renamer looked each new name up in
    the list of names given so far (quadratic: about 10 s here)."""
    import time

    path = _write(tmp_path, "many.jsonl", "".join(
        json.dumps({"step": i, f"m{i}": 1.0}) + "\n" for i in range(30_000)))
    start = time.perf_counter()
    (table,) = load(path, "jsonl").tables
    assert time.perf_counter() - start < 3.0
    assert len(table.names()) == 30_000 and table.values("m29999").tolist() == [1.0]


@pytest.mark.parametrize(("text", "value"), [
    ("tensor(" + "," * 20_000, None), ("tensor(" + ",a" * 20_000 + ")x", None),
    ("tensor(1.5" + ", a" * 20_000 + ")", 1.5)], ids=["commas", "commas_unclosed", "long"])
def test_verl_tensor_value_with_many_commas_parses_in_linear_time(text: str,
                                                                  value: float | None) -> None:
    """tensor(...) with 20,000 commas: the lazy value group backtracked quadratically (3 to
    6 s here)."""
    import time

    start = time.perf_counter()
    assert parse_value(text) == value
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("tail", ["a" * 40_000 + " x", "a-" * 20_000, "k:" + "-a" * 20_000],
                         ids=["token_without_colon", "dashed_token", "dashed_value"])
def test_verl_record_with_a_long_token_is_read_in_linear_time(tmp_path: Path,
                                                              tail: str) -> None:
    """A 40 KB token on a record line: an unbounded key in the pair pattern made the search
    quadratic (about 15 s here, a minute at 80 KB); the pair before it is still read."""
    import time

    path = _write(tmp_path, "verl.log", "step:1 - b:0.5 - " + tail + "\n")
    start = time.perf_counter()
    (table,) = load(path, "verl").tables
    assert time.perf_counter() - start < 3.0
    assert table.values("b").tolist() == [0.5]


def test_trl_trainer_state(tmp_path: Path) -> None:
    state = {"global_step": 2, "log_history": [
        {"step": 1, "loss": 0.1, "reward": 0.2, "kl": 0.0, "completions/mean_length": 12.0},
        {"step": 2, "loss": 0.05, "reward": 0.4, "kl": 0.01, "completions/mean_length": 14.0},
        {"step": 2, "train_runtime": 3.5, "train_loss": 0.075}]}
    path = _write(tmp_path, "trainer_state.json", json.dumps(state))
    assert sniff(path) == "trl"
    (table,) = load(path).tables
    assert table.fmt == "trl" and table.config["global_step"] == 2
    reward = table.first("reward/mean", "reward")
    assert reward is not None and table.values(reward).tolist() == [0.2, 0.4]
    assert table.values("train_runtime").tolist() == [3.5]


def test_wandb_chart_export_gives_one_table_per_run(tmp_path: Path) -> None:
    text = ("Step,run-a - train/reward,run-a - train/reward__MIN,run-a - train/reward__MAX,"
            "run-b - train/reward\n0,0.1,0.05,0.15,0.2\n1,0.3,0.2,0.4,\n2,,,,0.5\n")
    path = _write(tmp_path, "chart.csv", text)
    assert sniff(path) == "wandb"
    result = load(path)
    tables = {t.source: t for t in result.tables}
    assert set(tables) == {"run-a", "run-b"}
    name_a = tables["run-a"].names()
    assert len(name_a) == 1  # __MIN/__MAX companions are not separate metrics
    assert tables["run-a"].values(name_a[0]).tolist() == [0.1, 0.3]
    assert tables["run-b"].series(tables["run-b"].names()[0])[0].tolist() == [0.0, 2.0]


def test_wandb_history_and_generic_csv(tmp_path: Path) -> None:
    path = _write(tmp_path, "history.csv",
                  "_step,_runtime,train/loss,note\n0,1.0,0.9,a\n1,2.0,0.8,b\n2,3.0,,c\n")
    assert sniff(path) == "wandb"
    (table,) = load(path).tables
    assert table.values("train/loss").tolist() == [0.9, 0.8]
    assert any("note" in p.message for p in table.problems)  # text column reported once
    path = _write(tmp_path, "plain.csv", "iteration,loss\n5,1.0\n6,0.5\n")
    assert sniff(path) == "csv"
    (table,) = load(path).tables
    assert table.series("loss")[0].tolist() == [5.0, 6.0]


def test_jsonl_with_a_bad_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "m.jsonl", '{"step": 1, "x": 1.0}\n{"step": 2, "x": \n'
                                       '{"step": 3, "x": 3.0, "nested": {"y": 2}}\n[1, 2]\n')
    (table,) = load(path).tables
    assert table.series("x")[0].tolist() == [1.0, 3.0]
    assert table.values("nested/y").tolist() == [2.0]
    assert [p.line for p in table.problems] == [2, 4]


@pytest.mark.parametrize(("content", "message"), [
    ("", "is empty"), (b"\x00\x01\x02\xff" * 100, "looks binary"),
    ("just some prose without numbers\n", "could not tell its format"),
])
def test_unusable_files_raise_a_clear_error(tmp_path: Path, content: str | bytes,
                                            message: str) -> None:
    path = _write(tmp_path, "f.log", content)
    with pytest.raises(DoctorError, match=message):
        load(path)


def test_missing_path_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DoctorError, match="does not exist"):
        load(tmp_path / "nope.log")
    path = _write(tmp_path, "plain.csv", "step,loss\n1,2\n")
    with pytest.raises(DoctorError, match="--format 'xml' is unknown"):
        load(path, "xml")
    with pytest.raises(DoctorError, match=r"without metrics\.jsonl"):
        load(tmp_path)


def _fuzz_variants(text: str, seed: int, n: int = 60) -> list[bytes]:
    rng = random.Random(seed)
    data = text.encode()
    out = []
    for _ in range(n):
        cut = data[: rng.randrange(1, len(data) + 1)]
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        pos = rng.randrange(0, len(cut) + 1)
        out.append(cut[:pos] + junk + cut[pos:])
    return out


@pytest.mark.parametrize(("name", "text"), [
    ("verl.log", "\n".join(VERL_LINES * 3) + "\n"),
    ("chart.csv", "Step,r - m,r - m__MIN,r - m__MAX\n" + "".join(
        f"{i},{i / 10},{i / 20},{i / 5}\n" for i in range(30))),
    ("plain.csv", "step,a,b\n" + "".join(f"{i},{i},{-i}\n" for i in range(30))),
])
def test_fuzzed_logs_never_raise_anything_but_doctor_error(tmp_path: Path, name: str,
                                                           text: str) -> None:
    """Random truncations with random bytes inserted: the importers either read something or
    raise DoctorError with a message; no other exception escapes."""
    read = 0
    for i, variant in enumerate(_fuzz_variants(text, seed=zlib.crc32(name.encode()))):
        path = _write(tmp_path, f"{i}_{name}", variant)
        for fmt in ("auto", name.split(".")[0] if name.startswith("verl") else "csv"):
            try:
                result = load(path, fmt)
            except DoctorError:
                continue
            read += 1
            for table in result.tables:
                for metric in table.names():
                    table.series(metric)
    assert read > 0


# --- issue 16 parsing regressions -----------------------------------------------------------

def _terminal_wrap(line: str, width: int) -> str:
    """Wrap like a terminal copy: where a break falls on a space, the space is lost."""
    out, rest = [], line
    while len(rest) > width:
        head, rest = rest[:width], rest[width:]
        out.append(head.rstrip(" "))
        rest = rest.lstrip(" ")
    return "\n".join([*out, rest])


def test_verl_wrap_that_swallows_the_spaces_of_the_separator_loses_no_value(
        tmp_path: Path) -> None:
    """Regression: `a:0.5 - b:0.7` wrapped where a space falls at the break joins back as
    `a:0.5- b:0.7`, `a:0.5 -b:0.7` or `a:0.5-b:0.7`; every width keeps every value."""
    values = {f"actor/m{i}": round(0.1 * i - 0.35, 4) for i in range(8)}
    values |= {"val-core/openai/gsm8k/acc/mean@8": 0.41, "custom/small": -1e-05}
    body = " - ".join(f"{k}:np.float64({v})" for k, v in values.items())
    for width in range(23, 97, 3):
        lines = [_terminal_wrap(f"step:{s} - {body}", width) for s in (1, 2)]
        path = _write(tmp_path, f"w{width}.log", "\n".join(lines) + "\n")
        (table,) = load(path, "verl").tables
        assert table.problems == [], (width, table.problems[:2])
        for key, v in values.items():
            assert table.values(key).tolist() == [v, v], (width, key)


@pytest.mark.parametrize("joined", ["a/x:0.5-b/y:0.7", "a/x:0.5 -b/y:0.7", "a/x:0.5- b/y:0.7",
                                    "a/x:np.float64(0.5)-b/y:np.float64(0.7)"])
def test_verl_pairs_joined_without_spaces(tmp_path: Path, joined: str) -> None:
    path = _write(tmp_path, "v.log", f"step:3 - {joined} - c/z:-2e-05\n")
    (table,) = load(path, "verl").tables
    assert (table.values("a/x").tolist(), table.values("b/y").tolist(),
            table.values("c/z").tolist()) == ([0.5], [0.7], [-2e-05])
    assert table.problems == []


CHART = ("Step,run-a - train/reward,run-a - train/reward__MIN,run-a - train/reward__MAX,"
         "run-a - train/kl\n0,0.1,0.05,0.15,0.01\n1,0.3,0.2,0.4,0.02\n")
HISTORY = ",_step,_runtime,train/reward,train/kl\n0,0,1.0,0.1,0.01\n1,1,2.0,0.3,0.02\n"


@pytest.mark.parametrize("text", [CHART, HISTORY])
def test_wandb_export_with_a_utf8_bom_is_still_a_wandb_export(tmp_path: Path,
                                                              text: str) -> None:
    """Regression: Excel and some browsers save CSV with a UTF-8 byte-order mark, which hid
    the `Step` / `_step` header and made the export a plain CSV."""
    path = _write(tmp_path, "export.csv", b"\xef\xbb\xbf" + text.encode())
    assert sniff(path) == "wandb"
    result = load(path)
    assert result.fmt == "wandb"
    table = result.tables[0]
    assert table.framework == "trl" and table.source == ("run-a" if text is CHART
                                                         else "export.csv")
    assert table.series("reward/mean")[0].tolist() == [0.0, 1.0]
    assert table.values("reward/mean").tolist() == [0.1, 0.3]


def test_a_json_array_of_steps_is_read_as_json_not_csv(tmp_path: Path) -> None:
    """Regression: `[{"step": 1, ...}, ...]` has commas on its first line and was read as a
    CSV with a garbage header."""
    rows = [{"step": s, "actor/entropy": 0.5 - 0.1 * s, "critic/score/mean": 0.2 * s,
             "timing_s": {"gen": 3.0}} for s in (1, 2, 3)]
    for name, data in (("a.json", json.dumps(rows)),
                       ("pretty.json", json.dumps(rows, indent=2)),
                       ("bom.json", "\ufeff" + json.dumps(rows))):
        path = _write(tmp_path, name, data)
        assert sniff(path) == "json", name
        (table,) = load(path).tables
        assert table.fmt == "json" and table.framework == "verl"
        assert table.values("policy/entropy").tolist() == pytest.approx([0.4, 0.3, 0.2])
        assert table.values("time/sample").tolist() == [3.0, 3.0, 3.0]
    path = _write(tmp_path, "bad.json", "[{\"step\": 1, ")
    with pytest.raises(DoctorError, match="not a JSON array"):
        load(path)


def test_phase_table_lists_only_seconds(tmp_path: Path) -> None:
    """Regression: verl's agent loop logs token counts under timing_s/ (the slowest sample's
    response_length); they were listed as phases of the step."""
    lines = [f"step:{s} - timing_s/gen:{10.0 + s} - timing_s/update_actor:5.0 - "
             f"timing_s/step:20.0 - timing_s/agent_loop/slowest/response_length:{900 + s} - "
             f"timing_s/agent_loop/num_preempted/max:2 - timing_s/agent_loop/tool_calls/max:1.5"
             for s in (1, 2, 3)]
    path = _write(tmp_path, "v.log", "\n".join(lines) + "\n")
    (d,) = run_doctor(path)
    assert set(d.phases) == {"time/sample", "time/learn", "time/step",
                             "timing_s/agent_loop/tool_calls/max"}
    assert d.phases["time/sample"] == pytest.approx((12.0, 36.0 / 60.0))
    assert d.table.has("timing_s/agent_loop/slowest/response_length")  # kept, not a phase


def test_duplicated_steps_are_reported_with_their_resolution(tmp_path: Path) -> None:
    """Regression: a resumed run that logs steps 3-4 again was merged silently."""
    rows = [{"step": s, "reward/mean": 0.1 * s} for s in (1, 2, 3, 4)]
    rows += [{"step": s, "reward/mean": 1.0 + s} for s in (3, 4, 5)]
    path = _write(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    (d,) = run_doctor(path)
    assert d.table.values("reward/mean").tolist() == pytest.approx([0.1, 0.2, 4.0, 5.0, 6.0])
    (note,) = d.table.import_notes
    assert "2 step(s) logged more than once (3, 4" in note and "last value" in note
    assert json.loads(to_json([d]))[0]["import_notes"] == [note]
    assert "### Import notes" in to_markdown([d]) and note in to_markdown([d])
    console = Console(record=True, width=200)
    to_terminal([d], console)
    assert "logged more than once" in console.export_text()


def test_two_foreign_names_for_one_quantity_are_never_merged(tmp_path: Path) -> None:
    """verl logs the step time twice (timing_s/step, perf/time_per_step): one becomes
    time/step, the other keeps its name, so no step looks duplicated."""
    lines = [f"step:{s} - timing_s/step:{20.0 + s} - perf/time_per_step:{20.0 + s} - "
             f"actor/ppo_kl:np.float64({0.001 * s})" for s in (1, 2)]
    path = _write(tmp_path, "v.log", "\n".join(lines) + "\n")
    (table,) = load(path).tables
    assert table.values("time/step").tolist() == [21.0, 22.0]
    assert table.values("perf/time_per_step").tolist() == [21.0, 22.0]
    assert table.values("policy/kl_behaviour_k1").tolist() == pytest.approx([-0.001, -0.002])
    assert table.original["policy/kl_behaviour_k1"] == "actor/ppo_kl"
    notes = "\n".join(table.import_notes)
    assert "sign flipped" in notes and "perf/time_per_step kept under its own name" in notes
    assert "more than once" not in notes


@pytest.mark.parametrize(("name", "content"), [
    ("empty.csv", b""),
    ("blank.jsonl", b"\n\n   \n"),
    ("binary.log", bytes(range(256)) * 64),
    ("huge_line.log", b"step:1 - a/b:" + b"9" * 2_000_000),
    ("huge_line.csv", b"step," + b"x" * 2_000_000 + b"\n1,2\n"),
    ("utf16.csv", "Step,run - reward\n0,0.5\n1,0.6\n".encode("utf-16")),
    ("latin1.log", "step:1 - caf\xe9/x:0.5 - a/b:0.25\n".encode("latin-1")),
    ("bom_only.csv", b"\xef\xbb\xbf"),
    ("array_of_numbers.json", b"[1, 2, 3]"),
    ("deep.json", b"[" * 100_000),
    ("fake.wandb", b":W&B\xe1\xbe\x00" + bytes(range(256)) * 8),
    ("events.out.tfevents.123.host", b"not an event file"),
    ("big_int.jsonl", b'{"step": 1, "x": 1' + b"0" * 400 + b'}\n{"step": 2, "x": 1}\n'),
    ("big_step.jsonl", b'{"step": 1' + b"0" * 400 + b', "x": 1}\n{"step": 2, "x": 1}\n'),
    ("long_int.jsonl", b'{"step": 1, "x": 1' + b"0" * 5000 + b'}\n{"step": 2, "x": 1}\n'),
    ("deep_object.jsonl", b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"\n"),
    ("trl_list_step.json", b'{"log_history": [{"step": [1], "epoch": 1, "loss": 1}]}'),
], ids=lambda x: x if isinstance(x, str) else "")
def test_junk_never_crashes_the_doctor(tmp_path: Path, name: str, content: bytes) -> None:
    """Whatever the file, `load` (and the whole doctor) reads something or raises DoctorError
    with a message; no other exception escapes."""
    path = _write(tmp_path, name, content)
    for fmt in FORMATS:
        if fmt == "run":
            continue
        try:
            result = load(path, fmt)
        except DoctorError as e:
            assert str(e)
            continue
        for table in result.tables:
            for metric in table.names():
                table.series(metric)
    try:
        run_doctor(path)
    except DoctorError:
        pass


@pytest.mark.parametrize("config", [b"[1, 2]", b'"text"', b"[" * 100_000,
                                    b'{"a": 1' + b"0" * 5000 + b"}"],
                         ids=["list", "string", "deep", "long_int"])
def test_a_run_directory_with_a_foreign_config_json_is_still_diagnosed(tmp_path: Path,
                                                                      config: bytes) -> None:
    """config.json that is not a JSON object is a problem of the table, not a crash."""
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "reward/mean": 0.1 * i}) + "\n" for i in range(5)))
    (tmp_path / "config.json").write_bytes(config)
    table = load(tmp_path).tables[0]
    assert table.values("reward/mean").tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert table.config == {}
    assert any("config.json" in str(problem) for problem in table.problems)


# --- TensorBoard and W&B offline runs ---------------------------------------------------------

def test_tensorboard_event_files_are_read_with_translation(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for run, scale in (("run_a", 1.0), ("run_b", 2.0)):
        writer = SummaryWriter(log_dir=str(tmp_path / "tb" / run))
        for s in range(4):
            writer.add_scalar("train/reward", 0.25 * s * scale, s)
            writer.add_scalar("train/completions/mean_length", 10.0 + s, s)
        writer.close()
    assert sniff(tmp_path / "tb") == "tensorboard"
    tables = {t.source: t for t in load(tmp_path / "tb").tables}
    assert set(tables) == {"run_a", "run_b"}
    assert tables["run_b"].framework == "trl"
    assert tables["run_b"].values("reward/mean").tolist() == [0.0, 0.5, 1.0, 1.5]
    assert tables["run_a"].series("length/mean")[1].tolist() == [10.0, 11.0, 12.0, 13.0]
    event_file = next((tmp_path / "tb" / "run_a").glob("events.out.tfevents.*"))
    assert sniff(event_file) == "tensorboard"
    assert {t.source for t in load(event_file).tables} == {"run_a"}


def _leveldb_framed(records: list[bytes]) -> bytes:
    """A W&B transaction log holding ``records``, framed as W&B writes them (32 KiB blocks,
    a record longer than a block split into first/middle/last chunks)."""
    import struct

    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for record in records:
        pos = 0
        while True:
            left = 32768 - len(out) % 32768
            if left < 7:
                out += b"\0" * left
                continue
            n = min(left - 7, len(record) - pos)
            last = pos + n == len(record)
            kind = (1 if last else 2) if pos == 0 else (4 if last else 3)
            out += struct.pack("<IHB", 0, n, kind)
            out += record[pos:pos + n]
            pos += n
            if last:
                break
    return bytes(out)


def test_wandb_records_over_many_blocks_are_joined_in_linear_time() -> None:
    """A 64 MB record (2,000 chunks) comes back whole and fast: joining its chunks with +=
    copied quadratically (tens of seconds)."""
    import time

    from rlscope.metrics.wandb_log import wandb_chunks

    small, big = b"abc" * 10, bytes(range(256)) * (1 << 18)
    start = time.perf_counter()
    chunks = list(wandb_chunks(_leveldb_framed([small, big, small])))
    assert time.perf_counter() - start < 3.0
    assert chunks == [small, big, small]


def test_wandb_reader_rejects_what_is_not_a_transaction_log(tmp_path: Path) -> None:
    path = _write(tmp_path, "run-x.wandb", b"PK\x03\x04 a zip file")
    with pytest.raises(DoctorError, match="not a W&B transaction log"):
        load(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DoctorError, match="no W&B run"):
        load(tmp_path / "empty", "wandb_run")
    with pytest.raises(DoctorError, match="is a directory; --format verl reads a file"):
        load(tmp_path / "empty", "verl")


def test_missing_reader_package_says_what_to_install(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_logging_packages(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith(("tensorboard", "wandb")):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    (tmp_path / "tb").mkdir()
    _write(tmp_path / "tb", "events.out.tfevents.1.h", b"x")
    _write(tmp_path, "run-x.wandb", b":W&B\xe1\xbe\x00")
    monkeypatch.setattr(builtins, "__import__", no_logging_packages)
    for path in (tmp_path / "tb", tmp_path / "run-x.wandb"):
        with pytest.raises(DoctorError, match=r"install rlscope\[logging\]"):
            load(path)


def test_doctor_modules_do_not_import_torch_or_the_logging_packages() -> None:
    code = ("import sys, rlscope.doctor.importers, rlscope.metrics.readers, "
            "rlscope.doctor.diagnosis; "
            "bad = [m for m in ('torch', 'wandb', 'tensorboard') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _jsonl_points(run_dir: Path) -> dict[tuple[str, float], float]:
    out = {}
    for file in ("metrics.jsonl", "eval.jsonl"):
        for line in (run_dir / file).read_text().splitlines():
            row = json.loads(line)
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[(k, float(row["step"]))] = float(v)
    return out


def test_train_log_to_tensorboard_and_wandb_reads_back_equal_to_metrics_jsonl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--log_to tensorboard,wandb` (W&B offline: no WANDB_MODE, no key): the doctor reads the
    event files and the offline run back, and every value equals metrics.jsonl's (TensorBoard
    stores float32)."""
    from rlscope.config import RunConfig, TrainConfig
    from rlscope.tasks import TaskConfig
    from rlscope.train import train

    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    monkeypatch.setenv("WANDB_SILENT", "true")
    # wandb 0.31 resolves its server's host name even offline; keep the test off the network
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    cfg = TrainConfig(method="grpo", task_options=TaskConfig(seq_len=4, eval_batches=1,
                                                             eval_batch_size=8),
                      run=RunConfig(num_steps=3, batch_size=16, eval_every=2, device="cpu",
                                    progress=False, runs_dir=str(tmp_path), doctor_every=0,
                                    log_to="tensorboard,wandb"))
    result = train(cfg)
    run_dir = Path(result.run_dir)
    expected = _jsonl_points(run_dir)
    assert len(expected) > 100
    assert next((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))  # offline, no network
    for path, fmt, rel in ((run_dir / "tensorboard", "tensorboard", 1e-6),
                           (run_dir / "wandb", "wandb_run", 1e-12)):
        (table,) = load(path).tables
        assert table.fmt == fmt and table.framework is None  # our own names, untranslated
        got = {(name, float(s)): float(v) for name in table.names()
               for s, v in zip(*table.series(name), strict=True)}
        assert set(got) == set(expected), fmt
        for key, v in expected.items():
            assert got[key] == pytest.approx(v, rel=rel, abs=1e-30), (fmt, key)


def test_log_to_is_checked_before_training() -> None:
    from rlscope.config import ConfigError, RunConfig, TrainConfig, validate
    from rlscope.metrics.sinks import parse_log_to

    assert parse_log_to("none") == () and parse_log_to("") == ()
    assert parse_log_to("wandb, tensorboard,wandb") == ("wandb", "tensorboard")
    with pytest.raises(ConfigError, match=r"unknown target.*mlflow"):
        validate(TrainConfig(run=RunConfig(log_to="tensorboard,mlflow")))


@pytest.mark.parametrize(("environ", "netrc", "mode"), [
    ({}, "", "offline"),
    ({"WANDB_MODE": "online"}, "", None),
    ({"WANDB_MODE": "disabled"}, "", None),
    ({"WANDB_API_KEY": "x" * 40}, "", None),
    ({}, "machine api.wandb.ai\n  login user\n  password " + "y" * 40 + "\n", None),
    ({}, "machine example.org\n  login a\n  password b\n", "offline"),
])
def test_wandb_is_offline_unless_the_user_configured_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], netrc: str,
        mode: str | None) -> None:
    from rlscope.metrics.sinks import wandb_mode

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("NETRC", raising=False)
    if netrc:
        (tmp_path / ".netrc").write_text(netrc)
        (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode(environ) == mode


def test_wandb_offline_run_uses_the_frameworks_own_step(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A TRL run logged to W&B: transformers' callback logs `train/global_step` and W&B counts
    every log call in `_step` (evaluations too); the doctor uses the former."""
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # never leave the machine
    monkeypatch.setenv("HOME", str(tmp_path))
    run = wandb.init(project="p", dir=str(tmp_path), name="trl-run", mode="offline")
    for global_step in (10, 20, 30):
        run.log({"train/reward": global_step / 100, "train/kl": 0.01,
                 "train/global_step": global_step})
        run.log({"eval/reward": global_step / 50, "train/global_step": global_step})
    sync_file = Path(run.settings.sync_file)
    run.finish()
    assert wait_for_wandb(sync_file)  # the file is written in the background
    assert sniff(tmp_path / "wandb") == "wandb_run"
    (table,) = load(tmp_path / "wandb").tables
    assert table.framework == "trl"
    assert table.series("reward/mean")[0].tolist() == [10.0, 20.0, 30.0]
    assert table.values("reward/mean").tolist() == [0.1, 0.2, 0.3]
    assert table.series("eval/reward")[0].tolist() == [10.0, 20.0, 30.0]
    assert not any(n.endswith("global_step") for n in table.names())
    (record_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert sniff(record_file) == "wandb_run"
    assert load(record_file).tables[0].values("reward/mean").tolist() == [0.1, 0.2, 0.3]


def test_a_trl_name_under_the_wandb_train_prefix_is_read_under_its_own_name(
        tmp_path: Path) -> None:
    """transformers' W&B callback logs every TRL metric as `train/<key>`. An untranslated one
    (`frac_reward_zero_std`, 1 − our group/mixed_rate) loses the logger's prefix, so the
    no_signal rule reads it; a bare column of the same name in the file is kept apart, never
    merged into it."""
    path = _write(tmp_path, "history.csv",
                  "_step,train/reward,train/frac_reward_zero_std,train/completions/mean_length\n"
                  "0,0.1,0.75,5\n1,0.1,0.875,5\n2,0.1,1.0,6\n")
    (table,) = load(path).tables
    assert table.framework == "trl"
    assert table.values("frac_reward_zero_std").tolist() == [0.75, 0.875, 1.0]
    assert "train/frac_reward_zero_std" not in table.names()
    findings, _ = diagnose(table)
    (f,) = [f for f in findings if f.id == "no_signal"]
    assert f.evidence["metric"] == "frac_reward_zero_std"
    path = _write(tmp_path, "both.csv",
                  "_step,train/reward,train/frac_reward_zero_std,frac_reward_zero_std\n"
                  "0,0.1,0.75,0.5\n1,0.1,0.875,0.5\n")
    (table,) = load(path).tables
    assert table.values("frac_reward_zero_std").tolist() == [0.75, 0.875]
    assert table.values("frac_reward_zero_std (as logged)").tolist() == [0.5, 0.5]


def test_a_foreign_name_logged_only_as_nan_does_not_keep_the_canonical_name(
        tmp_path: Path) -> None:
    """TRL's classic ppo/policy/entropy claims policy/entropy first but logs only inf (not
    stored); the preferred policy/entropy_avg then gets the name (a KeyError before)."""
    path = tmp_path / "trainer_state.json"
    path.write_text('{"log_history": [{"step": 0, "ppo/policy/entropy": Infinity, '
                    '"policy/entropy_avg": 1.5}, {"step": 1, "ppo/policy/entropy": NaN, '
                    '"policy/entropy_avg": 1.25}]}')
    (table,) = load(path).tables
    assert table.values("policy/entropy").tolist() == [1.5, 1.25]
    assert table.original["policy/entropy"] == "policy/entropy_avg"
    assert not table.has("ppo/policy/entropy")


def test_a_trl_evaluation_entry_does_not_make_its_step_look_logged_twice(tmp_path: Path) -> None:
    """transformers stamps every log entry with `epoch`: the training and the evaluation
    entries of step 20 both carry epoch 0.5. That is one step, not a resumed run; a real
    rewrite of the step (another epoch value) is still reported."""
    state = {"log_history": [
        {"step": 20, "epoch": 0.5, "reward": 0.3, "loss": 0.1},
        {"step": 20, "epoch": 0.5, "eval_reward": 0.4},
        {"step": 40, "epoch": 1.0, "reward": 0.5, "loss": 0.1}]}
    path = _write(tmp_path, "trainer_state.json", json.dumps(state))
    (table,) = load(path).tables
    assert table.import_notes == [] and table.duplicated_steps() == {}
    assert table.values("epoch").tolist() == [0.5, 1.0]
    state["log_history"].append({"step": 40, "epoch": 1.5, "reward": 0.6})  # a resumed run
    path.write_text(json.dumps(state))
    (table,) = load(path).tables
    assert table.duplicated_steps() == {"epoch": [40.0], "reward/mean": [40.0]}


def test_a_tinker_cookbook_log_path_is_read_as_tinker_not_as_a_run(tmp_path: Path) -> None:
    """tinker-cookbook writes metrics.jsonl (and its own config.json) into ``log_path``; the
    directory is tinker's log, not an rlscope run directory: its findings speak in the
    cookbook's settings (`rlscope doctor <log_path>` gave ``framework=rlscope`` advice before)."""
    log_path = tmp_path / "math_rl"
    log_path.mkdir()
    fixture = Path(__file__).parent / "fixtures" / "doctor" / "tinker_metrics.jsonl"
    (log_path / "metrics.jsonl").write_bytes(fixture.read_bytes())
    (log_path / "config.json").write_text('{"log_path": "math_rl", "learning_rate": 4e-05}')
    result = importers.load(log_path)
    assert result.fmt == "tinker"
    [table] = result.tables
    assert table.framework == "tinker" and table.source == "math_rl"
    assert table.n_points == importers.load(fixture).tables[0].n_points
    # an rlscope run directory with the same file layout stays a run
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 0.5, "policy/entropy": 1.0}\n'
                                       '{"step": 1, "reward/mean": 0.6, "policy/entropy": 0.9}\n')
    assert importers.load(run).fmt == "run"


def test_a_trl_output_dir_is_read_from_its_latest_checkpoint(tmp_path: Path) -> None:
    """TRL saves ``trainer_state.json`` in each ``output_dir/checkpoint-<N>/``; the doctor reads
    the checkpoint directory itself, or the output_dir's latest checkpoint (by N, not by name:
    checkpoint-100 is later than checkpoint-99), whose log history holds every earlier step."""
    real = Path(__file__).parent / "fixtures" / "doctor" / "trl_grpo_trainer_state.json"
    out = tmp_path / "grpo_out"
    for n, text in ((99, '{"log_history": [{"step": 1, "loss": 0.5}]}'),
                    (100, real.read_text())):
        (out / f"checkpoint-{n}").mkdir(parents=True)
        (out / f"checkpoint-{n}" / "trainer_state.json").write_text(text)
    whole = load(real).tables[0]
    for path in (out, out / "checkpoint-100"):
        result = load(path)
        assert result.fmt == "trl"
        assert result.tables[0].n_points == whole.n_points
        assert result.tables[0].source == path.name
    with pytest.raises(DoctorError, match=r"holds no trainer_state\.json"):
        importers.READERS["trl"](tmp_path)  # --format trl on a folder without one
