"""The scripted warm start of ``rlm_papers`` (COMPANIONS.md section 4, an addition): a random
model cannot emit the REPL protocol, so ``rlscope sft --task rlm_papers`` first trains on
scripted transcripts. The script, per example: the root searches for the question's key term,
asks one child (``rlm_query``) about the paper of the first gold sentence, then answers
``FINAL`` with every gold sentence; the child searches its paper and answers ``FINAL`` with the
gold sentences of that paper.

`sft_pairs` writes the transcripts without running anything: each observation is computed here
with the tools' own helpers (`rlscope.envs.rlm.tools`), so it is what the REPL prints (a test
runs the same script through the real sandbox and compares). `ScriptedPolicy` is the same
script as a ``generate`` callable for `rlscope.envs.rlm.tree.run_trees`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rlscope.envs.rlm.data import RlmExample
from rlscope.envs.rlm.prompts import (
    ROOT_SYSTEM_PROMPT,
    Conversation,
    child_conversation,
    observation_message,
    root_conversation,
)
from rlscope.envs.rlm.tools import find_matches

DATASET_TERM = re.compile(r"\b([A-Z][A-Za-z]*-\d+)\b")
TECHNIQUE_TERM = re.compile(r"introduces (.+?),")


def search_term(example: RlmExample) -> str:
    """The term the script searches for: the question's dataset name (``Corvid-12``), else
    the technique it asks about, else the first three words of the first gold sentence (every
    choice occurs in that sentence or the search finds nothing, which the script tolerates)."""
    for pattern in (DATASET_TERM, TECHNIQUE_TERM):
        match = pattern.search(example.question)
        if match:
            return match.group(1)
    return " ".join(example.gold[0].text.split()[:3])


def child_request(example: RlmExample) -> str:
    """The root's request to its one child."""
    return f"Quote every sentence of this paper that helps answer: {example.question}"


def _block(code: str) -> str:
    return f"```repl\n{code}\n```"


def root_script(example: RlmExample) -> list[str]:
    """The root's three turns: search, one ``rlm_query``, FINAL of every gold sentence."""
    pid = example.gold[0].paper_id
    return [
        _block(f"hits = search({search_term(example)!r})\nfor h in hits:\n"
               "    print(h['paper_id'], h['sentence'])"),
        _block(f"answer = rlm_query({child_request(example)!r}, context={pid!r})\n"
               "print(answer)"),
        _block(f"FINAL({[g.text for g in example.gold]!r})"),
    ]


def child_script(example: RlmExample) -> list[str]:
    """The child's two turns: search its paper, FINAL of that paper's gold sentences."""
    pid = example.gold[0].paper_id
    return [
        _block(f"hits = search({search_term(example)!r})\nprint(len(hits), 'matches')"),
        _block(f"FINAL({[g.text for g in example.gold if g.paper_id == pid]!r})"),
    ]


def _observations(example: RlmExample, cut: int) -> tuple[list[str], list[str]]:
    """What the root's first two blocks and the child's first block print (cut to ``cut``
    characters, as the session cuts them)."""
    term, pid = search_term(example), example.gold[0].paper_id
    hits = find_matches(example.papers, term)
    root_1 = "".join(f"{h['paper_id']} {h['sentence']}\n" for h in hits)
    child_answer = [g.text for g in example.gold if g.paper_id == pid]
    root_2 = f"{child_answer!r}\n"
    child_1 = f"{len(find_matches({pid: example.papers[pid]}, term, max_results=10**9))} matches\n"
    return ([observation_message(root_1[:cut]), observation_message(root_2[:cut])],
            [observation_message(child_1[:cut])])


def _transcript(start: Conversation, turns: list[str], observations: list[str]
                ) -> tuple[Conversation, list[bool]]:
    conversation = list(start)
    for i, text in enumerate(turns):
        conversation.append({"role": "assistant", "content": text})
        if i < len(observations):
            conversation.append({"role": "user", "content": observations[i]})
    return conversation, [m["role"] == "assistant" for m in conversation]


def sft_pairs(examples: Sequence[RlmExample], max_observation_chars: int = 3000
              ) -> list[tuple[Conversation, list[bool]]]:
    """Two ``(conversation, assistant-turn mask)`` pairs per example: the root's scripted
    transcript and its child's; the mask is True on the assistant messages (the only ones the
    loss reads). Observations are cut to ``max_observation_chars`` as in the REPL."""
    out = []
    for e in examples:
        root_obs, child_obs = _observations(e, max_observation_chars)
        out.append(_transcript(root_conversation(e.question, e.papers), root_script(e),
                               root_obs))
        out.append(_transcript(child_conversation(child_request(e), e.gold[0].paper_id),
                               child_script(e), child_obs))
    return out


class ScriptedPolicy:
    """The script as a ``generate`` callable: a root conversation gets its example's next root
    turn, a child conversation its example's next child turn (found by the question in the
    first user message; past the script, a turn without a block)."""

    def __init__(self, examples: Sequence[RlmExample]) -> None:
        self.examples = list(examples)

    def _example(self, conversation: Conversation) -> RlmExample:
        first = conversation[1]["content"]
        for e in self.examples:
            if e.question in first:
                return e
        raise ValueError(f"no scripted example for the conversation {first[:80]!r}")

    def __call__(self, conversations: Sequence[Conversation],
                 max_new_tokens: int) -> list[str]:
        out = []
        for conversation in conversations:
            e = self._example(conversation)
            script = (root_script(e) if conversation[0]["content"] == ROOT_SYSTEM_PROMPT
                      else child_script(e))
            turn = sum(m["role"] == "assistant" for m in conversation)
            out.append(script[turn] if turn < len(script) else "I have nothing to add.")
        return out
