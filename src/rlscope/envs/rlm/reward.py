"""The rewards of the ``rlm_papers`` task, on the root's final answer only (COMPANIONS.md
section 4, "Reward").

``char_f1`` (the default): the answer's predicted strings are located in the papers, and the
located characters are compared with the gold characters. ``judge`` (optional): an
OpenAI-compatible endpoint grades precision and recall 1..10; reward = (p/10 + r/10)/2.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlscope.envs.rlm.config import RlmConfig
from rlscope.envs.rlm.data import GoldSpan

QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019", "`": "`"}
"""Opening → closing quote marks of a quoted line."""
BULLET = re.compile(r"^(?:[-*\u2022+]|\d+[.)])\s+")
PENALTY = 0.05
"""Reward lost per N predictions beyond N (``max_reward_predictions``)."""
JUDGE_TIMEOUT_S = 60.0
JUDGE_RETRIES = 5
"""Retries after the first attempt; then the run fails (never a silent zero)."""


@dataclass(frozen=True)
class CharF1:
    """char_f1 of one answer: ``reward`` and its parts (``unlocated`` = u, the total length
    of the predicted strings found in no paper)."""

    reward: float
    precision: float
    recall: float
    f1: float
    n_pred: int
    unlocated: int


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
        return list(value)
    return None


def _strip_quotes(line: str) -> str:
    line = line.strip()
    while len(line) >= 2 and QUOTES.get(line[0]) == line[-1]:
        line = line[1:-1].strip()
    return line.strip("".join(QUOTES) + "".join(QUOTES.values())).strip()


def parse_predictions(value: Any) -> list[str]:
    """The predicted strings of a final answer, in this order of preference: the value itself
    if a list or tuple of str; else (other values as their JSON text, None as no answer), for
    its text, a JSON array of strings or a JSON object whose ``evidence`` is one; else its
    quoted lines (a line in matching quotes), unquoted; else its non-empty lines with bullets
    (``-``, ``*``, ``•``, ``1.``) and quotes stripped. Empty strings are dropped."""
    if value is None:
        return []
    listed = _strings(value)
    if listed is None:
        if isinstance(value, str):
            text = value
        else:
            try:
                text = json.dumps(value)
            except (TypeError, ValueError):
                text = str(value)
        try:
            decoded = json.loads(text)
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            decoded = decoded.get("evidence")
        listed = _strings(decoded)
        if listed is None:
            lines = [line.strip() for line in text.splitlines()]
            quoted = [line for line in lines
                      if len(line) >= 2 and QUOTES.get(line[0]) == line[-1]]
            listed = ([_strip_quotes(line) for line in quoted] if quoted
                      else [_strip_quotes(BULLET.sub("", line)) for line in lines])
    return [s for s in listed if s]


def char_f1(value: Any, papers: Mapping[str, str], gold: Sequence[GoldSpan],
            max_predictions: int = 12) -> CharF1:
    """Character F1 of a final answer (`parse_predictions`). Each predicted string is
    located at its first exact occurrence, papers in id order, giving a set P of (paper id,
    character index); G = the gold characters; u = total length of the strings found
    nowhere. precision = |P∩G| / (|P| + u), recall = |P∩G| / |G|, F1 = 2pr/(p + r) (0 if
    either is 0); reward = clip(F1 − 0.05·max(0, n_pred − N)/N, 0, 1), N = ``max_predictions``
    (COMPANIONS.md section 4; hallucinated text costs precision)."""
    if max_predictions < 1:
        raise ValueError(f"max_predictions={max_predictions} must be >= 1")
    predictions = parse_predictions(value)
    located: set[tuple[str, int]] = set()
    unlocated = 0
    for s in predictions:
        for pid in sorted(papers):
            at = papers[pid].find(s)
            if at >= 0:
                located.update((pid, i) for i in range(at, at + len(s)))
                break
        else:
            unlocated += len(s)
    gold_chars = {(g.paper_id, i) for g in gold for i in range(g.start, g.end)}
    hit = len(located & gold_chars)
    precision = hit / (len(located) + unlocated) if located or unlocated else 0.0
    recall = hit / len(gold_chars) if gold_chars else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else 0.0
    n = len(predictions)
    penalty = PENALTY * max(0, n - max_predictions) / max_predictions
    return CharF1(min(1.0, max(0.0, f1 - penalty)), precision, recall, f1, n, unlocated)


# --- judge ------------------------------------------------------------------------------------

class JudgeError(RuntimeError):
    """The judge endpoint failed after every retry, or answered out of protocol."""


Post = Callable[[str, dict[str, str], bytes, float], bytes]
"""``post(url, headers, body, timeout) -> response body``; raises OSError on failure."""


def judge_messages(answer: str, gold: Sequence[GoldSpan]) -> list[dict[str, str]]:
    """The chat request asking the judge to grade ``answer`` against the gold sentences."""
    evidence = "\n".join(f"- [{g.paper_id}] {g.text}" for g in gold)
    return [
        {"role": "system", "content": "You grade answers to questions about research papers. "
         "Reply with a JSON object only: {\"precision\": P, \"recall\": R}, integers from 1 "
         "to 10. precision: how much of the answer is supported by the gold evidence; recall: "
         "how much of the gold evidence the answer covers."},
        {"role": "user", "content": f"Gold evidence:\n{evidence}\n\nAnswer:\n{answer}"}]


def parse_judge_response(body: bytes | str | Mapping[str, Any]) -> tuple[int, int]:
    """``(precision, recall)`` from an OpenAI chat-completions response whose message is a
    JSON object (possibly fenced) of two integers in 1..10; JudgeError otherwise."""
    try:
        data = json.loads(body) if isinstance(body, (bytes, str)) else body
        content = data["choices"][0]["message"]["content"]
        match = re.search(r"\{.*\}", content, re.DOTALL)
        grades = json.loads(match.group(0) if match else content)
        p, r = grades["precision"], grades["recall"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise JudgeError(f"the judge's response is not a JSON grade: {str(body)[:200]}") from e
    if not all(type(x) is int and 1 <= x <= 10 for x in (p, r)):
        raise JudgeError(f"the judge's grades must be integers in 1..10 (got {p!r}, {r!r})")
    return p, r


def judge_score(precision: int, recall: int) -> float:
    """(p/10 + r/10) / 2."""
    return (precision / 10 + recall / 10) / 2


def _urllib_post(url: str, headers: dict[str, str], body: bytes, timeout: float) -> bytes:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return bytes(response.read())


def judge_reward(answer: Any, gold: Sequence[GoldSpan], cfg: RlmConfig, *,
                 post: Post = _urllib_post, sleep: Callable[[float], None] = time.sleep,
                 environ: Mapping[str, str] | None = None) -> float:
    """The judge reward of a final answer, `judge_score` of `judge_grades`."""
    return judge_score(*judge_grades(answer, gold, cfg, post=post, sleep=sleep,
                                     environ=environ))


def judge_grades(answer: Any, gold: Sequence[GoldSpan], cfg: RlmConfig, *,
                 post: Post = _urllib_post, sleep: Callable[[float], None] = time.sleep,
                 environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """The judge's (precision, recall) of a final answer: one chat-completions request to
    ``cfg.judge_base_url`` (timeout 60 s), retried 5 times with backoff 1, 2, 4, 8, 16 s on
    network errors and malformed grades; then JudgeError (the run fails). ``post``,
    ``sleep`` and ``environ`` are injectable (tests never contact an endpoint)."""
    env = os.environ if environ is None else environ
    key = env.get(cfg.judge_api_key_env, "")
    if not cfg.judge_base_url or not key:
        raise JudgeError("judge mode needs --judge_base_url and the API key variable "
                         f"{cfg.judge_api_key_env} set")
    text = answer if isinstance(answer, str) else json.dumps(answer, default=str)
    body = json.dumps({"model": cfg.judge_model, "temperature": 0.0,
                       "messages": judge_messages(text, gold)}).encode("utf-8")
    url = cfg.judge_base_url.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    last = ""
    for attempt in range(JUDGE_RETRIES + 1):
        if attempt:
            sleep(float(2 ** (attempt - 1)))
        try:
            return parse_judge_response(post(url, headers, body, JUDGE_TIMEOUT_S))
        except (OSError, urllib.error.URLError, JudgeError) as e:
            last = str(e)
    raise JudgeError(f"the judge at {url} failed {JUDGE_RETRIES + 1} times; last: {last[:300]}")
