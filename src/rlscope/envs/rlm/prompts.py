"""The shipped prompts of the ``rlm_papers`` task: the root's and the children's system
prompts (the tools and the protocol), the first user messages and how a turn's REPL block and
observation are read and written."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rlscope.envs.rlm.tools import title_of

Message = dict[str, str]
"""``{"role": "system" | "user" | "assistant", "content": str}``."""
Conversation = list[Message]

NO_BLOCK = "no repl block"
"""The observation of a turn without a ```` ```repl ```` block."""
NO_OUTPUT = "(no output)"
"""The observation of a block that printed nothing and raised nothing."""
REPL_BLOCK = re.compile(r"```repl[ \t]*\n(.*?)```", re.DOTALL)

ROOT_SYSTEM_PROMPT = """\
You answer questions about a set of research papers by writing Python in a persistent REPL.
Each turn, write exactly one code block fenced as ```repl ... ```; only the first block of a
turn runs, and what it prints (then the error, if any) comes back as the next message.
Variables persist between turns. You may import only re, json, math, collections, itertools,
functools, string, statistics, textwrap and difflib; open and input are unavailable.

Tools:
- context: dict paper id -> full text
- list_papers() -> [(id, title)]
- search(query, paper_id=None, max_results=10) -> [{"paper_id", "start", "end", "sentence"}]
  (case-insensitive literal matches)
- get_paper_abstract(paper_id) -> the abstract paragraph
- rlm_query(prompt, context=paper_id_or_text) -> the answer of a helper that reads that one
  paper with its own REPL
- rlm_query_batched(prompts, context_list) -> their answers, in order
- FINAL(answer) / FINAL_VAR(name): end with this answer (or the value of variable name)
- SHOW_VARS(): print your variables and their types
Helpers are limited per question and per call; going over raises BudgetError.

Answer with FINAL(list of the exact sentences from the papers that answer the question), each
sentence copied verbatim."""

CHILD_SYSTEM_PROMPT = """\
You read one research paper by writing Python in a persistent REPL, to answer a request.
Each turn, write exactly one code block fenced as ```repl ... ```; only the first block of a
turn runs, and what it prints (then the error, if any) comes back as the next message.
Variables persist between turns. You may import only re, json, math, collections, itertools,
functools, string, statistics, textwrap and difflib; open and input are unavailable.

Tools:
- paper: the paper's full text; paper_id: its id
- search(query) -> [{"paper_id", "start", "end", "sentence"}] (case-insensitive literal matches)
- extract_section(name) -> the text of a section (Abstract, Introduction, Method,
  Experiments, Limitations)
- FINAL(answer) / FINAL_VAR(name): end with this answer (or the value of variable name)
- SHOW_VARS(): print your variables and their types

Answer with FINAL(list of the exact sentences of the paper that answer the request)."""


def root_first_message(question: str, papers: Mapping[str, str]) -> str:
    """The question, then one ``id: title`` line per paper (texts only through the REPL)."""
    lines = "\n".join(f"{pid}: {title_of(papers[pid])}" for pid in sorted(papers))
    return f"Question: {question}\n\nPapers:\n{lines}"


def root_conversation(question: str, papers: Mapping[str, str]) -> Conversation:
    """The root's first prompt: system prompt and first user message."""
    return [{"role": "system", "content": ROOT_SYSTEM_PROMPT},
            {"role": "user", "content": root_first_message(question, papers)}]


def child_conversation(prompt: str, paper_id: str) -> Conversation:
    """A child's first prompt: system prompt, then the root's request and the paper's id
    (``(given text)`` when the root passed a text instead of an id)."""
    return [{"role": "system", "content": CHILD_SYSTEM_PROMPT},
            {"role": "user", "content": f"{prompt}\n\nPaper: {paper_id}"}]


def first_repl_block(text: str) -> str | None:
    """The code of the first closed ```` ```repl ```` block of ``text`` (None if none)."""
    match = REPL_BLOCK.search(text)
    return match.group(1) if match else None


def observation_message(observation: str) -> str:
    """The user message that carries a block's observation."""
    return observation if observation.strip() else NO_OUTPUT
