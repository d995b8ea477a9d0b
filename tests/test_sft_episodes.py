"""rlscope sft on interactive tasks: demonstration episodes as pairs whose loss covers the
policy's segments only (the environment's tokens are context), and a short run that lowers the
loss and warm-starts rlscope train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlscope.config import ModelConfig, RunConfig, TrainConfig
from rlscope.envs import EnvConfig
from rlscope.supervised.sft import SftConfig, pad_id, sft, sft_batch, sft_loss, validate_sft
from rlscope.tasks import TASKS, TaskConfig, make_task
from rlscope.tasks.base import make_policy_for
from rlscope.tasks.episodes import EpisodeTask
from rlscope.train import train

GUESS = TaskConfig(env=EnvConfig(guess_high=20), max_turns=6, max_turn_tokens=4,
                   max_episode_tokens=48, eval_batches=1, eval_batch_size=32)


def _guess_task() -> EpisodeTask:
    task = make_task("guess_number", GUESS)
    assert isinstance(task, EpisodeTask)
    return task


def test_episode_pairs_are_the_demonstrations_with_the_policy_segments_in_the_loss() -> None:
    task = _guess_task()
    pairs = task.sft_pairs(torch.Generator().manual_seed(0), 6)
    assert len(pairs) == 6
    for prompt, completion, mask in pairs:
        assert len(mask) == len(completion) and set(mask) == {0, 1}
        text = bytes(prompt).decode()
        assert text.startswith("I am thinking of a number from 1 to 20")
        policy = bytes(t for t, m in zip(completion, mask, strict=True) if m).decode()
        env = bytes(t for t, m in zip(completion, mask, strict=True) if not m).decode()
        assert all(line.isdigit() for line in policy.splitlines())  # guesses only
        assert set(env.splitlines()) <= {"higher", "lower"}  # answers only
        assert mask[-1] == 1  # the episode ends with the policy's (solving) guess
    # the same seeds replay the same episodes (a demonstration is deterministic)
    again = task.sft_pairs(torch.Generator().manual_seed(0), 6)
    assert again == pairs


def test_environment_targets_change_neither_loss_nor_gradient() -> None:
    """Planted check: the environment's tokens of an episode are context, never targets."""
    task = _guess_task()
    torch.manual_seed(0)
    policy = make_policy_for(task, ModelConfig())
    pairs = task.sft_pairs(torch.Generator().manual_seed(1), 4)
    tokens, attention, targets, mask = sft_batch(pairs, task.prompt_len, task.completion_len,
                                                 pad_id(task))
    P = task.prompt_len
    # the mask is 1 exactly at the positions predicting a policy token
    for i, (_, completion, token_mask) in enumerate(pairs):
        assert mask[i, P - 1:P - 1 + len(completion)].tolist() == token_mask
        assert mask[i, :P - 1].sum() == 0 and mask[i, P - 1 + len(completion):].sum() == 0

    def loss_and_grad(t: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
        policy.zero_grad(set_to_none=True)
        loss = sft_loss(policy(tokens, attention)[0], t, mask)[0]
        loss.backward()
        grads = [p.grad.clone() for p in policy.parameters() if p.grad is not None]
        return float(loss.detach()), grads

    loss, grads = loss_and_grad(targets)
    g = torch.Generator().manual_seed(2)
    env_positions = torch.zeros_like(mask, dtype=torch.bool)
    for i, (_, _, token_mask) in enumerate(pairs):
        for j, m in enumerate(token_mask):
            env_positions[i, P - 1 + j] = m == 0
    assert env_positions.sum() > 0
    planted = torch.where(env_positions, (targets + 1 + torch.randint(
        0, 200, targets.shape, generator=g)) % 256, targets)
    assert not torch.equal(planted, targets)
    loss2, grads2 = loss_and_grad(planted)
    assert loss2 == loss and all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
    # the same change at a policy position does change the loss (the check can fail)
    policy_positions = mask.bool()
    moved = torch.where(policy_positions, (targets + 7) % 256, targets)
    assert loss_and_grad(moved)[0] != loss


def test_repair_demonstrations_learn_only_the_repairing_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """code_repair's repair demonstrations: the wrong first body is context (mask 0, like
    the environment's tokens); only the reference body that repairs it is learnt."""
    from rlscope.envs.code_repair import END_ID, wrong_bodies
    from rlscope.sandbox import SandboxResult, TestOutcome
    from rlscope.sandbox.specs import load_specs

    references = [s.reference for s in load_specs()]

    def planted(program: str, *args: object, **kwargs: object) -> SandboxResult:
        """Planted sandbox: a program passes its 4 tests iff it ends with a reference."""
        passed = 4 if any(program.endswith(r) for r in references) else 1
        return SandboxResult("ok", passed, 4, tuple(TestOutcome(i < passed, "wrong answer")
                                                    for i in range(4)), "")

    monkeypatch.setattr("rlscope.envs.code_repair.run_tests", planted)
    env = EnvConfig(code_repair_max_reference_chars=50, code_repair_feedback_chars=80,
                    code_repair_repair_demos=1.0, code_repair_unsafe_sandbox=True)
    task = make_task("code_repair", TaskConfig(env=env, max_turns=2, max_turn_tokens=64,
                                               max_episode_tokens=320))
    assert isinstance(task, EpisodeTask)
    for prompt, completion, mask in task.sft_pairs(torch.Generator().manual_seed(0), 8):
        spec = next(s for s in load_specs() if bytes(prompt).decode() == s.prompt)
        learnt = [t for t, m in zip(completion, mask, strict=True) if m]
        assert learnt == [*spec.reference.encode(), END_ID]  # the repairing body only
        wrong_end = completion.index(END_ID) + 1
        assert bytes(completion[:wrong_end - 1]).decode() in wrong_bodies(spec)
        assert mask[:wrong_end] == [0] * wrong_end  # the wrong body: not learnt
        assert bytes(completion[wrong_end:-1]).decode().startswith("# 1/4 tests passed")
    plain = make_task("code_repair", TaskConfig(env=EnvConfig(
        code_repair_max_reference_chars=50, code_repair_unsafe_sandbox=True), max_turns=2,
        max_turn_tokens=64, max_episode_tokens=320))
    assert isinstance(plain, EpisodeTask)
    for _, completion, mask in plain.sft_pairs(torch.Generator().manual_seed(0), 8):
        assert mask == [1] * len(completion)  # one turn: the reference and END, all learnt


def test_a_demonstration_over_the_budget_is_a_clear_error() -> None:
    cfg = TaskConfig(env=EnvConfig(guess_high=20), max_turns=6, max_turn_tokens=2,
                     max_episode_tokens=48)
    task = make_task("guess_number", cfg)
    assert isinstance(task, EpisodeTask)
    with pytest.raises(ValueError, match=r"raise --max_turn_tokens \(now 2\) to at least 3"):
        task.sft_pairs(torch.Generator().manual_seed(0), 4)
    short = make_task("guess_number", TaskConfig(env=EnvConfig(guess_high=20), max_turns=6,
                                                 max_turn_tokens=4, max_episode_tokens=8))
    assert isinstance(short, EpisodeTask)
    with pytest.raises(ValueError, match=r"raise --max_episode_tokens \(now 8\)"):
        short.sft_pairs(torch.Generator().manual_seed(0), 16)


def test_an_environment_without_demonstrations_is_refused_before_sft(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from episode_envs import EchoFactory

    monkeypatch.setitem(TASKS, "echo_test",
                        lambda cfg: EpisodeTask("echo_test", EchoFactory(exact=True), cfg))
    errors = validate_sft(SftConfig(task="echo_test", runs_dir=str(tmp_path)))
    assert errors == ["task 'echo_test': its environment has no demonstrations to warm-start "
                      "from: give --data FILE.jsonl"]
    task = make_task("echo_test", TaskConfig())
    assert isinstance(task, EpisodeTask)
    with pytest.raises(ValueError, match="has no demonstrations"):
        task.sft_pairs(torch.Generator().manual_seed(0), 1)


def test_sft_on_episodes_lowers_the_loss_and_warm_starts_train(tmp_path: Path) -> None:
    """60 steps of 32 demonstrations (lr 3e-3, a few seconds on the 2-core CPU): the held-out
    loss falls from ~5.9 (ln 256 = 5.55 at init) to below 1.5 (200 steps reach 0.078);
    rlscope train --init then starts from the same greedy episodes."""
    cfg = SftConfig(task="guess_number", task_options=GUESS, num_steps=60, batch_size=32,
                    eval_every=60, device="cpu", threads=1, progress=False,
                    runs_dir=str(tmp_path), name="sft")
    assert validate_sft(cfg) == []
    result = sft(cfg)
    first, last = result.evals[0], result.evals[-1]
    assert first["sft/heldout_loss"] > 4.0 and last["sft/heldout_loss"] < 1.5
    assert result.metrics[-1]["sft/loss"] < result.metrics[0]["sft/loss"] / 3
    run = train(TrainConfig(task="guess_number", task_options=GUESS, run=RunConfig(
        num_steps=0, progress=False, device="cpu", threads=1, runs_dir=str(tmp_path),
        init=str(result.out_dir))))
    for key in ("eval/success", "eval/return", "eval/turns"):
        assert run.evals[0][key] == pytest.approx(last[key], abs=1e-6), key
