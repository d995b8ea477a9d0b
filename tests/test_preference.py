"""preference_rm: the hidden preference by hand and on adversarial text, the generated data
(warm-start answers, preference pairs, repeat probes) and its determinism by seed, and the
task's configuration errors."""

from __future__ import annotations

import time

import pytest
import torch
from test_arithmetic import rollout

from rlscope.tasks import TaskConfig, make_task
from rlscope.tasks.preference import (
    LIKED_WORDS,
    MAX_ANSWER_BYTES,
    WORDS,
    PreferenceTask,
    judge,
    true_preference,
    true_preference_ids,
)
from rlscope.tasks.text import STOP_ID
from rlscope.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


@pytest.mark.parametrize(("text", "terminated", "value"), [
    ("calm road hill", True, 1.0),          # one liked word
    ("calm bright golden", True, 3.0),       # three distinct liked words
    ("calm calm calm", True, -1.0),          # 1 liked − 2 repeats
    ("road road", True, -1.0),               # 0 liked − 1 repeat
    ("Calm, BRIGHT! (warm)", True, 3.0),     # case and ASCII punctuation ignored
    ("calm road", False, 0.0),               # 1 − 1 for no stop token
    ("", True, 0.0),
    ("", False, -1.0),
    ("   \t ", True, 0.0),
    ("calmly brightness", True, 0.0),        # whole words only
    ("calm. calm,", True, 0.0),              # the same word after stripping: a repeat
])
def test_true_preference_by_hand(text: str, terminated: bool, value: float) -> None:
    assert true_preference(text, terminated) == value


def test_judgement_parts() -> None:
    j = judge("warm kind warm stone kind")
    assert (j.words, j.liked, j.repeats, j.terminated) == (5, 2, 2, True)
    assert j.score == 0.0


def test_true_preference_on_adversarial_text() -> None:
    # unicode look-alikes and non-Latin words are not liked words
    assert true_preference("cálm ｃａｌｍ 平和 calm") == 1.0
    assert true_preference("\u0000calm\u0000") == 0.0  # NUL is not whitespace: one odd word
    # a huge answer is linear-time: 200,000 repeats of one liked word
    t0 = time.perf_counter()
    assert true_preference("calm " * 200_000) == 1.0 - 199_999
    assert time.perf_counter() - t0 < 2.0
    # ids: invalid UTF-8 becomes U+FFFD, ids outside the byte range are dropped, the first
    # newline ends the answer
    assert true_preference_ids([0xFF, 0xFE, 32, *b"calm", STOP_ID, *b" calm"], TOK) == 1.0
    assert true_preference_ids([*b"warm", 300, -5, *b" kind"], TOK) == 2.0 - 1.0  # unterminated
    assert true_preference_ids([], TOK) == -1.0
    assert true_preference_ids([STOP_ID], TOK) == 0.0


def test_liked_words_are_generated_words() -> None:
    assert LIKED_WORDS < set(WORDS) and len(set(WORDS)) == len(WORDS) == 24
    assert MAX_ANSWER_BYTES == 39  # 6 longest words (6+6+6+6+5+5) + 5 spaces + newline


def test_sft_pairs_are_well_formed_distinct_words() -> None:
    task = PreferenceTask(TaskConfig())
    pairs = task.sft_pairs(torch.Generator().manual_seed(0), 500)
    lengths = set()
    for prompt, answer in pairs:
        assert 0 < len(prompt) <= task.prompt_len
        assert answer[-1] == STOP_ID and STOP_ID not in answer[:-1]
        assert len(answer) <= MAX_ANSWER_BYTES <= task.completion_len
        words = bytes(answer[:-1]).decode().split(" ")
        assert set(words) <= set(WORDS) and len(set(words)) == len(words)
        assert [WORDS.index(w) for w in words] == sorted(WORDS.index(w) for w in words)
        lengths.add(len(words))
    assert lengths == {2, 3, 4, 5, 6}


def test_preference_pairs_follow_the_hidden_preference_and_the_seed() -> None:
    task = PreferenceTask(TaskConfig())
    a = task.preference_pairs(torch.Generator().manual_seed(7), 300)
    b = task.preference_pairs(torch.Generator().manual_seed(7), 300)
    c = task.preference_pairs(torch.Generator().manual_seed(8), 300)
    assert a == b and a != c and len(a) == 300
    gaps = []
    for pair in a:
        chosen = true_preference_ids(pair.chosen, TOK)
        rejected = true_preference_ids(pair.rejected, TOK)
        assert chosen > rejected  # ties are redrawn
        gaps.append(chosen - rejected)
    assert min(gaps) == 1.0 and max(gaps) >= 4.0
    # the chosen side is not just the longer one: length is a correlate, not the preference
    assert any(len(p.chosen) < len(p.rejected) for p in a)


def test_repeat_probe_pairs_differ_by_one_repeated_liked_word() -> None:
    task = PreferenceTask(TaskConfig())
    for pair in task.repeat_probe_pairs(torch.Generator().manual_seed(0), 100):
        chosen, rejected = bytes(pair.chosen[:-1]).decode(), bytes(pair.rejected[:-1]).decode()
        assert rejected.startswith(chosen + " ") and rejected.split()[-1] in LIKED_WORDS
        assert true_preference(chosen) - true_preference(rejected) == 1.0


def test_eval_metrics_without_a_reward_model() -> None:
    batch = rollout("preference_rm", ["Describe the sea."] * 4,
                    [b"calm bright road\n", b"calm calm calm\n", b"\n", b"warm kind"])
    m = make_task("preference_rm").eval_metrics(batch)
    assert "rm_score" not in m
    assert m["true_reward"].tolist() == [2.0, -1.0, 0.0, 1.0]
    assert m["test_error"].tolist() == pytest.approx([6 / 8, 1.0, 1.0, 7 / 8])
    assert m["liked_words"].tolist() == [2.0, 1.0, 0.0, 2.0]
    assert m["repeats"].tolist() == [0.0, 2.0, 0.0, 0.0]
    assert m["words"].tolist() == [3.0, 3.0, 0.0, 2.0]


def test_validation_names_what_to_change(tmp_path: object) -> None:
    task = make_task("preference_rm")
    assert task.validate() == []
    assert any("length_limit=20 must be >= 39" in e
               for e in make_task("preference_rm", TaskConfig(length_limit=20)).validate())
    errors = make_task("preference_rm", TaskConfig(difficulty=2, reward_noise=0.1)).validate()
    assert any("task.difficulty does not apply to preference_rm" in e for e in errors)
    assert any("task.reward_noise" in e for e in errors)
    # RL training needs a reward model; sft and rm do not
    assert isinstance(task, PreferenceTask)
    (msg,) = task.validate_training()
    assert "--rm_path" in msg and "rlscope rm" in msg
    missing = make_task("preference_rm", TaskConfig(rm_path="/nonexistent/rm")).validate()
    assert any("no reward model there" in e and "rlscope rm" in e for e in missing)
