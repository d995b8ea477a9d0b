"""Replay buffer (METHODS.md, "Training protocol", Replay)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.config import RunConfig, TrainConfig
from rlscope.replay import PRIORITIES, ReplayBuffer, ReplayConfig, batch_priority, validate_replay
from rlscope.tasks import TaskConfig
from rlscope.train import train

NEG_INF = float("-inf")


def _batch(rewards: list[float], logp: list[list[float]] | None = None,
           mask: list[list[int]] | None = None, tag: int = 0) -> RolloutBatch:
    """A tiny scored batch; ``tag`` marks it (in ``group_id_B``) so a draw can be identified."""
    b = len(rewards)
    logp_BT = torch.tensor(logp) if logp is not None else torch.full((b, 3), -1.0)
    mask_BT = torch.tensor(mask, dtype=torch.float32) if mask is not None \
        else torch.ones_like(logp_BT)
    t = logp_BT.shape[1]
    return RolloutBatch(
        prompt_tokens_BP=torch.zeros(b, 2, dtype=torch.long), prompt_mask_BP=None,
        completion_tokens_BT=torch.ones(b, t, dtype=torch.long), completion_mask_BT=mask_BT,
        logp_sampler_BT=logp_BT, logp_raw_BT=logp_BT.clone(),
        finished_by_stop_B=torch.ones(b, dtype=torch.bool),
        group_id_B=torch.full((b,), tag, dtype=torch.long),
        rewards_B=torch.tensor(rewards), raw_rewards_B=torch.tensor(rewards),
        age_B=torch.zeros(b))


def _tag(batch: RolloutBatch) -> int:
    return int(batch.group_id_B[0])


# Rewards [1, 0, .5, .5] (mean .5); per-row surprisal over valid tokens: 1.5, .5, 2, 0 (empty
# row); -inf sits on masked-out positions and must never leak in.
REWARDS = [1.0, 0.0, 0.5, 0.5]
LOGP = [[-1.0, -2.0, NEG_INF], [-0.5, NEG_INF, NEG_INF], [-3.0, -1.0, -2.0],
        [NEG_INF, NEG_INF, NEG_INF]]
MASK = [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]


def test_priorities_hand_computed() -> None:
    batch = _batch(REWARDS, LOGP, MASK)
    assert batch_priority("uniform", batch) == 1.0
    assert batch_priority("reward", batch) == pytest.approx(0.5)
    # mean |r - r̄| = (.5 + .5 + 0 + 0) / 4
    assert batch_priority("advantage", batch) == pytest.approx(0.25)
    assert batch_priority("advantage", batch, torch.tensor([1.0, -1.0, 2.0, 0.0])) == \
        pytest.approx(1.0)
    # adv_BT: |A| over the 6 valid tokens only (masked slots hold 99)
    adv_BT = torch.tensor([[1.0, -3.0, 99.0], [2.0, 99.0, 99.0], [0.0, 0.0, 6.0],
                           [99.0, 99.0, 99.0]])
    assert batch_priority("advantage", batch, adv_BT) == pytest.approx(12.0 / 6)
    # token-level surprisal: (1 + 2 + .5 + 3 + 1 + 2) / 6
    assert batch_priority("surprisal", batch) == pytest.approx(9.5 / 6)
    # A = r - r̄ = [.5, -.5, 0, 0]; per valid token max(A·s_t, 0): .5, 1, 0, 0, 0, 0 → 1.5 / 6
    assert batch_priority("delight", batch) == pytest.approx(0.25)
    assert batch_priority("fresh_delight", batch) == pytest.approx(0.25)
    # reward is mean |r|: a negative reward counts by its size
    assert batch_priority("reward", _batch([-1.0, 0.0])) == 0.5


def test_push_time_advantage_uses_the_exact_baseline_then_the_group_mean() -> None:
    batch = dataclasses.replace(_batch([1.0, 0.0, 1.0, 1.0]),
                                group_id_B=torch.tensor([0, 0, 1, 1]))
    # group means .5 and 1: A = [.5, -.5, 0, 0] → mean |A| = .25 (batch mean would give .375)
    assert batch_priority("advantage", batch) == pytest.approx(0.25)
    exact = dataclasses.replace(batch, expected_reward_B=torch.tensor([0.0, 0.0, 0.5, 0.5]))
    # A = r - E[r|x] = [1, 0, .5, .5]; delight per token (s_t = 1): mean of A = .5
    assert batch_priority("advantage", exact) == pytest.approx(0.5)
    assert batch_priority("delight", exact) == pytest.approx(0.5)


def test_push_time_advantage_uses_the_behaviour_sum_p2_per_token() -> None:
    # No E[r | x] (token_reversal's fractional reward): the reference sandbox's priority reads
    # A_t = r - Σμ²_t with the behaviour's per-token Σμ² (its actor_baseline), not r - mean r.
    batch = dataclasses.replace(
        _batch([1.0, 0.0], [[-1.0, -2.0], [-1.0, -1.0]]),
        sum_p2_sampler_BT=torch.tensor([[0.5, 0.25], [0.5, 0.75]]))
    # A_BT = [[.5, .75], [-.5, -.75]]: mean |A| = 2.5 / 4; the batch mean would give .5
    assert batch_priority("advantage", batch) == pytest.approx(0.625)
    # max(A·s, 0): .5·1, .75·2, 0, 0 → 2 / 4
    assert batch_priority("delight", batch) == pytest.approx(0.5)
    assert batch_priority("fresh_delight", batch) == pytest.approx(0.5)
    # the exact E[r | x] still comes first
    exact = dataclasses.replace(batch, expected_reward_B=torch.tensor([0.0, 0.0]))
    assert batch_priority("advantage", exact) == pytest.approx(0.5)


def test_the_loop_records_the_behaviour_sum_p2_for_advantage_priorities(tmp_path: Path) -> None:
    from rlscope.train import setup

    def record(priority: str, capacity: int = 8) -> bool:
        cfg = TrainConfig(method="replay_dg", replay=ReplayConfig(
            replay_capacity=capacity, replay_priority=priority), run=RunConfig(
                delay=2, num_steps=1, progress=False, device="cpu", runs_dir=str(tmp_path)))
        return setup(cfg).record_sum_p2

    assert record("fresh_delight") and record("delight") and record("advantage")
    assert not record("uniform") and not record("reward") and not record("surprisal")


def test_priority_errors() -> None:
    batch = _batch(REWARDS, LOGP, MASK)
    with pytest.raises(ValueError, match="unknown replay priority"):
        batch_priority("nope", batch)
    with pytest.raises(ValueError, match="do not match"):
        batch_priority("advantage", batch, torch.zeros(4, 5))
    with pytest.raises(ValueError, match="needs rewards"):
        batch_priority("reward", dataclasses.replace(batch, rewards_B=None))
    with pytest.raises(ValueError, match="not finite"):
        batch_priority("reward", _batch([float("nan"), 1.0]))


def test_ages_priorities_and_eviction_on_scripted_pushes() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=3, replay_priority="reward"))
    assert len(buf) == 0 and buf.ages == []
    buf.push(_batch([1.0, 0.0], tag=0))
    assert buf.ages == [0] and buf.priorities == [0.5]
    buf.push(_batch([1.0, 1.0], tag=1))
    assert buf.ages == [0, 1] and buf.priorities == [1.0, 0.5]
    buf.push(_batch([0.0, 0.5], tag=2))
    assert buf.ages == [0, 1, 2] and buf.priorities == [0.25, 1.0, 0.5]
    buf.push(_batch([-2.0, 0.0], tag=3))  # evicts tag 0, the oldest; mean |r| = 1
    assert buf.ages == [0, 1, 2] and buf.priorities == [1.0, 0.25, 1.0]
    assert buf.candidates(1) == [(1, 0.25), (2, 1.0)]
    assert buf.candidates(3) == []
    seen = {_tag(out[0]) for _ in range(50)
            if (out := buf.sample(0, torch.Generator().manual_seed(_))) is not None}
    assert seen <= {1, 2, 3} and 0 not in seen


def test_advantage_priority_from_push_argument() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=2, replay_priority="advantage"))
    buf.push(_batch([1.0, 0.0]), advantages=torch.tensor([3.0, -1.0]))
    buf.push(_batch([1.0, 0.0]))
    assert buf.priorities == [0.5, 2.0]


def test_sample_is_none_until_a_batch_reaches_delay_and_fills_age() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=4))
    g = torch.Generator().manual_seed(0)
    assert buf.sample(0, g) is None
    buf.push(_batch([1.0], tag=0))
    assert buf.sample(2, g) is None
    buf.push(_batch([1.0], tag=1))
    buf.push(_batch([1.0], tag=2))
    out = buf.sample(2, g)
    assert out is not None
    batch, age = out
    assert age == 2 and _tag(batch) == 0
    assert batch.age_B is not None and batch.age_B.tolist() == [2.0]
    assert batch.age_B.dtype == torch.float32


def test_capacity_delay_plus_one_trains_exactly_delay_steps_old() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=5))
    g = torch.Generator().manual_seed(0)
    state_before = g.get_state()
    for step in range(30):
        buf.push(_batch([1.0, 0.0], tag=step))
        out = buf.sample(4, g)
        if step < 4:
            assert out is None
            continue
        assert out is not None
        batch, age = out
        assert age == 4 and _tag(batch) == step - 4
        assert batch.age_B is not None and batch.age_B.tolist() == [4.0, 4.0]
    # one candidate each time: no random draw is spent, as with the staleness queue
    assert torch.equal(g.get_state(), state_before)
    stats = buf.stats()
    # default fresh_delight: delight .25 (see _fill_equal_delight) × exp(-0.02 · 4)
    assert stats["replay/age"] == 4.0
    assert stats["replay/priority"] == pytest.approx(0.25 * math.exp(-0.02 * 4))
    assert stats["replay/age_hist_0"] == 4.0 and stats["replay/age_hist_4"] == 26.0
    assert stats["replay/trained_age_mean"] == pytest.approx(26 * 4 / 30)


def test_delay_zero_large_capacity_spreads_ages() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=32))
    g = torch.Generator().manual_seed(1)
    ages = []
    for step in range(64):
        buf.push(_batch([1.0, 0.0], tag=step))
        out = buf.sample(0, g)
        assert out is not None
        batch, age = out
        assert _tag(batch) == step - age
        ages.append(age)
    assert len(set(ages)) >= 10
    assert sum(ages) / len(ages) > 3
    stats = buf.stats()
    assert stats["replay/size"] == 32.0
    assert stats["replay/age_mean"] == 15.5 and stats["replay/age_max"] == 31.0
    assert stats["replay/trained_age_mean"] == pytest.approx(sum(ages) / 64)
    hist = {k: v for k, v in stats.items() if k.startswith("replay/age_hist_")}
    assert list(hist) == ["replay/age_hist_0", "replay/age_hist_1", "replay/age_hist_2_3",
                          "replay/age_hist_4_7", "replay/age_hist_8_15",
                          "replay/age_hist_16_31"]
    assert sum(hist.values()) == 64.0
    assert hist["replay/age_hist_8_15"] == float(sum(8 <= a <= 15 for a in ages))


def _fill_equal_delight(priority: str, age_decay: float) -> ReplayBuffer:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=8, replay_priority=priority,
                                    replay_age_decay=age_decay))
    for step in range(8):
        # delight = mean_t max(0, (r - r̄)·s_t) = (3 · .5 · 1) / 6 = .25 for every batch
        buf.push(_batch([1.0, 0.0], tag=step))
    return buf


def test_fresh_delight_weights_are_hand_computed() -> None:
    buf = _fill_equal_delight("fresh_delight", 0.5)
    assert buf.priorities == [pytest.approx(0.25)] * 8
    cands = buf.candidates(2)
    assert [a for a, _ in cands] == [2, 3, 4, 5, 6, 7]
    for age, weight in cands:
        assert weight == pytest.approx(math.exp(-0.5 * age) * 0.25)


def test_fresh_delight_prefers_youngest_eligible_delight_does_not() -> None:
    delay, draws = 2, 1000
    youngest = {}
    for priority in ("fresh_delight", "delight"):
        buf = _fill_equal_delight(priority, 5.0)
        g = torch.Generator().manual_seed(2)
        ages = [out[1] for _ in range(draws) if (out := buf.sample(delay, g)) is not None]
        assert len(ages) == draws and min(ages) >= delay
        youngest[priority] = sum(a == delay for a in ages) / draws
    assert youngest["fresh_delight"] > 0.95
    # 6 equal candidates: 1/6 ± a wide margin
    assert youngest["delight"] < 0.3


def test_uniform_fallback_when_all_priorities_are_zero() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=4, replay_priority="reward"))
    for step in range(4):
        buf.push(_batch([0.0, 0.0], tag=step))
    assert buf.priorities == [0.0] * 4
    g = torch.Generator().manual_seed(3)
    n = 4000
    counts = [0] * 4
    for _ in range(n):
        out = buf.sample(0, g)
        assert out is not None
        counts[out[1]] += 1
    sd = math.sqrt(n * 0.25 * 0.75)
    for c in counts:
        assert abs(c - n / 4) < 4 * sd


def test_zero_priority_batches_are_never_drawn_when_others_are_positive() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=3, replay_priority="reward"))
    for r in (1.0, 0.0, 1.0):
        buf.push(_batch([r]))
    g = torch.Generator().manual_seed(4)
    ages = {out[1] for _ in range(300) if (out := buf.sample(0, g)) is not None}
    assert ages == {0, 2}


def test_state_dict_round_trip_gives_identical_samples(tmp_path) -> None:
    cfg = ReplayConfig(replay_capacity=6, replay_priority="fresh_delight", replay_age_decay=0.3)
    buf = ReplayBuffer(cfg)
    g = torch.Generator().manual_seed(5)
    rewards = torch.rand(12, 4, generator=g)
    for step in range(8):
        buf.push(_batch(rewards[step].tolist(), tag=step))
        buf.sample(1, g)
    path = tmp_path / "replay.pt"
    torch.save({"replay": buf.state_dict(), "generator": g.get_state()}, path)
    payload = torch.load(path, weights_only=True)
    restored = ReplayBuffer(cfg)
    restored.load_state_dict(payload["replay"])
    g2 = torch.Generator()
    g2.set_state(payload["generator"])
    assert restored.ages == buf.ages and restored.priorities == buf.priorities
    assert restored.stats() == buf.stats()
    for step in range(8, 12):
        for b in (buf, restored):
            b.push(_batch(rewards[step].tolist(), tag=step))
        outs = [b.sample(1, gen) for b, gen in ((buf, g), (restored, g2))]
        assert outs[0] is not None and outs[1] is not None
        assert outs[0][1] == outs[1][1] and _tag(outs[0][0]) == _tag(outs[1][0])
        r0, r1 = outs[0][0].rewards_B, outs[1][0].rewards_B
        assert r0 is not None and r1 is not None and torch.equal(r0, r1)
    assert restored.stats() == buf.stats()
    assert torch.equal(g.get_state(), g2.get_state())
    with pytest.raises(ValueError, match="same replay settings"):
        ReplayBuffer(ReplayConfig(replay_capacity=6)).load_state_dict(buf.state_dict())


def test_validation_messages() -> None:
    assert validate_replay(ReplayConfig(), 0) == []
    assert validate_replay(ReplayConfig(), 7) == []  # replay off: delay is the queue's
    assert validate_replay(ReplayConfig(replay_capacity=5, replay_priority="delight"), 4) == []
    errors = validate_replay(ReplayConfig(replay_capacity=-1, replay_priority="best",
                                          replay_age_decay=-0.1), 0)
    assert len(errors) == 3
    assert "replay_capacity=-1 must be >= 0" in errors[0]
    assert "replay_priority='best'" in errors[1] and ", ".join(PRIORITIES) in errors[1]
    assert "replay_age_decay=-0.1" in errors[2]
    (msg,) = validate_replay(ReplayConfig(replay_capacity=4), 4)
    assert "needs capacity > delay" in msg and "staleness is never exposed" in msg
    assert "replay_capacity >= 5" in msg and "run.delay" in msg
    assert validate_replay(ReplayConfig(replay_age_decay=float("nan")), 0) != []
    with pytest.raises(ValueError, match="capacity >= 1"):
        ReplayBuffer(ReplayConfig())
    with pytest.raises(ValueError, match="must be >= 0"):
        ReplayBuffer(ReplayConfig(replay_capacity=2)).sample(-1, torch.Generator())


def test_replay_through_the_loop_trains_on_batches_exactly_delay_old(tmp_path: Path) -> None:
    """Capacity 5, delay 4: during warm-up the fresh batch is trained (age 0), afterwards every
    trained batch is exactly 4 steps old; the first-pass ratio then moves away from 1."""
    cfg = TrainConfig(method="dg", task_options=TaskConfig(seq_len=4, eval_batches=1,
                                                           eval_batch_size=8),
                      replay=ReplayConfig(replay_capacity=5),
                      run=RunConfig(num_steps=10, batch_size=16, delay=4, eval_every=0,
                                    progress=False, device="cpu", runs_dir=str(tmp_path)))
    rows = train(cfg).metrics
    ages = [row["replay/age"] for row in rows]
    assert ages == [0.0] * 4 + [4.0] * 6
    assert all(row["replay/size"] == min(i + 1, 5) for i, row in enumerate(rows))
    assert abs(rows[-1]["policy/ratio_mean_first"] - 1.0) > 1e-4


def test_replay_resume_equals_straight_run(tmp_path: Path) -> None:
    def cfg(steps: int, name: str, resume: str = "") -> TrainConfig:
        return TrainConfig(
            method="dg", task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=8),
            replay=ReplayConfig(replay_capacity=6, replay_priority="delight"),
            run=RunConfig(num_steps=steps, batch_size=16, delay=1, eval_every=0, name=name,
                          progress=False, device="cpu", runs_dir=str(tmp_path), resume=resume))

    straight = train(cfg(12, "straight")).metrics
    first = train(cfg(6, "split"))
    second = train(cfg(12, "split", resume=str(first.run_dir))).metrics

    def strip(rows: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
                for r in rows]

    assert strip(first.metrics + second) == strip(straight)


# Planted buffer for the draw test: batch k has rewards [a, b] and surprisal c on 3 valid
# tokens, so reward = (|a| + |b|) / 2, advantage = |a - b| / 2 (A = r - r̄), surprisal = c,
# delight = mean_t max(A·c, 0) = |a - b|·c / 4; pushed oldest first, ages 0..5.
PLANTED = [(1.0, 0.0, 0.5), (0.0, 0.0, 3.0), (2.0, 0.0, 1.0), (1.0, -1.0, 2.0),
           (0.5, 0.0, 4.0), (3.0, 1.0, 0.2)]  # (a, b, c) at ages 5, 4, 3, 2, 1, 0


def _planted_priority(priority: str, a: float, b: float, c: float, age: int,
                      decay: float) -> float:
    return {"uniform": 1.0, "reward": (abs(a) + abs(b)) / 2, "advantage": abs(a - b) / 2,
            "surprisal": c, "delight": abs(a - b) * c / 4,
            "fresh_delight": math.exp(-decay * age) * abs(a - b) * c / 4}[priority]


def _chi2_pvalue(counts: list[int], probs: list[float]) -> float:
    """Pearson chi-square goodness of fit over the cells with positive probability (df =
    cells - 1), p = the regularised upper incomplete gamma Q(df / 2, χ² / 2); 0 when a cell of
    probability 0 was hit."""
    if any(c > 0 and p == 0 for c, p in zip(counts, probs, strict=True)):
        return 0.0
    n = sum(counts)
    cells = [(c, p) for c, p in zip(counts, probs, strict=True) if p > 0]
    stat = sum((c - n * p) ** 2 / (n * p) for c, p in cells)
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.parametrize("priority", PRIORITIES)
def test_draw_frequencies_match_the_priorities(priority: str) -> None:
    decay, delay, draws = 0.7, 1, 6000
    buf = ReplayBuffer(ReplayConfig(replay_capacity=6, replay_priority=priority,
                                    replay_age_decay=decay))
    for tag, (a, b, c) in enumerate(PLANTED):
        buf.push(_batch([a, b], logp=[[-c] * 3] * 2, tag=tag))
    ages = list(range(delay, 6))  # eligible: age >= delay
    weights = [_planted_priority(priority, *PLANTED[5 - age], age, decay) for age in ages]
    probs = [w / sum(weights) for w in weights]
    assert [w for _, w in buf.candidates(delay)] == pytest.approx(weights)
    g = torch.Generator().manual_seed(11)
    counts = [0] * len(ages)
    for _ in range(draws):
        out = buf.sample(delay, g)
        assert out is not None
        batch, age = out
        assert _tag(batch) == 5 - age  # the batch pushed `age` pushes ago
        stats = buf.stats()
        assert stats["replay/age"] == float(age)
        assert stats["replay/priority"] == pytest.approx(weights[age - delay])
        counts[age - delay] += 1
    assert _chi2_pvalue(counts, probs) > 1e-3
    # the same counts reject a wrong distribution: uniform for a skewed priority, and
    # weights ∝ 1..5 for uniform
    wrong = [1 / len(ages)] * len(ages) if priority != "uniform" else \
        [k / 15 for k in range(1, 6)]
    assert _chi2_pvalue(counts, wrong) < 1e-3


def test_uniform_fallback_frequencies_and_fresh_until_old_enough() -> None:
    buf = ReplayBuffer(ReplayConfig(replay_capacity=5, replay_priority="delight"))
    g = torch.Generator().manual_seed(12)
    for tag in range(2):  # rewards all equal: A = 0, every delight 0
        buf.push(_batch([1.0, 1.0], tag=tag))
        # ages 0 (and 1) only: nothing is 2 steps old, the loop trains on the fresh batch
        assert buf.sample(2, g) is None
        assert buf.stats()["replay/age"] == 0.0 and buf.stats()["replay/eligible"] == 0.0
    for tag in range(2, 5):
        buf.push(_batch([1.0, 1.0], tag=tag))
    assert buf.priorities == [0.0] * 5
    counts = [0] * 3
    for _ in range(3000):
        out = buf.sample(2, g)
        assert out is not None
        counts[out[1] - 2] += 1
        assert buf.stats()["replay/priority"] == 0.0
    assert _chi2_pvalue(counts, [1 / 3] * 3) > 1e-3
    assert _chi2_pvalue(counts, [0.5, 0.3, 0.2]) < 1e-3


def _loop_cfg(tmp_path: Path, name: str, replay: ReplayConfig, steps: int = 12) -> TrainConfig:
    return TrainConfig(method="dg", task_options=TaskConfig(seq_len=4, eval_batches=1,
                                                            eval_batch_size=8),
                       replay=replay,
                       run=RunConfig(num_steps=steps, batch_size=16, delay=4, eval_every=4,
                                     name=name, progress=False, device="cpu",
                                     runs_dir=str(tmp_path)))


def test_delay_and_replay_capacity_delay_plus_one_are_bit_identical(tmp_path: Path) -> None:
    """delay 4: the staleness queue and a replay buffer of capacity 5 train on the same
    batches (the fresh one for the 4 warm-up steps, then the one of step - 4), so every metric
    but timings is equal; the warm-up steps do update the policy."""
    queue = train(_loop_cfg(tmp_path, "queue", ReplayConfig()))
    replay = train(_loop_cfg(tmp_path, "replay", ReplayConfig(replay_capacity=5)))
    assert len(queue.metrics) == len(replay.metrics) == 12

    def strip(rows: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in r.items()
                 if not k.startswith(("time/", "throughput/", "perf/", "replay/"))}
                for r in rows]

    assert strip(queue.metrics) == strip(replay.metrics)
    def no_time(rows: list[dict[str, float]]) -> list[dict[str, float]]:
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    assert no_time(queue.evals) == no_time(replay.evals) and len(queue.evals) >= 3
    assert [r["replay/age"] for r in replay.metrics] == [0.0] * 4 + [4.0] * 8
    assert [r["step"] for r in queue.metrics] == list(range(12))
    assert all(r["optim/grad_norm"] > 0 for r in queue.metrics[:4])
    assert all(abs(r["policy/ratio_mean_first"] - 1.0) < 1e-6 for r in queue.metrics[:4])
