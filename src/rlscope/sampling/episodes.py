"""Cached multi-turn sampling: many episodes batched, each row at its own turn (issue 20).

``generate_episodes(policy, factory, env_seeds_B, budget, cfg, row_seeds_B)`` plays one episode
per row against the environment ``factory.make(seed)`` and returns it as one `RolloutBatch`
row: the prompt is the environment's initial observation, the completion the interleaved
policy and environment segments, ``completion_mask_BT`` is 1 on the policy's tokens only and
the episode fields (``env_mask_BT``, ``turn_BT``, ``turn_rewards_BK``, ``turns_B``,
``end_reason_B``, ``env_time_B``, ``env_errors_B``, ``env_seeds_B``) say which token is
whose, what each turn earned and why the episode ended.

One loop, position by position over the KV cache, advances every row by one token per step:

- a row in a **policy turn** samples its token with the single-turn sampler's `draw` and the
  same counter-based noise (keyed by the row's seed and the completion position), so its
  log-probs (sampler's and raw) are those the learner recomputes;
- a row in an **environment segment** is fed its next observation token: the token goes
  through the cache like a sampled one (an incremental prefill, never a recomputation of the
  episode); its log-probs are 0 and nothing is drawn for it;
- a row whose episode ended emits the pad token (loss mask 0, like a single-turn row after its
  stop token).

A policy turn ends at one of the factory's ``turn_stop_token_ids`` or after
``budget.max_turn_tokens`` tokens; the row's environment then steps (`rlscope.envs.stepping`:
synchronously in this process, or with an `EpisodePool` in worker processes while other
sub-batches decode; in this process the turns that end at one position step in one
``factory.step_many`` call where the factory is `rlscope.envs.base.BatchStepping`, e.g.
twenty_questions' model answerer answering them in one batched decode), and its observation is
fed from the next position on. Budgets
(`rlscope.envs.EpisodeBudget`) truncate an episode with the first reason reached:
``max_turns`` after the last allowed turn (recorded as ``max_turn_tokens`` instead when that
last turn was itself cut by the per-turn limit), ``max_episode_tokens`` when the completion is
full (mid-turn or mid-observation). An environment that raises ends its episode 'failed' with
reward 0 for the turn and counts in ``env_errors_B``.

``use_cache=False`` recomputes the whole prefix at every position (the reference the tests
compare the cached loop with). The host reads each step's tokens (one device sync per
position), which the environments need anyway.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
import weakref
from collections import deque
from collections.abc import Generator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.envs.base import (
    DONE_REASONS,
    TRUNCATION_REASONS,
    BatchStepping,
    Environment,
    EnvironmentFactory,
    EpisodeBudget,
    Transition,
)
from rlscope.envs.stepping import ERROR_REASON, StepMany, StepResult, timed_step, timed_steps
from rlscope.policy.base import Policy
from rlscope.sampling.draw import Draw, SamplingConfig, draw
from rlscope.sampling.processors import gumbel_offsets

__all__ = ["ENV_ERROR_REASON", "EpisodePool", "episode_loss_metrics", "episode_metrics",
           "generate_episodes", "initial_observations"]

ENV_ERROR_REASON = ERROR_REASON
"""The end reason of an episode whose environment raised."""

_POLICY, _ENV, _DONE = 0, 1, 2


@dataclass
class _Row:
    """One episode's progress (host side)."""

    env: Environment
    mode: int = _POLICY
    turn: int = 0
    """The current turn (policy turns taken before it)."""
    action: list[int] = field(default_factory=list)
    """The current policy turn's tokens."""
    cut: bool = False
    """The current turn was cut by the per-turn token limit."""
    pending: deque[int] = field(default_factory=deque)
    """Observation tokens still to feed."""
    rewards: list[float] = field(default_factory=list)
    reason: str = ""
    by_env: bool = False
    seconds: float = 0.0
    errors: int = 0


class EpisodePool:
    """Worker processes for slow environments (``--env_processes``).

    With ``processes`` workers the episode batch is decoded as that many sub-batches of whole
    groups, each its own cached loop: while one waits for its environments' steps (running in
    the workers, the environment sent with the call and returned with its new state), the
    others decode, so environment time overlaps decoding and steps of different sub-batches
    run in parallel. The executor starts on first use (spawned workers, which import no torch;
    a script driving it needs the ``if __name__ == "__main__":`` guard) and stops when the pool
    is closed or collected."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"an episode pool needs >= 1 process (got {processes})")
        self.processes = processes
        self._executor: ProcessPoolExecutor | None = None

    def executor(self) -> Executor:
        """The running executor (started on first use)."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn"))
            weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        return self._executor

    def submit(self, env: Environment, action: tuple[int, ...]) -> Future[StepResult]:
        """`timed_step` of ``env`` in a worker; a pool broken by a dead worker is replaced
        once (the episodes whose steps it lost end 'failed', see `_result`)."""
        try:
            return self.executor().submit(timed_step, env, action)
        except BrokenProcessPool:
            self.close()
            return self.executor().submit(timed_step, env, action)

    def close(self) -> None:
        """Stop the workers (a later call starts new ones)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def _result(future: Future[StepResult], env: Environment) -> StepResult:
    """The step's result; a worker that died or could not run it ends the episode 'failed'
    (counted in ``env_errors_B``) instead of stopping the run."""
    try:
        return future.result()
    except Exception:
        failed = Transition(observation=(), reward=0.0, done=True, reason=ERROR_REASON)
        return StepResult(env, failed, 0.0, error=True)


def initial_observations(factory: EnvironmentFactory, env_seeds: list[int]
                         ) -> list[tuple[int, ...]]:
    """The initial observation of each seed's environment (what the rows' prompts are)."""
    return [tuple(factory.make(seed).reset()) for seed in env_seeds]


def _apply(row: _Row, result: StepResult, budget: EpisodeBudget) -> None:
    """End ``row``'s policy turn with its environment's step ``result``; set what comes
    next."""
    transition = result.transition
    row.env = result.env
    row.seconds += result.seconds
    row.errors += int(result.error)
    row.rewards.append(float(transition.reward))
    row.turn += 1
    if transition.done:
        row.mode, row.by_env = _DONE, True
        row.reason = transition.reason if transition.reason in DONE_REASONS else ERROR_REASON
    elif row.turn >= budget.max_turns:
        row.mode = _DONE
        row.reason = "max_turn_tokens" if row.cut else "max_turns"
    else:
        row.pending.extend(int(t) for t in transition.observation)
        row.mode = _ENV if row.pending else _POLICY
    row.action, row.cut = [], False


Requests = list[tuple[int, tuple[int, ...]]]
"""(row, action) pairs whose environments must step before the loop goes on."""


def _decode(policy: Policy, rows: list[_Row], prompts: PromptBatch, budget: EpisodeBudget,
            stops: set[int], cfg: SamplingConfig, row_seeds_B: torch.Tensor, pad_token_id: int,
            with_entropy: bool, with_sum_p2: bool
            ) -> Generator[Requests, list[StepResult], dict[str, torch.Tensor | None]]:
    """The position loop of one (sub-)batch (module docstring). Yields the environment steps
    it needs at a position (the driver sends back their results, in order) and returns the
    stacked per-position tensors."""
    device, B = row_seeds_B.device, len(rows)
    T, greedy = budget.max_episode_tokens, cfg.temperature == 0
    if cfg.use_cache:
        cache = policy.init_cache(B, prompts.tokens_BP.shape[1] + T)
        logits_BV = policy.prefill(prompts.tokens_BP, prompts.attention_mask_BP, cache)
    else:
        seq_BL, mask_BL = prompts.tokens_BP, prompts.attention_mask_BP
        logits_BV = policy.forward(seq_BL, mask_BL)[0][:, -1]
    draws: list[Draw] = []
    tokens, kinds, turns = [], [], []
    for t in range(T):
        kind = [row.mode for row in rows]
        sampling_B = torch.tensor([k == _POLICY for k in kind], device=device)
        gumbel_BV = None if greedy else gumbel_offsets(row_seeds_B, t, logits_BV.shape[-1])
        d = draw(logits_BV, sampling_B, gumbel_BV, cfg, pad_token_id, with_entropy,
                 with_sum_p2)
        sampled = d.token_B.tolist()
        step_tokens, requests = [], []
        # an observation answers the turn before it: policy turn k and its answer share k
        turns.append([row.turn if k == _POLICY else row.turn - 1 if k == _ENV else -1
                      for row, k in zip(rows, kind, strict=True)])
        for i, (row, k, token) in enumerate(zip(rows, kind, sampled, strict=True)):
            if k == _POLICY:
                row.action.append(int(token))
                if int(token) in stops or len(row.action) >= budget.max_turn_tokens:
                    row.cut = int(token) not in stops
                    requests.append((i, tuple(row.action)))
            elif k == _ENV:
                token = row.pending.popleft()
                if not row.pending:
                    row.mode = _POLICY
            else:
                token = pad_token_id
            step_tokens.append(int(token))
        if requests:
            results = yield requests
            for (i, _), result in zip(requests, results, strict=True):
                _apply(rows[i], result, budget)
        token_B = torch.tensor(step_tokens, dtype=torch.long, device=device)
        draws.append(d)
        tokens.append(token_B)
        kinds.append(torch.tensor(kind, device=device))
        if all(row.mode == _DONE for row in rows) or t + 1 == T:
            break
        if cfg.use_cache:
            logits_BV = policy.decode_step(token_B, cache)
        else:
            seq_BL = torch.cat([seq_BL, token_B[:, None]], 1)
            if mask_BL is not None:
                mask_BL = torch.cat([mask_BL, torch.ones_like(mask_BL[:, :1])], 1)
            logits_BV = policy.forward(seq_BL, mask_BL)[0][:, -1]
    for row in rows:
        if row.mode != _DONE:
            row.mode, row.reason = _DONE, "max_episode_tokens"
    kind_BT = torch.stack(kinds, 1)
    policy_BT = kind_BT == _POLICY
    keep = [d.keep_BV for d in draws if d.keep_BV is not None]
    entropy = [d.entropy_B for d in draws if d.entropy_B is not None]
    sum_p2 = [d.sum_p2_B for d in draws if d.sum_p2_B is not None]
    return {
        "completion_tokens_BT": torch.stack(tokens, 1),
        "completion_mask_BT": policy_BT.float(),
        "logp_sampler_BT": torch.stack([d.logp_sampler_B for d in draws], 1) * policy_BT,
        "logp_raw_BT": torch.stack([d.logp_raw_B for d in draws], 1) * policy_BT,
        "keep_mask_BTV": torch.stack(keep, 1) if keep else None,
        "entropy_BT": torch.stack(entropy, 1) * policy_BT if entropy else None,
        "sum_p2_sampler_BT": torch.stack(sum_p2, 1) * policy_BT if sum_p2 else None,
        "env_mask_BT": (kind_BT == _ENV).float(),
        "turn_BT": torch.tensor(turns, dtype=torch.long, device=device).T.contiguous(),
    }


_PAD_AFTER = {"completion_mask_BT": 0, "logp_sampler_BT": 0, "logp_raw_BT": 0,
              "keep_mask_BTV": True, "entropy_BT": 0, "sum_p2_sampler_BT": 0,
              "env_mask_BT": 0, "turn_BT": -1}
"""What a sub-batch that ended early holds after its last position (its rows are done)."""


def _joined(parts: list[dict[str, torch.Tensor | None]], pad_token_id: int
            ) -> dict[str, torch.Tensor | None]:
    """The sub-batches' per-position tensors side by side in rows, the shorter right-padded
    as finished rows are."""
    if len(parts) == 1:
        return parts[0]
    T = max(int(p["completion_tokens_BT"].shape[1]) for p in parts)  # type: ignore[union-attr]
    out: dict[str, torch.Tensor | None] = {}
    for name in parts[0]:
        values = [p[name] for p in parts]
        if values[0] is None:
            out[name] = None
            continue
        fill = _PAD_AFTER.get(name, pad_token_id)
        padded = []
        for v in values:
            assert v is not None
            extra = T - v.shape[1]
            if extra:
                tail = torch.full((v.shape[0], extra, *v.shape[2:]), fill, dtype=v.dtype,
                                  device=v.device)
                v = torch.cat([v, tail], 1)
            padded.append(v)
        out[name] = torch.cat(padded)
    return out


def _drive(loops: list[Generator[Requests, list[StepResult], dict[str, torch.Tensor | None]]],
           rows: list[list[_Row]], pool: EpisodePool | None, step_many: StepMany | None = None
           ) -> list[dict[str, torch.Tensor | None]]:
    """Run the sub-batches' loops to their end: environment steps in this process (``pool``
    None, one loop; the steps of one position in one ``step_many`` call where the factory
    has it) or in the pool's workers, a loop resuming as soon as all the steps it waits for
    are done while the others decode."""
    results: dict[int, dict[str, torch.Tensor | None]] = {}
    waiting: dict[int, tuple[Requests, list[Future[StepResult]]]] = {}

    def advance(k: int, sent: list[StepResult] | None) -> None:
        while True:
            try:
                requests = loops[k].send(sent)  # type: ignore[arg-type]
            except StopIteration as stop:
                results[k] = stop.value
                return
            if pool is None:
                sent = timed_steps([rows[k][i].env for i, _ in requests],
                                   [action for _, action in requests], step_many)
                continue
            waiting[k] = requests, [pool.submit(rows[k][i].env, action)
                                    for i, action in requests]
            return

    for k in range(len(loops)):
        advance(k, None)
    while waiting:
        ready = [k for k, (_, futures) in waiting.items() if all(f.done() for f in futures)]
        if not ready:
            wait([f for _, futures in waiting.values() for f in futures],
                 return_when=FIRST_COMPLETED)
            continue
        for k in ready:
            requests, futures = waiting.pop(k)
            advance(k, [_result(f, rows[k][i].env)
                        for (i, _), f in zip(requests, futures, strict=True)])
    return [results[k] for k in range(len(loops))]


def _group_chunks(group_id_B: torch.Tensor, n: int) -> list[slice]:
    """At most ``n`` contiguous slices of whole groups with about as many rows each."""
    starts = [0] + [i for i in range(1, len(group_id_B))
                    if int(group_id_B[i]) != int(group_id_B[i - 1])]
    n = max(1, min(n, len(starts)))
    bounds = [starts[round(j * len(starts) / n)] for j in range(n)] + [len(group_id_B)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


@torch.no_grad()
def generate_episodes(policy: Policy, factory: EnvironmentFactory, env_seeds_B: torch.Tensor,
                      budget: EpisodeBudget, cfg: SamplingConfig, row_seeds_B: torch.Tensor,
                      pad_token_id: int = 0, group_id_B: torch.Tensor | None = None,
                      with_entropy: bool = False, with_sum_p2: bool = False,
                      pool: EpisodePool | None = None) -> RolloutBatch:
    """One episode per row of ``env_seeds_B`` (module docstring), as a `RolloutBatch`.

    Shapes: ``env_seeds_B`` and ``row_seeds_B`` ``[B]`` (rows of a GRPO group share their
    environment seed and differ in their sampling seed); returns prompts ``[B, P]`` (the
    initial observations, left-padded) and completions ``[B, T]`` with
    ``T <= budget.max_episode_tokens``. Greedy when ``cfg.temperature == 0``; ``cfg``'s stop
    tokens and ``max_new_tokens`` are not read (the factory's turn stops and the budget are).
    ``with_entropy`` / ``with_sum_p2``: as `rlscope.sampling.sampler.generate` (0 on
    environment tokens). ``pool``: step the environments in its worker processes, the batch
    decoded as that many sub-batches of whole groups (`EpisodePool`); None = in this process.
    """
    problems = budget.validate()
    if problems:
        raise ValueError("; ".join(problems))
    device = row_seeds_B.device
    B = int(env_seeds_B.shape[0])
    group_B = group_id_B if group_id_B is not None else torch.arange(B, device=device)
    rows = [_Row(env=factory.make(int(s))) for s in env_seeds_B.tolist()]
    observations = []
    for row in rows:
        t0 = time.perf_counter()
        observations.append(torch.tensor(row.env.reset(), dtype=torch.long))
        row.seconds += time.perf_counter() - t0
    if any(o.numel() == 0 for o in observations):
        raise ValueError(f"environment {factory.name!r} gave an empty initial observation: the "
                         "policy needs at least one token to start from")
    prompts = PromptBatch.left_padded(observations, pad_token_id).to(device)
    stops = set(factory.turn_stop_token_ids)
    chunks = _group_chunks(group_B.cpu(), pool.processes) if pool is not None \
        else [slice(0, B)]
    loops = []
    for c in chunks:
        sub = prompts.select(c)
        # a sub-batch keeps only the padding it needs (the rows' positions do not change)
        assert sub.attention_mask_BP is not None
        width = int(sub.attention_mask_BP.sum(-1).max())
        sub = PromptBatch(tokens_BP=sub.tokens_BP[:, -width:],
                          attention_mask_BP=None if bool(sub.attention_mask_BP[:, -width:].all())
                          else sub.attention_mask_BP[:, -width:])
        loops.append(_decode(policy, rows[c], sub, budget, stops, cfg, row_seeds_B[c],
                             pad_token_id, with_entropy, with_sum_p2))
    step_many = factory.step_many if isinstance(factory, BatchStepping) else None
    decoded = _joined(_drive(loops, [rows[c] for c in chunks], pool, step_many), pad_token_id)
    prompt_mask = prompts.attention_mask_BP
    assert prompt_mask is not None
    rewards_BK = torch.zeros(B, budget.max_turns, device=device)
    for i, row in enumerate(rows):
        rewards_BK[i, :len(row.rewards)] = torch.tensor(row.rewards)
    completion = {k: v for k, v in decoded.items() if v is not None}
    return RolloutBatch(
        prompt_tokens_BP=prompts.tokens_BP,
        prompt_mask_BP=None if bool(prompt_mask.all()) else prompt_mask,
        completion_tokens_BT=completion.pop("completion_tokens_BT"),
        completion_mask_BT=completion.pop("completion_mask_BT"),
        logp_sampler_BT=completion.pop("logp_sampler_BT"),
        logp_raw_BT=completion.pop("logp_raw_BT"),
        finished_by_stop_B=torch.tensor([row.by_env for row in rows], device=device),
        group_id_B=group_B,
        turn_rewards_BK=rewards_BK,
        turns_B=torch.tensor([len(row.rewards) for row in rows], device=device),
        end_reason_B=torch.tensor([DONE_REASONS.index(row.reason) for row in rows],
                                  device=device),
        env_time_B=torch.tensor([row.seconds for row in rows], dtype=torch.float64,
                                device=device).float(),
        env_errors_B=torch.tensor([row.errors for row in rows], device=device),
        env_seeds_B=env_seeds_B.to(device),
        **completion,
    )


def episode_metrics(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """The ``episode/`` and ``env/`` metrics of an episode batch (``{}`` for a single-turn
    one): turns, policy and environment tokens per episode (means over rows), the fraction
    truncated for each reason, solved episodes, the mean reward per turn taken, and the
    environment's seconds and errors over the batch."""
    if batch.env_mask_BT is None or batch.turns_B is None or batch.end_reason_B is None \
            or batch.turn_rewards_BK is None:
        return {}
    turns_B = batch.turns_B.float()
    m = {"episode/turns": turns_B.mean(),
         "episode/policy_tokens": batch.completion_mask_BT.sum(-1).mean(),
         "episode/env_tokens": batch.env_mask_BT.sum(-1).mean(),
         "episode/solved_frac": (batch.end_reason_B == DONE_REASONS.index("solved"))
         .float().mean(),
         "episode/reward_per_turn": batch.turn_rewards_BK.sum() / turns_B.sum().clamp_min(1.0)}
    for reason in TRUNCATION_REASONS:
        m[f"episode/truncated_frac/{reason}"] = (
            batch.end_reason_B == DONE_REASONS.index(reason)).float().mean()
    if batch.env_time_B is not None:
        m["env/time"] = batch.env_time_B.sum()
    if batch.env_errors_B is not None:
        m["env/errors"] = batch.env_errors_B.sum().float()
    return m


def episode_loss_metrics(env_mask_BT: torch.Tensor | None, loss_mask_BT: torch.Tensor
                         ) -> dict[str, torch.Tensor]:
    """``episode/env_tokens_in_loss``: the fraction of environment tokens the learner's loss
    mask ``loss_mask_BT`` covers (0 in a correct run; the doctor's ``env_tokens_in_loss``
    fires above it); ``{}`` without episodes."""
    if env_mask_BT is None:
        return {}
    inside = (env_mask_BT * (loss_mask_BT != 0)).sum()
    return {"episode/env_tokens_in_loss": inside / env_mask_BT.sum().clamp_min(1.0)}
