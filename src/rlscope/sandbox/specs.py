"""The shipped function specifications (`rlscope/data/code_specs.json`) and the body rule,
shared by the single-turn code task (`rlscope.tasks.code`) and the multi-turn `code_repair`
environment (`rlscope.envs.code_repair`), so both read the same specs the same way.

A specification has a signature, a docstring, a reference body and hidden tests; the policy sees
``def <signature>:`` and the docstring, writes the body and ends it with the END token."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from rlscope.sandbox.common import TestCase

END = "<|end|>"
"""The stop token's name (id 256 of the code tokenizer, ``ByteTokenizer([END])``)."""


@dataclass(frozen=True)
class CodeSpec:
    """One function specification: the prompt, the reference body and the hidden tests."""

    function: str
    prompt: str
    reference: str
    tests: tuple[TestCase, ...]
    heldout: bool


def make_prompt(signature: str, doc: str) -> str:
    """``def <signature>:`` and the docstring, as the policy sees it."""
    return f'def {signature}:\n    """{doc}"""\n'


@functools.lru_cache(maxsize=1)
def load_specs() -> tuple[CodeSpec, ...]:
    """The shipped specifications (`rlscope/data/code_specs.json`)."""
    raw = json.loads(resources.files("rlscope.data").joinpath("code_specs.json")
                     .read_text(encoding="utf-8"))
    return tuple(CodeSpec(function=s["function"], prompt=make_prompt(s["signature"], s["doc"]),
                          reference=s["reference"], heldout=bool(s["heldout"]),
                          tests=tuple(TestCase(tuple(t["args"]), t["expected"])
                                      for t in s["tests"]))
                 for s in raw)


def extract_body(completion: str) -> str:
    """The function body in ``completion``: the text before the first END marker, cut before
    the first non-empty line that does not start with whitespace."""
    text = completion.split(END, 1)[0]
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.strip() and not line[0].isspace():
            return "".join(lines[:i])
    return text
