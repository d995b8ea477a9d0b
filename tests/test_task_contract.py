"""The task contract (`rlscope.tasks.base`): every registered task satisfies the `Task`
protocol and declares its traits; each capability protocol is detected exactly on the tasks
that have it; the traits follow the options that change them."""

from __future__ import annotations

import pytest

from rlscope.tasks import (
    TASKS,
    GroupSized,
    Interactive,
    OwnsPolicy,
    PreferencePairs,
    SupervisedPairs,
    Task,
    TaskConfig,
    TaskTraits,
    Tokenized,
    TrainingChecks,
    TrainsCompanion,
    WatchesPolicy,
    make_task,
)
from rlscope.tasks.text import STOP_ID

CAPABILITIES = (OwnsPolicy, WatchesPolicy, SupervisedPairs, PreferencePairs, TrainingChecks,
                Tokenized, Interactive, GroupSized, TrainsCompanion)
TEXT = {"arithmetic", "length_target", "preference_rm", "twenty_questions_answerer"}
EXPECTED: dict[str, set[type]] = {
    "token_reversal": {SupervisedPairs},
    "masked_reversal": {SupervisedPairs},
    "chain_reversal": {SupervisedPairs},
    "chain_arithmetic": {SupervisedPairs},
    "format_answer": {SupervisedPairs},
    "digits_bandit": {OwnsPolicy},
    "lm_bandit": {OwnsPolicy, WatchesPolicy, Tokenized},
    "arithmetic": {SupervisedPairs, Tokenized},
    "length_target": {SupervisedPairs, Tokenized},
    "code_unit_tests": {SupervisedPairs, Tokenized},
    "preference_rm": {SupervisedPairs, PreferencePairs, TrainingChecks, Tokenized},
    "unique_path": {OwnsPolicy, GroupSized},
    "guess_number": {Interactive, SupervisedPairs},
    "twenty_questions": {Interactive, SupervisedPairs, TrainsCompanion},
    "twenty_questions_answerer": {SupervisedPairs, Tokenized},
    "calculator_tool": {Interactive, SupervisedPairs},
    "code_repair": {Interactive, SupervisedPairs},
}


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return {name: make_task(name) for name in TASKS}


def test_the_table_covers_every_registered_task() -> None:
    assert set(EXPECTED) == set(TASKS)


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_satisfies_the_protocol_and_declares_traits(tasks: dict[str, Task],
                                                               name: str) -> None:
    task = tasks[name]
    assert isinstance(task, Task)
    assert task.name == name
    assert isinstance(task.traits, TaskTraits)
    assert all(isinstance(t, int) for t in task.traits.stop_token_ids)


@pytest.mark.parametrize("name", list(TASKS))
def test_capabilities_are_detected_per_task(tasks: dict[str, Task], name: str) -> None:
    found = {cap for cap in CAPABILITIES if isinstance(tasks[name], cap)}
    assert found == EXPECTED[name]


def test_an_object_without_the_methods_has_no_capability() -> None:
    assert not any(isinstance(object(), cap) for cap in (*CAPABILITIES, Task))


def test_stop_tokens_and_dense_credit(tasks: dict[str, Task]) -> None:
    for name in TEXT:
        assert tasks[name].traits.stop_token_ids == (STOP_ID,)
    code = tasks["code_unit_tests"]
    assert isinstance(code, Tokenized)
    assert code.traits.stop_token_ids == (code.tokenizer.vocab_size - 1,)
    episodes = {n for n, t in tasks.items() if isinstance(t, Interactive)}
    assert episodes == {"guess_number", "twenty_questions", "calculator_tool", "code_repair"}
    for name in episodes:  # a policy turn ends at the environment's turn stop tokens
        task = tasks[name]
        assert isinstance(task, Interactive)
        assert task.traits.stop_token_ids == tuple(task.environment_factory.turn_stop_token_ids)
    assert tasks["guess_number"].traits.stop_token_ids == (STOP_ID,)
    for name in set(TASKS) - TEXT - {"code_unit_tests"} - episodes:
        assert tasks[name].traits.stop_token_ids == ()
    dense = {n for n, t in tasks.items() if t.traits.decomposable_token_rewards}
    assert dense == {"token_reversal", "masked_reversal"}


@pytest.mark.parametrize(("name", "option", "value", "binary"), [
    ("token_reversal", None, None, False),
    ("token_reversal", "binary_reward", True, True),
    ("masked_reversal", "binary_reward", True, True),
    ("digits_bandit", None, None, True),
    ("lm_bandit", None, None, True),
    ("lm_bandit", "lm_kl_shaping", 0.1, False),
    ("arithmetic", None, None, True),
    ("arithmetic", "format_reward", 0.1, False),
    ("length_target", None, None, False),
    ("length_target", "band_max_words", 5, True),
    ("code_unit_tests", None, None, False),
    ("preference_rm", None, None, False),
    ("unique_path", None, None, True),
])
def test_binary_rewards_follow_the_options(name: str, option: str | None, value: object,
                                           binary: bool) -> None:
    cfg = TaskConfig(**{option: value}) if option else TaskConfig()
    assert make_task(name, cfg).traits.binary_rewards is binary


@pytest.mark.parametrize(("name", "model"), [("digits_bandit", "MLP 64 → 50 → 50 → 10"),
                                             ("unique_path", "tabular policy")])
def test_a_task_with_its_own_model_refuses_transformer_options(name: str, model: str) -> None:
    from rlscope.policy import ModelConfig

    task = make_task(name)
    assert isinstance(task, OwnsPolicy)
    with pytest.raises(ValueError, match=f"{name} trains its own {model}; model.d_model=32 "
                       r"does not apply \(only model.dtype does\)"):
        task.build_policy(ModelConfig(d_model=32))
    assert task.build_policy(ModelConfig()) is not None
