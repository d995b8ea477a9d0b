"""Batch contracts: frozen dataclasses whose field names carry their shapes.

Suffix letters: ``B`` rows (sequences), ``P`` prompt positions, ``T`` completion positions,
``V`` vocabulary, ``K`` candidates per position. ``to()`` and ``select()`` are generic over
``dataclasses.fields``, so adding a field is one line: tensors whose first dimension is ``B``
are indexed by ``select``; everything else is carried unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

_T = TypeVar("_T")


def _map_tensors(obj: _T, fn: Any, batched_only: bool) -> _T:
    changes: dict[str, Any] = {}
    batch = getattr(obj, "batch_size", None)
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor) and (
            not batched_only or (value.dim() > 0 and value.shape[0] == batch)
        ):
            changes[f.name] = fn(value)
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class PromptBatch:
    """Prompts of one step, as the task made them.

    ``tokens_BP`` are left-padded; ``attention_mask_BP`` is None when no row is padded.
    ``targets_BT`` is the ground-truth completion where the task defines one (the ``ce`` oracle
    and dense per-token rewards read it); ``score_mask_BT`` marks scored completion positions.
    ``env_seeds_B`` (interactive tasks, `rlscope.tasks.base.Interactive`): the seed of each
    row's environment, whose initial observation the row's prompt is; rows of a group share it.
    """

    tokens_BP: torch.Tensor
    attention_mask_BP: torch.Tensor | None = None
    targets_BT: torch.Tensor | None = None
    score_mask_BT: torch.Tensor | None = None
    env_seeds_B: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.tokens_BP.shape[0])

    @classmethod
    def left_padded(cls, prompts: list[torch.Tensor], pad_id: int = 0) -> PromptBatch:
        """Ragged 1-D prompts as one left-padded batch with its attention mask."""
        P = max(int(p.numel()) for p in prompts)
        tokens_BP = torch.full((len(prompts), P), pad_id, dtype=torch.long)
        mask_BP = torch.zeros(len(prompts), P, dtype=torch.long)
        for i, p in enumerate(prompts):
            tokens_BP[i, P - p.numel():] = p
            mask_BP[i, P - p.numel():] = 1
        return cls(tokens_BP=tokens_BP, attention_mask_BP=mask_BP)

    def to(self, device: torch.device | str) -> PromptBatch:
        return _map_tensors(self, lambda t: t.to(device), batched_only=False)

    def select(self, index_B: torch.Tensor | slice) -> PromptBatch:
        return _map_tensors(self, lambda t: t[index_B], batched_only=True)

    def repeat_interleave(self, k: int) -> PromptBatch:
        """Each prompt ``k`` times in a row (the layout of grouped sampling)."""
        return _map_tensors(self, lambda t: t.repeat_interleave(k, dim=0), batched_only=True)


@dataclass(frozen=True)
class RolloutBatch:
    """One batch of sampled completions with everything the learner needs.

    Shapes: ``B`` rows, ``P`` prompt positions (left-padded), ``T`` completion positions.

    - ``completion_mask_BT``: 1 on generated tokens that count (through the first stop token).
    - ``logp_sampler_BT``: log-prob of each sampled token under the distribution it was drawn
      from (temperature, top-k, top-p applied) — the behaviour log-prob ``ℓ_μ``.
    - ``logp_raw_BT``: the same token under the raw policy at temperature 1.
    - ``keep_mask_BTV``: the top-k/top-p kept set at each step (None when no filtering), so the
      learner can replay the sampler's distribution exactly.
    - ``finished_by_stop_B``: True when a stop token ended the row, False when ``max_new_tokens``
      did (finish reason ``stop`` / ``length``).
    - ``group_id_B``: the prompt index a row was drawn for (rows of a group are contiguous).
    - ``rewards_B`` and the optional dense ``token_rewards_BT`` are filled by the task;
      ``raw_rewards_B`` are the rewards before noise or shaping; ``noise_B`` marks rows whose
      training reward the reward noise replaced.
    - ``expected_reward_B``: exact E[r | x] under the behaviour policy where the task exposes it.
    - ``age_B``: how many optimizer steps ago the rows were sampled (staleness).
    - ``entropy_BT``: the raw policy's entropy at each generated position (evaluation only).
    - ``sum_p2_sampler_BT``: Σ_v μ(v | prefix)² of the behaviour (sampling) distribution at each
      generated position, recorded when the method asks (kondo's baseline), 0 after a stop.
    - ``greedy_rewards_B``: training reward of a greedy rollout of the row's prompt (ReMax's
      baseline), where the method asks for it.

    Episodes (multi-turn rows of `rlscope.sampling.episodes.generate_episodes`; None otherwise):
    the prompt is the environment's initial observation and the completion the interleaved
    policy and environment segments; ``completion_mask_BT`` is 1 on policy tokens only.

    - ``env_mask_BT``: 1.0 on environment (observation) tokens, 0 on policy tokens and padding;
      their log-probs are 0 and they are never sampled.
    - ``turn_BT``: the turn of each completion token (policy turn k and the environment's
      answer to it share k), −1 on padding after the episode.
    - ``turn_rewards_BK``: the reward of each turn (``K`` = the budget's max turns; 0 after
      the last turn); ``turns_B`` the policy turns taken.
    - ``end_reason_B``: why the episode ended, an index into `rlscope.envs.DONE_REASONS`
      (the environment's reason, or the sampler's truncation reason); ``finished_by_stop_B``
      is True when the environment ended the episode, False when a budget truncated it.
    - ``env_time_B``: seconds spent in the row's environment (reset and steps);
      ``env_errors_B``: environment calls that raised (the episode then ends 'failed').
    - ``env_seeds_B``: the seed of the row's environment (rows of a group share it).
    """

    prompt_tokens_BP: torch.Tensor
    prompt_mask_BP: torch.Tensor | None
    completion_tokens_BT: torch.Tensor
    completion_mask_BT: torch.Tensor
    logp_sampler_BT: torch.Tensor
    logp_raw_BT: torch.Tensor
    finished_by_stop_B: torch.Tensor
    group_id_B: torch.Tensor
    keep_mask_BTV: torch.Tensor | None = None
    targets_BT: torch.Tensor | None = None
    score_mask_BT: torch.Tensor | None = None
    rewards_B: torch.Tensor | None = None
    raw_rewards_B: torch.Tensor | None = None
    noise_B: torch.Tensor | None = None
    token_rewards_BT: torch.Tensor | None = None
    expected_reward_B: torch.Tensor | None = None
    age_B: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None
    sum_p2_sampler_BT: torch.Tensor | None = None
    greedy_rewards_B: torch.Tensor | None = None
    env_mask_BT: torch.Tensor | None = None
    turn_BT: torch.Tensor | None = None
    turn_rewards_BK: torch.Tensor | None = None
    turns_B: torch.Tensor | None = None
    end_reason_B: torch.Tensor | None = None
    env_time_B: torch.Tensor | None = None
    env_errors_B: torch.Tensor | None = None
    env_seeds_B: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.completion_tokens_BT.shape[0])

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_tokens_BP.shape[1])

    def to(self, device: torch.device | str) -> RolloutBatch:
        return _map_tensors(self, lambda t: t.to(device), batched_only=False)

    def select(self, index_B: torch.Tensor | slice) -> RolloutBatch:
        """Rows ``index_B`` (a long index, a boolean mask or a slice) of every batched tensor."""
        return _map_tensors(self, lambda t: t[index_B], batched_only=True)

    def full_tokens(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompt and completion side by side, ``[B, P + T]``, with the attention mask or None.

        Completion positions after a stop stay attendable: causality keeps them from affecting
        any counted position, and the loss mask drops them.
        """
        tokens = torch.cat([self.prompt_tokens_BP, self.completion_tokens_BT], dim=1)
        if self.prompt_mask_BP is None:
            return tokens, None
        ones = torch.ones_like(self.completion_tokens_BT, dtype=self.prompt_mask_BP.dtype)
        return tokens, torch.cat([self.prompt_mask_BP, ones], dim=1)


AFTER_END = {"keep_mask_BTV": True, "turn_BT": -1}
"""What a completion-width field holds after a row's end where it is not 0 (the sampler's
convention: tokens, masks and log-probs 0; every token kept; no turn)."""


def _pad_dim1(x: torch.Tensor, width: int, fill: float | bool, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    pad = torch.full((x.shape[0], extra, *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x] if left else [x, pad], 1)


def _same_widths(batches: list[RolloutBatch]) -> list[RolloutBatch]:
    """``batches`` with one prompt width (left-padded, masks added where needed) and one
    decoded width (completion-width ``*_BT*`` fields right-padded as after a row's end)."""
    P = max(b.prompt_len for b in batches)
    T = max(int(b.completion_tokens_BT.shape[1]) for b in batches)
    masked = any(b.prompt_mask_BP is not None or b.prompt_len < P for b in batches)
    out = []
    for b in batches:
        changes: dict[str, Any] = {}
        if masked:
            mask_BP = b.prompt_mask_BP if b.prompt_mask_BP is not None else \
                torch.ones_like(b.prompt_tokens_BP)
            changes["prompt_mask_BP"] = _pad_dim1(mask_BP, P, 0, left=True)
            changes["prompt_tokens_BP"] = _pad_dim1(b.prompt_tokens_BP, P, 0, left=True)
        if b.completion_tokens_BT.shape[1] < T:
            for f in dataclasses.fields(b):
                value = getattr(b, f.name)
                if isinstance(value, torch.Tensor) and "_BT" in f.name \
                        and f.name not in ("targets_BT", "score_mask_BT"):
                    changes[f.name] = _pad_dim1(value, T, AFTER_END.get(f.name, 0), left=False)
        out.append(dataclasses.replace(b, **changes) if changes else b)
    return out


def concat_rollouts(batches: list[RolloutBatch]) -> RolloutBatch:
    """Stack rollout batches row-wise (every batched tensor along dim 0).

    All batches must carry the same optional fields; prompts of different widths are
    left-padded to the widest and completions decoded to different lengths right-padded to the
    longest, as the sampler pads a row after its end (`AFTER_END`; the task's ``targets_BT``
    and ``score_mask_BT`` keep the task's width). Group ids are renumbered so groups of
    different batches stay apart.
    """
    batches = _same_widths(batches)
    first = batches[0]
    offset = 0
    renumbered = []
    for b in batches:
        renumbered.append(dataclasses.replace(b, group_id_B=b.group_id_B + offset))
        offset += int(b.group_id_B.max()) + 1 if b.batch_size else 0
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        values = [getattr(b, f.name) for b in renumbered]
        if not isinstance(values[0], torch.Tensor):
            continue
        if any(v is None or v.shape[1:] != values[0].shape[1:] for v in values):
            raise ValueError(f"cannot stack rollouts: field {f.name} differs in presence or "
                             f"shape across batches")
        changes[f.name] = torch.cat(values)
    return dataclasses.replace(first, **changes)


@dataclass(frozen=True)
class CandidateBatch:
    """K next-token candidates at every generated position of a behaviour rollout.

    ``candidates_BTK[b, t, 0]`` is the behaviour token that extends the prefix
    ``rollout.completion_tokens_BT[b, :t]``; ``1..K−1`` are further draws, with replacement,
    from the behaviour policy at that prefix. ``logp_old_BTK`` are their behaviour log-probs;
    ``rewards_BTK`` their dense rewards (1 if equal to the target at step t, 0 otherwise and at
    unscored positions); ``mask_BT`` marks generated positions. The step index of a candidate
    is its position ``t``; the prefix is the rollout's prompt plus its completion before ``t``.
    """

    rollout: RolloutBatch
    candidates_BTK: torch.Tensor
    logp_old_BTK: torch.Tensor
    rewards_BTK: torch.Tensor
    mask_BT: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.candidates_BTK.shape[0])

    @property
    def behaviour_rewards_BT(self) -> torch.Tensor:
        """The behaviour token's dense reward (candidate 0)."""
        return self.rewards_BTK[..., 0]

    def to(self, device: torch.device | str) -> CandidateBatch:
        moved = _map_tensors(self, lambda t: t.to(device), batched_only=False)
        return dataclasses.replace(moved, rollout=self.rollout.to(device))

    def select(self, index_B: torch.Tensor) -> CandidateBatch:
        picked = _map_tensors(self, lambda t: t[index_B], batched_only=True)
        return dataclasses.replace(picked, rollout=self.rollout.select(index_B))


@dataclass(frozen=True)
class SetBatch:
    """One batch of the ``set`` step (COMPANIONS.md §2, VPO): G groups of K sets of M
    candidates; ``B`` = G·K rows (sets), the rows of a group contiguous.

    - ``prompt_ids_B``: the prompt of each set (one prompt per group).
    - ``actions_BM``: the M candidate actions of each set; ``logp_old_BM`` their behaviour
      log-probs ``ℓ_μ`` at sampling time.
    - ``rewards_BMO``: each candidate's reward vector over the O objectives.
    - ``weights_GNO``: the N preference weights w_j of each group, shared by its K sets.
    - ``group_ids_B``: the group 0..G − 1 of each row.
    """

    prompt_ids_B: torch.Tensor
    actions_BM: torch.Tensor
    logp_old_BM: torch.Tensor
    rewards_BMO: torch.Tensor
    weights_GNO: torch.Tensor
    group_ids_B: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.prompt_ids_B.shape[0])

    @property
    def weights_BNO(self) -> torch.Tensor:
        """Each row's group weights, ``[B, N, O]``."""
        return self.weights_GNO[self.group_ids_B]

    def to(self, device: torch.device | str) -> SetBatch:
        return _map_tensors(self, lambda t: t.to(device), batched_only=False)

    def select(self, index_B: torch.Tensor | slice) -> SetBatch:
        """The rows ``index_B`` (every field whose name ends in ``_B…``); ``weights_GNO`` is
        kept whole, so ``group_ids_B`` still indexes it."""
        return dataclasses.replace(self, **{
            f.name: getattr(self, f.name)[index_B] for f in dataclasses.fields(self)
            if f.name.rsplit("_", 1)[-1].startswith("B")})


@dataclass(frozen=True)
class TwoViewBatch:
    """Completions of one prompt set seen two ways (COMPANIONS.md §3, the ``two_view`` step).

    ``student_prompt_BP`` is each row's student view and ``teacher_prompt_BQ`` its teacher
    view (the same pair, with the answer); ``completion_BT`` the sampled completion (from the
    teacher on its view, or from the student on its own), every position generated;
    ``logp_old_BT`` its log-probs under the sampler's distribution (the PPO behaviour
    log-probs ℓ_μ); ``rewards_B`` the task reward R of each row.
    """

    student_prompt_BP: torch.Tensor
    teacher_prompt_BQ: torch.Tensor
    completion_BT: torch.Tensor
    logp_old_BT: torch.Tensor
    rewards_B: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.completion_BT.shape[0])

    def to(self, device: torch.device | str) -> TwoViewBatch:
        return _map_tensors(self, lambda t: t.to(device), batched_only=False)

    def select(self, index_B: torch.Tensor | slice) -> TwoViewBatch:
        return _map_tensors(self, lambda t: t[index_B], batched_only=True)
