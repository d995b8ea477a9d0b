"""The doctor on its labelled corpus (issue 16): precision and recall per rule must not drop
below the numbers committed in ``tests/fixtures/doctor/corpus/scores.json``; ``rlscope doctor
--eval DIR`` prints them. The corpus and how it was made: tests/fixtures/doctor/corpus/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlscope.cli import main
from rlscope.doctor.evaluate import EvalResult, evaluate, load_corpus

CORPUS = Path(__file__).parent / "fixtures" / "doctor" / "corpus"
COMMITTED = json.loads((CORPUS / "scores.json").read_text())


@pytest.fixture(scope="module")
def result() -> EvalResult:
    return evaluate(CORPUS)


def test_the_corpus_has_at_least_16_small_labelled_cases() -> None:
    cases = load_corpus(CORPUS)
    assert len(cases) >= 16
    for case in cases:
        assert case.must_find or case.must_not_find, case.name
        assert not set(case.must_find) & set(case.must_not_find), case.name
        files = [case.log] if case.log.is_file() else list(case.log.iterdir())
        assert all(p.stat().st_size < 200_000 for p in files), case.name


def test_every_case_reads(result: EvalResult) -> None:
    assert result.errors == {}


def test_precision_and_recall_do_not_drop_below_the_committed_numbers(
        result: EvalResult) -> None:
    overall = result.as_dict()["overall"]
    assert overall["precision"] >= COMMITTED["overall"]["precision"] - 1e-9
    assert overall["recall"] >= COMMITTED["overall"]["recall"] - 1e-9
    for rule, committed in COMMITTED["rules"].items():
        score = result.rules[rule]
        for key in ("precision", "recall"):
            if committed[key] is not None:
                now = getattr(score, key)
                assert now is not None and now >= committed[key] - 1e-9, (rule, key, now,
                                                                          committed[key])


def _tiny_corpus(root: Path) -> Path:
    """Two cases in the corpus layout (a log file and expected.toml each)."""
    import numpy as np

    for name, entropy, must, must_not in (
            ("collapse", np.exp(-np.arange(40.0) / 5), '"entropy_collapse"', ""),
            ("healthy", np.full(40, 1.0), "", '"entropy_collapse"'),
            ("missed", np.full(40, 1.0), '"entropy_collapse"', "")):
        case = root / name
        case.mkdir()
        rows = [{"step": i, "policy/entropy": float(h)} for i, h in enumerate(entropy)]
        (case / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (case / "expected.toml").write_text(f"must_find = [{must}]\n"
                                            f"must_not_find = [{must_not}]\n")
    return root


def test_eval_command_prints_the_table_and_json(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    corpus = _tiny_corpus(tmp_path)
    assert main(["doctor", "--eval", str(corpus)]) == 0
    table = capsys.readouterr().out
    assert "| rule | TP | FN | FP | TN | precision | recall |" in table
    assert "| `entropy_collapse` | 1 | 1 | 0 | 1 | 1.00 | 0.50 | missed missed |" in table
    assert main(["doctor", "--eval", str(corpus), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rules"]["entropy_collapse"]["recall"] == 0.5
    assert data["overall"]["precision"] == 1.0
    assert "entropy_collapse" in data["cases"]["collapse"]
    assert "entropy_collapse" not in data["cases"]["healthy"]


def test_eval_of_a_directory_without_cases_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--eval", str(tmp_path)]) == 2
    assert "no case directory" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["must_find = 3", 'must_find = "entropy_collapse"',
                                  "must_not_find = [1]", "log = 3"])
def test_an_expected_toml_of_the_wrong_types_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str) -> None:
    corpus = _tiny_corpus(tmp_path)
    (corpus / "collapse" / "expected.toml").write_text(spec + "\n")
    assert main(["doctor", "--eval", str(corpus)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "expected.toml" in err and err.count("\n") == 1


def test_scores_count_true_and_false_positives(tmp_path: Path) -> None:
    r = evaluate(_tiny_corpus(tmp_path))
    s = r.rules["entropy_collapse"]
    assert (s.tp, s.fn, s.fp, s.tn) == (1, 1, 0, 1)
    assert s.precision == 1.0 and s.recall == 0.5 and s.missed == ["missed"]


def test_json_output_gives_each_unavailable_check_its_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    log = CORPUS / "verl_dapo_tiny_updates" / "verl_console.log"
    assert main(["doctor", str(log), "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)
    reasons = d["unavailable_reasons"]
    assert reasons["grad_clip_saturation"]["reason"] == "config"
    assert reasons["value_instability"] == {
        "reason": "missing", "text": "needs loss/value or value/explained_var"}
    assert "kl_too_small" not in reasons  # actor/ppo_kl is there: it ran


def test_no_unavailable_check_on_a_corpus_log_names_a_metric_the_log_has() -> None:
    """On every real and re-emitted log of the corpus (verl, TRL, OpenRLHF, cookbook, W&B),
    after translation: a check that could not run for a 'missing' metric names only metrics
    absent from the table, and none of the foreign names the translators map (the rules read
    our names: `actor/ppo_kl` is `policy/kl_behaviour_k1` by then)."""
    from rlscope.doctor.importers import load
    from rlscope.doctor.rules import diagnose

    checked = 0
    for case in load_corpus(CORPUS):
        for table in load(case.log).tables:
            _, unavailable = diagnose(table)
            for rule_id, u in unavailable.items():
                if u.reason == "missing":
                    assert not any(table.has(n) for n in u.needs), (case.name, rule_id, u)
                    assert not set(u.needs) & set(table.original.values()), (case.name, u)
                checked += 1
    assert checked > 100
