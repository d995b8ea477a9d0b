"""``rlm_papers`` rewards and options: char_f1 computed by hand, the order in which an answer is
read into predicted strings, the judge's request, parsing and retries on canned responses (no
endpoint is ever contacted), and `rlm_errors`."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from rlscope.envs.rlm.config import RlmConfig, rlm_errors
from rlscope.envs.rlm.data import GoldSpan
from rlscope.envs.rlm.reward import (
    JudgeError,
    char_f1,
    judge_reward,
    judge_score,
    parse_judge_response,
    parse_predictions,
)

# "Alpha beta. " is 12 characters, so P1's second sentence is P1[12:24]; P2 repeats it first.
PAPERS = {"P1": "Alpha beta. Gamma delta.", "P2": "Gamma delta. Epsilon."}
GOLD = [GoldSpan("P1", 12, 24, "Gamma delta.")]


def test_char_f1_by_hand() -> None:
    exact = char_f1(["Gamma delta."], PAPERS, GOLD)
    assert (exact.reward, exact.precision, exact.recall, exact.n_pred) == (1.0, 1.0, 1.0, 1)
    wrong = char_f1(["Alpha beta."], PAPERS, GOLD)  # 11 located characters, none gold
    assert (wrong.reward, wrong.precision, wrong.recall) == (0.0, 0.0, 0.0)
    # 12 gold characters located; "Made up text" (12 characters) found nowhere: u = 12
    # p = 12 / (12 + 12) = 0.5, r = 12 / 12 = 1, F1 = 2·0.5·1 / 1.5 = 2/3
    invented = char_f1(["Gamma delta.", "Made up text"], PAPERS, GOLD)
    assert (invented.precision, invented.recall, invented.unlocated) == (0.5, 1.0, 12)
    assert invented.reward == pytest.approx(2 / 3)
    # "delta." first occurs at P1[18:24], inside the gold: p = 6/6 = 1, r = 6/12 = 0.5, F1 = 2/3
    part = char_f1(["delta."], PAPERS, GOLD)
    assert (part.precision, part.recall) == (1.0, 0.5)
    assert part.reward == pytest.approx(2 / 3)
    # papers in id order: "Gamma delta." is located in P1, so gold in P2 is not hit
    assert char_f1(["Gamma delta."], PAPERS, [GoldSpan("P2", 0, 12, "Gamma delta.")]
                   ).reward == 0.0
    assert char_f1(None, PAPERS, GOLD).reward == 0.0
    assert char_f1([], PAPERS, GOLD).n_pred == 0


def test_char_f1_prediction_penalty_by_hand() -> None:
    # N = 2, four copies: F1 = 1, penalty 0.05·(4 − 2)/2 = 0.05
    assert char_f1(["Gamma delta."] * 4, PAPERS, GOLD, 2).reward == pytest.approx(0.95)
    assert char_f1(["Gamma delta."] * 2, PAPERS, GOLD, 2).reward == 1.0  # n_pred = N: none
    # N = 1, 21 copies of "delta.": F1 = 2/3, penalty 0.05·20/1 = 1 → clipped to 0
    clipped = char_f1(["delta."] * 21, PAPERS, GOLD, 1)
    assert (clipped.f1, clipped.reward) == (pytest.approx(2 / 3), 0.0)
    with pytest.raises(ValueError, match="max_predictions"):
        char_f1([], PAPERS, GOLD, 0)


@pytest.mark.parametrize(("value", "want"), [
    (["a", "b"], ["a", "b"]),
    (("a", "b"), ["a", "b"]),
    ('["Gamma delta.", "x"]', ["Gamma delta.", "x"]),
    ('{"evidence": ["e1", "e2"], "answer": "no"}', ["e1", "e2"]),
    ({"evidence": ["e1"]}, ["e1"]),
    ('The evidence:\n"Gamma delta."\n- not this one\n\u201cCurly.\u201d', ["Gamma delta.",
                                                                         "Curly."]),
    ("- Gamma delta.\n* Alpha beta.\n\n1. Epsilon.\n  2) 'Quoted' tail", [
        "Gamma delta.", "Alpha beta.", "Epsilon.", "Quoted' tail"]),
    ('"only line"', ["only line"]),
    ("[1, 2]", ["[1, 2]"]),
    (None, []),
    (42, ["42"]),
    (["", "x"], ["x"]),
])
def test_parse_predictions_order(value: Any, want: list[str]) -> None:
    assert parse_predictions(value) == want


def test_string_answer_uses_the_same_rules_as_a_list() -> None:
    as_json = char_f1(json.dumps(["Gamma delta.", "Made up text"]), PAPERS, GOLD)
    as_lines = char_f1("- Gamma delta.\n- Made up text", PAPERS, GOLD)
    assert as_json == as_lines == char_f1(["Gamma delta.", "Made up text"], PAPERS, GOLD)


def _response(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant",
                                                "content": content}}]}).encode()


def test_judge_response_parsing_on_canned_json() -> None:
    assert parse_judge_response(_response('{"precision": 8, "recall": 6}')) == (8, 6)
    assert parse_judge_response(_response('```json\n{"precision": 1, "recall": 10}\n```')
                                ) == (1, 10)
    assert judge_score(8, 6) == pytest.approx((0.8 + 0.6) / 2)
    for bad in ('{"precision": 11, "recall": 6}', '{"precision": 7.5, "recall": 6}',
                '{"precision": true, "recall": 6}', '{"precision": 7}', "great answer"):
        with pytest.raises(JudgeError):
            parse_judge_response(_response(bad))
    with pytest.raises(JudgeError):
        parse_judge_response(b'{"error": "rate limited"}')


JUDGE = RlmConfig(reward_mode="judge", judge_base_url="http://judge.invalid/v1/",
                  judge_model="m", judge_api_key_env="JUDGE_KEY")


def test_judge_retries_then_scores_without_contacting_anything() -> None:
    calls: list[tuple[str, dict[str, str], dict[str, Any], float]] = []
    sleeps: list[float] = []
    answers: list[Any] = [OSError("down"), _response("not json"),
                          _response('{"precision": 9, "recall": 7}')]

    def post(url: str, headers: dict[str, str], body: bytes, timeout: float) -> bytes:
        calls.append((url, headers, json.loads(body), timeout))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bytes(answer)

    reward = judge_reward(["Gamma delta."], GOLD, JUDGE, post=post, sleep=sleeps.append,
                          environ={"JUDGE_KEY": "k"})
    assert reward == pytest.approx((0.9 + 0.7) / 2)
    assert sleeps == [1.0, 2.0] and len(calls) == 3
    url, headers, body, timeout = calls[0]
    assert url == "http://judge.invalid/v1/chat/completions" and timeout == 60.0
    assert headers["Authorization"] == "Bearer k" and body["model"] == "m"
    assert "[P1] Gamma delta." in body["messages"][1]["content"]


def test_judge_fails_the_run_after_five_retries() -> None:
    sleeps: list[float] = []

    def post(url: str, headers: dict[str, str], body: bytes, timeout: float) -> bytes:
        raise OSError("down")

    with pytest.raises(JudgeError, match="failed 6 times"):
        judge_reward("x", GOLD, JUDGE, post=post, sleep=sleeps.append,
                     environ={"JUDGE_KEY": "k"})
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]
    with pytest.raises(JudgeError, match="JUDGE_KEY"):
        judge_reward("x", GOLD, JUDGE, post=post, sleep=sleeps.append, environ={})


def test_defaults_are_valid_and_each_rejection_names_the_flag() -> None:
    assert rlm_errors(RlmConfig()) == []
    cases = {
        "max_plan_tokens": 0, "max_child_tokens": 0, "max_root_turns": 0,
        "max_child_turns": 0, "max_observation_chars": 0, "max_prompt_tokens": 0,
        "max_reward_predictions": 0, "repl_timeout": 0.5, "max_children": -1,
        "max_children_per_call": 0, "max_examples": -1,
    }
    for name, value in cases.items():
        (error,) = rlm_errors(replace(RlmConfig(), **{name: value}))
        assert error.startswith(f"--{name} must be >="), error
    (error,) = rlm_errors(RlmConfig(max_children=2, max_children_per_call=3))
    assert error == "--max_children_per_call 3 exceeds --max_children 2; lower it"
    assert rlm_errors(RlmConfig(max_children=0, max_children_per_call=3)) == []


def test_judge_mode_needs_url_model_and_key(tmp_path: Any) -> None:
    assert rlm_errors(JUDGE, {"JUDGE_KEY": "k"}) == []
    errors = rlm_errors(RlmConfig(reward_mode="judge", judge_api_key_env="JUDGE_KEY"), {})
    assert errors == [
        "--reward_mode judge needs --judge_base_url (an OpenAI-compatible endpoint)",
        "--reward_mode judge needs --judge_model",
        "--reward_mode judge: set the environment variable JUDGE_KEY to the endpoint's "
        "API key"]
    assert rlm_errors(RlmConfig(train_file=str(tmp_path / "x.csv"))) == [
        f"--train_file {tmp_path / 'x.csv'} must end in .jsonl or .parquet"]
    assert rlm_errors(RlmConfig(train_file=str(tmp_path / "x.jsonl"))) == [
        f"--train_file {tmp_path / 'x.jsonl'} does not exist"]


def test_sandbox_errors_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlscope.envs.rlm.config as config

    monkeypatch.setattr(config, "isolation_problem", lambda: "bubblewrap not found at /x")
    (error,) = config.sandbox_errors(RlmConfig())
    assert error.startswith("the REPL sandbox is unavailable: bubblewrap not found at /x; "
                            "install bubblewrap")
    assert config.sandbox_errors(RlmConfig(unsafe_sandbox=True)) == []
    monkeypatch.setattr(config, "isolation_problem", lambda: "")
    assert config.sandbox_errors(RlmConfig()) == []
