"""The REPL tools of the ``rlm_papers`` task (COMPANIONS.md section 4). This file's SOURCE is
the ``setup_source`` of every `rlscope.sandbox.repl.ReplSession` of a tree: the sandboxed child
executes it and calls `tools` (so it imports the standard library only, never rlscope); the
trusted parent imports the same module for the pure helpers (the scripted transcripts print
what these tools print).

Root tools (``data = {"kind": "root", "papers": {id: text}}``): ``context``,
``list_papers()``, ``search(query, paper_id=None, max_results=10)``,
``get_paper_abstract(paper_id)``, ``rlm_query(prompt, context=None)``,
``rlm_query_batched(prompts, context_list)``. Child tools (``data = {"kind": "child",
"paper", "paper_id"}``): ``paper``, ``paper_id``, ``search(query)``, ``extract_section(name)``.
The session adds ``FINAL``, ``FINAL_VAR`` and ``SHOW_VARS``. ``rlm_query*`` send
``{"op": "rlm_query", "prompts", "contexts"}`` to the parent, which answers ``{"answers":
[...]}`` or ``{"error": [name, message]}`` (a budget refusal raises `BudgetError` here).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

ABSTRACT_LABEL = "Abstract: "


class BudgetError(Exception):
    """An ``rlm_query*`` call over ``--max_children`` per tree or ``--max_children_per_call``;
    no child was spawned."""


def sentence_at(text: str, index: int) -> tuple[int, int]:
    """``(start, end)`` of the sentence of ``text`` holding character ``index``: sentences end
    at ``". "`` and at line ends; an ``Abstract: `` label is not part of one."""
    line_start = text.rfind("\n", 0, index) + 1
    line_end = text.find("\n", index)
    line_end = len(text) if line_end < 0 else line_end
    if text.startswith(ABSTRACT_LABEL, line_start) and index >= line_start + len(ABSTRACT_LABEL):
        line_start += len(ABSTRACT_LABEL)
    stop = text.rfind(". ", line_start, index)
    start = stop + 2 if stop >= 0 else line_start
    cut = text.find(". ", index, line_end)
    end = line_end if cut < 0 else cut + 1
    return start, end


def find_matches(papers: dict[str, str], query: str, paper_id: str | None = None,
                 max_results: int = 10) -> list[dict[str, Any]]:
    """Case-insensitive literal matches of ``query`` in ``papers`` (id order; only
    ``paper_id`` if given), at most ``max_results``: ``[{"paper_id", "start", "end",
    "sentence"}]`` with the match's offsets and its whole sentence."""
    if not isinstance(query, str) or not query:
        raise ValueError("search needs a non-empty query string")
    if paper_id is not None and paper_id not in papers:
        raise KeyError(f"no paper {paper_id!r}; papers: {', '.join(sorted(papers))}")
    needle = query.lower()
    out: list[dict[str, Any]] = []
    for pid in sorted(papers) if paper_id is None else [paper_id]:
        text = papers[pid]
        low = text.lower()
        at = low.find(needle)
        while at >= 0 and len(out) < max_results:
            start, end = sentence_at(text, at)
            out.append({"paper_id": pid, "start": at, "end": at + len(query),
                        "sentence": text[start:end]})
            at = low.find(needle, at + 1)
    return out


def title_of(text: str) -> str:
    """A paper's title: its first line."""
    return text.split("\n", 1)[0]


def abstract_of(text: str) -> str:
    """A paper's abstract paragraph (the line after its ``Abstract: `` label), "" if none."""
    for line in text.split("\n"):
        if line.startswith(ABSTRACT_LABEL):
            return line[len(ABSTRACT_LABEL):]
    return ""


def section_of(text: str, name: str) -> str:
    """The body of the section ``## name`` (case-insensitive; ``Abstract`` too); ValueError
    naming the sections there are if absent."""
    if not isinstance(name, str):
        raise TypeError("extract_section needs a section name string")
    if name.strip().lower() == "abstract":
        return abstract_of(text)
    lines = text.split("\n")
    names = [line[3:] for line in lines if line.startswith("## ")]
    for i, line in enumerate(lines):
        if line.startswith("## ") and line[3:].strip().lower() == name.strip().lower():
            body = []
            for rest in lines[i + 1:]:
                if rest.startswith("## "):
                    break
                body.append(rest)
            return "\n".join(body)
    raise ValueError(f"no section {name!r}; sections: Abstract, {', '.join(names)}")


def parse_answer(answer: Any) -> Any:
    """A child's answer as the root sees it: a string through `ast.literal_eval` (the raw
    string if that fails), anything else as is (None: the child gave no FINAL)."""
    if not isinstance(answer, str):
        return answer
    try:
        return ast.literal_eval(answer)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return answer


def tools(data: dict[str, Any], request: Callable[[Any], Any]) -> dict[str, Any]:
    """The names a session gives the user's code (module docstring); ``request`` sends a
    payload to the parent and returns its reply."""
    if data["kind"] == "child":
        paper, pid = str(data["paper"]), str(data["paper_id"])

        def child_search(query: str) -> list[dict[str, Any]]:
            """Case-insensitive literal matches in this paper."""
            return find_matches({pid: paper}, query, max_results=10**9)

        def extract_section(name: str) -> str:
            """The body of section ``name`` of this paper."""
            return section_of(paper, name)

        return {"paper": paper, "paper_id": pid, "search": child_search,
                "extract_section": extract_section}
    papers = {str(k): str(v) for k, v in data["papers"].items()}

    def list_papers() -> list[tuple[str, str]]:
        """``[(id, title)]`` in id order."""
        return [(k, title_of(papers[k])) for k in sorted(papers)]

    def search(query: str, paper_id: str | None = None,
               max_results: int = 10) -> list[dict[str, Any]]:
        """Case-insensitive literal matches: ``[{paper_id, start, end, sentence}]``."""
        return find_matches(papers, query, paper_id, max_results)

    def get_paper_abstract(paper_id: str) -> str:
        """The abstract paragraph of ``paper_id``."""
        if paper_id not in papers:
            raise KeyError(f"no paper {paper_id!r}; papers: {', '.join(sorted(papers))}")
        return abstract_of(papers[paper_id])

    def ask(prompts: list[str], contexts: list[str]) -> list[Any]:
        reply = request({"op": "rlm_query", "prompts": prompts, "contexts": contexts})
        if "error" in reply:
            name, message = reply["error"]
            raise BudgetError(message) if name == "BudgetError" else RuntimeError(message)
        return [parse_answer(a) for a in reply["answers"]]

    def rlm_query(prompt: str, context: str | None = None) -> Any:
        """Run one child on ``prompt`` with one paper (an id or a text) and return its
        answer."""
        if context is None:
            raise ValueError("rlm_query needs context: a paper id or a text string")
        if not isinstance(prompt, str) or not isinstance(context, str):
            raise TypeError("rlm_query(prompt, context): both must be strings")
        return ask([prompt], [context])[0]

    def rlm_query_batched(prompts: list[str], context_list: list[str]) -> list[Any]:
        """`rlm_query` for several prompts, answers in order."""
        prompts, context_list = list(prompts), list(context_list)
        if len(prompts) != len(context_list):
            raise ValueError(f"rlm_query_batched: {len(prompts)} prompts but "
                             f"{len(context_list)} contexts")
        if not all(isinstance(x, str) for x in prompts + context_list):
            raise TypeError("rlm_query_batched: prompts and contexts must be strings")
        return ask(prompts, context_list) if prompts else []

    return {"context": dict(papers), "list_papers": list_papers, "search": search,
            "get_paper_abstract": get_paper_abstract, "rlm_query": rlm_query,
            "rlm_query_batched": rlm_query_batched, "BudgetError": BudgetError}
