"""The batch sources of the loop (`rlscope.replay.batch_source`): which batch each step trains
on, what they collect, and that their state round-trips under the checkpoint's keys."""

from __future__ import annotations

import torch
from test_replay import _batch, _tag

from rlscope.batch import RolloutBatch
from rlscope.replay import DelayQueue, OverfitBatch, ReplayConfig, ReplaySource, batch_source


class Counter:
    """A collect stage that returns batches tagged 0, 1, 2, ... and records its calls."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def __call__(self, step: int) -> RolloutBatch:
        self.steps.append(step)
        return _batch([1.0, 0.0], tag=len(self.steps) - 1)


def test_delay_queue_warms_up_on_the_fresh_batch_then_trains_on_delay_steps_ago() -> None:
    collect = Counter()
    source = DelayQueue(2, collect)
    got = [source.next(step) for step in range(5)]
    # warm-up (steps 0, 1): the fresh batch, age 0; then the batch of step - 2, age 2
    assert [_tag(b) for b in got] == [0, 1, 0, 1, 2]
    assert [float(b.age_B[0]) for b in got] == [0.0, 0.0, 2.0, 2.0, 2.0]
    assert collect.steps == [0, 1, 2, 3, 4]
    assert len(source.queue) == 2
    plain = DelayQueue(0, Counter())
    assert [_tag(plain.next(step)) for step in range(3)] == [0, 1, 2] and not plain.queue


def test_overfit_collects_once_and_returns_that_batch_every_step() -> None:
    collect = Counter()
    source = OverfitBatch(collect)
    batches = [source.next(step) for step in range(4)]
    assert collect.steps == [0]
    assert all(b is batches[0] for b in batches)


def test_replay_trains_on_the_fresh_batch_until_one_is_old_enough() -> None:
    collect = Counter()
    cfg = ReplayConfig(replay_capacity=2)
    source = ReplaySource(cfg, 1, collect, torch.Generator().manual_seed(0))
    first = source.next(0)
    assert first is not None and _tag(first) == 0
    second = source.next(1)  # one candidate of age >= 1: the batch of step 0, aged
    assert second is not None and _tag(second) == 0 and float(second.age_B[0]) == 1.0
    assert source.stats()["replay/age"] == 1.0


def test_state_round_trips_under_the_checkpoint_keys() -> None:
    source = DelayQueue(2, Counter())
    source.next(0)
    source.next(1)
    state = source.state_dict()
    assert set(state) == {"queue", "replay"} and state["replay"] is None
    restored = DelayQueue(2, Counter())
    restored.load_state_dict(state)
    after = restored.next(2)
    assert _tag(after) == 0
    replay = ReplaySource(ReplayConfig(replay_capacity=2), 0, Counter(), torch.Generator())
    replay.next(0)
    saved = replay.state_dict()
    assert saved["queue"] == [] and saved["replay"]["ages"] == [0]
    again = ReplaySource(ReplayConfig(replay_capacity=2), 0, Counter(), torch.Generator())
    again.load_state_dict(saved)
    assert again.buffer.ages == [0]


def test_batch_source_picks_one_per_run() -> None:
    gen = torch.Generator()
    assert isinstance(batch_source(ReplayConfig(replay_capacity=3), 1, False, Counter(), gen),
                      ReplaySource)
    assert isinstance(batch_source(ReplayConfig(), 0, True, Counter(), gen), OverfitBatch)
    queue = batch_source(ReplayConfig(), 3, False, Counter(), gen)
    assert type(queue) is DelayQueue and queue.delay == 3
