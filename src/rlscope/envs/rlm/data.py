"""The ``rlm_papers`` examples: the shipped file (``rlscope/data/rlm_papers.jsonl``, made by
``python -m rlscope.data.make_rlm_papers``) or a ``--train_file`` (``.jsonl``, or
``.parquet`` where pyarrow or pandas is importable) in the same schema, where papers may also
be a list of ``{"id", "text"}`` and gold may be text only (located at its first exact
occurrence, papers in id order). Every problem is a ValueError naming the example."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rlscope.envs.rlm.prompts import Conversation, root_conversation

SHIPPED = "rlm_papers.jsonl"


@dataclass(frozen=True)
class GoldSpan:
    """One gold sentence: ``papers[paper_id][start:end] == text``."""

    paper_id: str
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class RlmExample:
    """One question over several papers (``papers``: id → text, in id order)."""

    id: str
    split: str
    question: str
    papers: dict[str, str]
    gold: tuple[GoldSpan, ...]
    answer: str = ""


def _maybe_json(value: Any) -> Any:
    """Nested columns of a parquet file may hold JSON text."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def parse_example(row: Mapping[str, Any], index: int) -> RlmExample:
    """One example from a row of the schema (module docstring); ValueError naming it."""
    name = str(row.get("id", f"row {index}"))

    def bad(message: str) -> ValueError:
        return ValueError(f"rlm_papers example {name!r}: {message}")

    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise bad("no question")
    raw_papers = _maybe_json(row.get("papers"))
    if isinstance(raw_papers, Mapping):
        pairs = list(raw_papers.items())
    elif isinstance(raw_papers, Iterable) and not isinstance(raw_papers, str):
        try:
            pairs = [(p["id"], p["text"]) for p in raw_papers]
        except (TypeError, KeyError) as e:
            raise bad('papers must be {id: text} or a list of {"id", "text"}') from e
    else:
        raise bad('papers must be {id: text} or a list of {"id", "text"}')
    if not pairs or not all(isinstance(k, str) and isinstance(v, str) and k for k, v in pairs):
        raise bad("papers must map non-empty string ids to texts")
    papers = {k: v for k, v in sorted(pairs)}
    if len(papers) != len(pairs):
        raise bad("two papers share an id")
    raw_gold = _maybe_json(row.get("gold"))
    if isinstance(raw_gold, (str, Mapping)) or not isinstance(raw_gold, Iterable):
        raise bad("gold must be a list of spans or of texts")
    gold = []
    for g in raw_gold:
        g = _maybe_json(g) if isinstance(g, str) and g[:1] == "{" else g
        if isinstance(g, str):
            span = locate(g, papers)
            if span is None:
                raise bad(f"gold text {g[:60]!r} occurs in no paper")
            gold.append(span)
            continue
        if not isinstance(g, Mapping) or not isinstance(g.get("text"), str):
            raise bad("each gold entry needs a text")
        if g.get("paper_id") is None:
            span = locate(g["text"], papers)
            if span is None:
                raise bad(f"gold text {g['text'][:60]!r} occurs in no paper")
            gold.append(span)
            continue
        pid, text = str(g["paper_id"]), g["text"]
        start = g.get("start")
        end = g.get("end")
        if pid not in papers:
            raise bad(f"gold names paper {pid!r}, not among {', '.join(papers)}")
        if start is None or end is None:
            at = papers[pid].find(text)
            if at < 0 or not text:
                raise bad(f"gold text {text[:60]!r} does not occur in {pid}")
            start, end = at, at + len(text)
        if papers[pid][int(start):int(end)] != text or not text:
            raise bad(f"gold span {pid}[{start}:{end}] is not its text {text[:60]!r}")
        gold.append(GoldSpan(pid, int(start), int(end), text))
    if not gold:
        raise bad("no gold span")
    split = str(row.get("split") or "train")
    if split not in ("train", "eval"):
        raise bad(f"split must be train or eval (got {split!r})")
    return RlmExample(name, split, question, papers, tuple(gold), str(row.get("answer") or ""))


def locate(text: str, papers: Mapping[str, str]) -> GoldSpan | None:
    """``text`` at its first exact occurrence, papers in id order (None if absent)."""
    if not text:
        return None
    for pid in sorted(papers):
        at = papers[pid].find(text)
        if at >= 0:
            return GoldSpan(pid, at, at + len(text), text)
    return None


def _rows(path: Path) -> list[Mapping[str, Any]]:
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise ValueError(f"{path}:{n}: not a JSON object ({e})") from e
        return rows
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
            return list(pq.read_table(path).to_pylist())
        except ImportError:
            pass
        try:
            import pandas as pd
            return list(pd.read_parquet(path).to_dict("records"))
        except ImportError as e:
            raise ValueError(f"{path}: reading .parquet needs pyarrow or pandas "
                             "(pip install pyarrow), or give a .jsonl file") from e
    raise ValueError(f"{path}: the rlm_papers data must be a .jsonl or .parquet file")


def load_examples(path: str | Path | None = None, max_examples: int = 0
                  ) -> list[RlmExample]:
    """The examples of ``path`` (the shipped file when None or empty), the train split capped
    at ``max_examples`` (0: all; eval examples kept). A file without a ``split`` column is all
    train. Raises ValueError naming the first bad example (or a duplicate id)."""
    if max_examples < 0:
        raise ValueError(f"max_examples={max_examples} must be >= 0")
    if path:
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"rlm_papers data file {file} does not exist")
    else:
        file = Path(str(resources.files("rlscope.data").joinpath(SHIPPED)))
    examples = [parse_example(row, i) for i, row in enumerate(_rows(file))]
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{file}: duplicate example id "
                         f"{next(i for i in ids if ids.count(i) > 1)!r}")
    train = [e for e in examples if e.split == "train"]
    if max_examples:
        keep = {e.id for e in train[:max_examples]}
        examples = [e for e in examples if e.split == "eval" or e.id in keep]
    if not any(e.split == "train" for e in examples):
        raise ValueError(f"{file}: no train example")
    return examples


def split_examples(examples: Sequence[RlmExample]
                   ) -> tuple[list[RlmExample], list[RlmExample]]:
    """``(train, eval)``."""
    return ([e for e in examples if e.split == "train"],
            [e for e in examples if e.split == "eval"])


def check_prompt_lengths(examples: Sequence[RlmExample],
                         count_tokens: Callable[[Conversation], int],
                         max_prompt_tokens: int) -> None:
    """Raise ValueError naming the first example whose first root prompt (system prompt,
    question and paper titles) is longer than ``max_prompt_tokens`` (a load error,
    COMPANIONS.md section 4)."""
    for e in examples:
        n = count_tokens(root_conversation(e.question, e.papers))
        if n > max_prompt_tokens:
            raise ValueError(f"rlm_papers example {e.id!r}: its first prompt has {n} tokens, "
                             f"over --max_prompt_tokens {max_prompt_tokens}; raise it")
