"""The ``rlm_papers`` data: the shipped file is the generator's output, every example follows the
schema and the structure of COMPANIONS.md section 4, and the ``--train_file`` loader accepts
the alternative forms and names the example in every error."""

from __future__ import annotations

import collections
import json
import sys
from importlib import resources
from pathlib import Path

import pytest

from rlscope.data.make_rlm_papers import dumps, generate, main, sentence_spans
from rlscope.envs.rlm.data import check_prompt_lengths, load_examples, split_examples
from rlscope.envs.rlm.prompts import root_conversation

SHIPPED = Path(str(resources.files("rlscope.data").joinpath("rlm_papers.jsonl")))
SECTIONS = ["## Introduction", "## Method", "## Experiments", "## Limitations"]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    return [json.loads(line) for line in SHIPPED.read_text(encoding="utf-8").splitlines()]


def test_shipped_file_is_the_generators_output() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == dumps(generate(0, 128, 32))
    assert main(["--check", "--out", str(SHIPPED)]) == 0


def test_generator_is_deterministic_and_seeded(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    assert main(["--seed", "3", "--num_train", "2", "--num_eval", "1", "--out", str(out)]) == 0
    assert out.read_text() == dumps(generate(3, 2, 1))
    assert dumps(generate(3, 2, 1)) != dumps(generate(4, 2, 1))
    assert main(["--seed", "4", "--num_train", "2", "--num_eval", "1", "--out", str(out),
                 "--check"]) == 1


def _kind(question: str) -> str:
    if question.startswith("Which papers report"):
        return "lookup"
    return "comparison" if "highest" in question else "attribution"


def test_schema_and_structure(rows: list[dict[str, object]]) -> None:
    assert [r["split"] for r in rows] == ["train"] * 128 + ["eval"] * 32
    assert [r["id"] for r in rows] == [f"ex-{i:04d}" for i in range(160)]
    kinds = collections.Counter()
    for r in rows:
        assert set(r) == {"id", "split", "question", "papers", "gold", "answer"}
        papers = r["papers"]
        assert isinstance(papers, dict) and 3 <= len(papers) <= 5
        assert list(papers) == [f"P{i + 1}" for i in range(len(papers))]
        for text in papers.values():
            assert 1500 <= len(text) <= 3000
            lines = text.split("\n")
            assert lines[1].startswith("Abstract: ")
            assert [line for line in lines if line.startswith("## ")] == SECTIONS
        gold = r["gold"]
        assert isinstance(gold, list) and 1 <= len(gold) <= 6
        assert isinstance(r["answer"], str) and r["answer"]
        kinds[_kind(str(r["question"]))] += 1
    assert set(kinds) == {"lookup", "comparison", "attribution"}
    assert min(kinds.values()) > 160 / 3 - 20  # drawn uniformly


def test_every_gold_span_is_its_text_and_a_whole_sentence(rows: list[dict[str, object]]
                                                          ) -> None:
    n = 0
    for r in rows:
        papers = r["papers"]
        assert isinstance(papers, dict)
        for g in r["gold"]:  # type: ignore[attr-defined]
            text = papers[g["paper_id"]]
            assert text[g["start"]:g["end"]] == g["text"]
            assert (g["start"], g["end"]) in sentence_spans(text)
            assert g["text"].endswith(".") and g["text"][0].isupper()
            n += 1
    assert n > 160


def test_sentence_spans_by_hand() -> None:
    text = "Title\nAbstract: One a. Two b.\n## Method\nThree 1.5 c. Four."
    assert [text[s:e] for s, e in sentence_spans(text)] == [
        "Title", "One a.", "Two b.", "## Method", "Three 1.5 c.", "Four."]


def test_distractors_name_the_entities_with_other_values(rows: list[dict[str, object]]
                                                         ) -> None:
    """Some non-gold sentence names the question's dataset, or its technique."""
    hits = 0
    for r in rows:
        gold = {g["text"] for g in r["gold"]}  # type: ignore[attr-defined]
        question = str(r["question"])
        names = [w.strip("?,") for w in question.split() if "-" in w and w[-2].isdigit()]
        if not names:
            names = [question.split("introduces ")[1].split(",")[0]]
        papers = r["papers"]
        assert isinstance(papers, dict)
        others = [text[s:e] for text in papers.values() for s, e in sentence_spans(text)
                  if text[s:e] not in gold]
        hits += any(names[0] in o for o in others)
    assert hits > 100


def test_loader_reads_the_shipped_file_and_caps_the_train_split() -> None:
    examples = load_examples()
    train, held = split_examples(examples)
    assert (len(train), len(held)) == (128, 32)
    assert train[0].id == "ex-0000" and held[0].id == "ex-0128"
    capped = load_examples(None, max_examples=5)
    assert [e.id for e in split_examples(capped)[0]] == [f"ex-000{i}" for i in range(5)]
    assert len(split_examples(capped)[1]) == 32


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_loader_accepts_paper_lists_and_text_only_gold(tmp_path: Path) -> None:
    rows = [{"id": "a", "question": "Q?",
             "papers": [{"id": "P2", "text": "Title two\nAbstract: Same. Other."},
                        {"id": "P1", "text": "Title one\nAbstract: Same. Here."}],
             "gold": ["Same.", {"text": "Other."}]}]
    (e,) = load_examples(_write(tmp_path / "f.jsonl", rows))
    assert list(e.papers) == ["P1", "P2"] and e.split == "train"
    # first exact occurrence, papers in id order: "Same." is P1's, after "Title one\n" (10)
    # and "Abstract: " (10): 20..25; "Other." after 10 + 10 + len("Same. ") = 26: 26..32
    assert [(g.paper_id, g.start, g.end) for g in e.gold] == [("P1", 20, 25), ("P2", 26, 32)]


@pytest.mark.parametrize(("change", "message"), [
    ({"gold": ["Absent sentence."]}, "'bad': gold text 'Absent sentence.' occurs in no paper"),
    ({"gold": [{"paper_id": "P1", "start": 0, "end": 3, "text": "xyz"}]}, "'bad': gold span"),
    ({"gold": [{"paper_id": "P9", "text": "T."}]}, "'bad': gold names paper 'P9'"),
    ({"papers": "nope"}, "'bad': papers must be"),
    ({"question": ""}, "'bad': no question"),
    ({"gold": []}, "'bad': no gold span"),
])
def test_loader_errors_name_the_example(tmp_path: Path, change: dict[str, object],
                                        message: str) -> None:
    row = {"id": "bad", "question": "Q?", "papers": {"P1": "T. U."}, "gold": ["T."]} | change
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        load_examples(_write(tmp_path / "f.jsonl", [row]))


def test_loader_file_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_examples(tmp_path / "missing.jsonl")
    (tmp_path / "f.csv").write_text("x")
    with pytest.raises(ValueError, match=r"must be a \.jsonl or \.parquet"):
        load_examples(tmp_path / "f.csv")
    (tmp_path / "f.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ValueError, match=r"reading \.parquet needs pyarrow or pandas"):
        load_examples(tmp_path / "f.parquet")


def test_parquet_round_trip_where_available(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    row = {"id": "p", "question": "Q?", "papers": json.dumps({"P1": "T. U."}),
           "gold": json.dumps(["U."])}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "f.parquet")
    (e,) = load_examples(tmp_path / "f.parquet")
    assert (e.gold[0].paper_id, e.gold[0].start, e.gold[0].end) == ("P1", 3, 5)


def test_an_initial_prompt_over_the_limit_is_a_load_error() -> None:
    examples = load_examples(None, max_examples=2)[:2]

    def chars(conversation: list[dict[str, str]]) -> int:
        return sum(len(m["content"]) for m in conversation)

    longest = max(chars(root_conversation(e.question, e.papers)) for e in examples)
    check_prompt_lengths(examples, chars, longest)
    with pytest.raises(ValueError, match=r"first prompt has \d+ tokens, over --max_prompt_tokens"):
        check_prompt_lengths(examples, chars, longest - 1)
