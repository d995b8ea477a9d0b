"""The training loop: ``train(cfg) -> RunResult`` (METHODS.md, "Training protocol").

`setup` builds the run's parts (`RunParts`): the validated method, task and derived sizes, the
policy (and value head, reference), the optimizer, the run's generator and the learner. The
batch source (`rlscope.replay.batch_source`: staleness queue, replay or the fixed
``--overfit_batch``) is chosen once and checkpointed. Then each step is a row of named stages:

- **eval** (`RunLog.evaluate`), when due, before the update;
- **collect** (`Collector`): sample, score, shape the rewards (`shape_rewards`: the method's
  overlong penalty, ReMax's greedy baseline), fill mixed groups; the source decides which
  batch the step trains on (the fresh one while the staleness queue warms up);
- **select** (`select_stage`): the method's selection, dispatched through
  `rlscope.methods.selection.SELECTIONS`, and the overlong mask;
- **prepare** (`prepare_stage`): candidates, advantages and every fixed per-row input;
- **learn** (`learn_stage`): ``inner_epochs`` passes of ``num_minibatches`` optimizer steps,
  each accumulated over micro-batches, with the optional diagnostics around it;
- **companion** (`companion_stage`): a task that owns a second model (`TrainsCompanion`:
  twenty_questions' model answerer) trains or measures it on the batch;
- **log** (`step_values`, `RunLog.step`): metrics from the last pass plus first-pass versions
  of the ratio/KL/clip metrics, timings, the adaptive controllers;
- **checkpoint**: divergence check, then `rlscope.checkpoint.save` when due.

The loop never looks at the method's name: what a method needs it declares on its
`MethodSpec`. A method whose step kind is not ``rollout`` (`MethodSpec.step`: ``set``,
``two_view``, ``tree``; `rlscope.steps.STEPS`) runs through `kind_train` instead: the same
run directory, evaluation schedule, logs, live doctor, divergence stop and exact resume around
its `KindStep`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from rlscope import checkpoint, distributed
from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.config import (
    ConfigError,
    Derived,
    RunConfig,
    TrainConfig,
    correction_warnings,
    effective_config,
    to_dict,
    validate,
)
from rlscope.diagnostics import entropy_diagnostics, gradient_diagnostics, snapshot
from rlscope.doctor.live import LiveDoctor, alert_line
from rlscope.doctor.render import findings_json
from rlscope.env_workers import PoolOptions, close_env_workers, env_metrics, with_env_workers
from rlscope.evaluation import OPD_EVAL_OFFSET, evaluate, heldout_batch, opd_evaluation
from rlscope.learner import (
    LearnerInputs,
    UpdatePlan,
    UpdateResult,
    forward_completion,
    minibatch_rows,
    prepare,
    update,
    wants_expected_reward,
)
from rlscope.learner_graphs import GraphedUpdate
from rlscope.learner_packed import resolve_learner
from rlscope.methods import canonical_method_name, resolve_method
from rlscope.methods.advantages import gae_returns, last_token_rewards
from rlscope.methods.regularizers import (
    adaptive_entropy_update,
    adaptive_kl_update,
    kl_warmup_beta,
    value_loss,
)
from rlscope.methods.selection import (
    OVERLONG,
    SelectionInputs,
    fill_mixed_groups,
    overlong_penalty_B,
    overlong_shaped,
    select_rows,
    step_generator,
    top_up_mixed_groups,
)
from rlscope.methods.spec import MethodSpec, OverlongConfig
from rlscope.methods.teacher import PolicyTeacher, TargetTeacher, Teacher, teacher_errors
from rlscope.metrics import estimators as est
from rlscope.metrics.sinks import (
    JsonlWriter,
    LiveDisplay,
    ScalarSinks,
    append_csv_rows,
    parse_log_to,
    read_jsonl,
    truncate_csv_rows,
    truncate_jsonl,
)
from rlscope.policy import add_lora, reference_of
from rlscope.policy.base import Policy, fp32_output_head
from rlscope.policy.value_head import ValueHead
from rlscope.replay import ADVANTAGE_PRIORITIES, BatchSource, batch_source
from rlscope.sampling import graphs
from rlscope.sampling.backends import check_backend
from rlscope.sampling.backends.hf_static import take_weight_sync_seconds
from rlscope.sampling.candidates import sample_candidates
from rlscope.sampling.episodes import episode_loss_metrics, episode_metrics, generate_episodes
from rlscope.sampling.processors import SampledDistribution
from rlscope.sampling.sampler import SamplingConfig, generate
from rlscope.steps import ROLLOUT, STEPS, KindStep, kind_of, validate_run
from rlscope.tasks.base import (
    GroupSized,
    Interactive,
    Task,
    TrainsCompanion,
    WatchesPolicy,
    make_policy_for,
)
from rlscope.tasks.noise import apply_reward_noise, exposes_expected_reward, noise_generator
from rlscope.utils import environment_info, resolve_device

if TYPE_CHECKING:
    from rlscope.policy.hf import HFPolicy

OUT_OF_REGIME_STREAK = 10
GREEDY_NOISE_SEED_OFFSET = 4_000_037
LOGS = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")
"""The run directory's per-step logs, truncated to the checkpoint's step on resume."""
NONFINITE_PARAMS = "nonfinite_params"
"""Not a metric: the count of non-finite parameter tensors, fetched with the step's metrics."""


@dataclass
class LoopState:
    """Everything besides modules and optimizer that a checkpoint must restore."""

    source: BatchSource
    """Where each step's batch comes from (staleness queue, replay or the fixed batch)."""
    step: int = 0
    beta: float = 0.0
    entropy_coef: float = 0.0
    """The entropy bonus c in force (moves under adaptive entropy control)."""
    entropy_history: list[float] = field(default_factory=list)
    """``policy/entropy`` of the last ``entropy_window`` trained steps (adaptive control)."""
    fallback_streak: int = 0


@dataclass
class RunResult:
    run_dir: Path
    seed: int
    status: str
    """completed | out_of_regime | diverged (a run that raises writes ``failed`` to
    status.json)"""
    metrics: list[dict[str, float]]
    evals: list[dict[str, float]]
    wall_time_s: float
    reason: str = ""
    """Why a diverged run stopped: the step and the non-finite metric or parameter."""

    @property
    def final_eval(self) -> dict[str, float]:
        return self.evals[-1] if self.evals else {}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """All of one step's metric tensors to Python floats with a single device transfer."""
    if not metrics:
        return {}
    values = torch.stack([v.detach().float().reshape(()) for v in metrics.values()]).tolist()
    return dict(zip(metrics, values, strict=True))


def sample_rollouts(policy: Policy, task: Task, cfg: TrainConfig, generator: torch.Generator,
                    device: torch.device, num_prompts: int, group_size: int,
                    max_new_tokens: int, with_sum_p2: bool = False,
                    parallel: distributed.DataParallel | None = None) -> RolloutBatch:
    """Sample ``num_prompts × group_size`` rollouts (rows of a group are contiguous);
    ``with_sum_p2`` also records the behaviour distribution's Σ_v μ(v)² per token. With
    ``parallel`` each rank decodes its shard of whole groups and gets the gathered batch."""
    prompts = task.sample_prompts(generator, num_prompts).repeat_interleave(group_size)
    seeds_B = torch.randint(0, 2**62, (prompts.batch_size,), generator=generator)
    group_B = torch.arange(num_prompts).repeat_interleave(group_size)
    if parallel is not None:  # the whole batch's prompts and seeds were drawn: streams agree
        rows = parallel.sample_rows(prompts.batch_size, group_size)
        prompts = prompts.select(rows)
        seeds_B, group_B = seeds_B[rows], group_B[rows]
    prompts, seeds_B, group_B = prompts.to(device), seeds_B.to(device), group_B.to(device)
    policy.eval()
    sampling = dataclasses.replace(
        cfg.sampling, decode_graphs=cfg.sampling.decode_graphs and cfg.run.cuda_graphs)
    if isinstance(task, Interactive):  # multi-turn: each row an episode from its prompt's seed
        assert prompts.env_seeds_B is not None
        rollout = generate_episodes(policy, task.environment_factory, prompts.env_seeds_B,
                                    task.episode_budget, sampling, seeds_B, group_id_B=group_B,
                                    with_sum_p2=with_sum_p2, pool=task.episode_pool)
    else:
        rollout = generate(policy, prompts, sampling, seeds_B, max_new_tokens,
                           group_id_B=group_B, with_sum_p2=with_sum_p2)
    return rollout if parallel is None else parallel.gather_rollouts(rollout)


def score_rollouts(rollout: RolloutBatch, policy: Policy, task: Task, cfg: TrainConfig,
                   want_expected_reward: bool, step: int,
                   noise: torch.Generator | None = None) -> RolloutBatch:
    """Attach the task's rewards, corrupted by the configured training reward noise, and,
    where the task exposes it and rewards are clean, the exact E[r | x] under the behaviour
    policy (one teacher-forced pass over the targets). ``raw_rewards_B`` keeps the rewards
    before noise and before the task's own shaping; ``noise_B`` marks the rows the noise
    replaced. ``noise`` is the noise stream (default: the step's `noise_generator`). Where the
    task returns a valid mask (``Scores.valid_mask_BT``: unique_path's termination), the
    completion mask, hence the loss mask and the length metrics, is multiplied by it."""
    scores = task.score(rollout)
    noise_cfg = cfg.task_options
    raw_B = scores.rewards_B if scores.unshaped_rewards_B is None else scores.unshaped_rewards_B
    # Every task's unshaped reward is exactly 1 on a fully correct output, below 1 otherwise.
    correct_B = raw_B >= 1.0
    rewards_B, noise_B = apply_reward_noise(
        scores.rewards_B, rollout.completion_tokens_BT, rollout.completion_mask_BT,
        rollout.prompt_tokens_BP, correct_B, noise_cfg, task.family,
        noise_generator(cfg.run.seed, step) if noise is None else noise)
    expected = None
    if want_expected_reward and exposes_expected_reward(noise_cfg) \
            and rollout.targets_BT is not None:
        with torch.no_grad():
            labels = SampledDistribution(cfg.sampling.temperature, replay_keep=False)
            logp_BT = forward_completion(policy, rollout, rollout.targets_BT, labels).logp_BT
        expected = task.expected_reward(logp_BT)
    return dataclasses.replace(
        rollout, rewards_B=rewards_B, raw_rewards_B=raw_B, noise_B=noise_B,
        token_rewards_BT=scores.token_rewards_BT, expected_reward_B=expected,
        completion_mask_BT=rollout.completion_mask_BT if scores.valid_mask_BT is None
        else rollout.completion_mask_BT * scores.valid_mask_BT.to(rollout.completion_mask_BT),
        age_B=torch.zeros(rollout.batch_size, device=rollout.completion_tokens_BT.device))


@torch.no_grad()
def greedy_rewards(rollout: RolloutBatch, policy: Policy, task: Task, cfg: TrainConfig,
                   overlong: OverlongConfig, group_size: int, max_new_tokens: int, step: int
                   ) -> torch.Tensor:
    """ReMax's baseline ``[B]``: the training reward of one greedy rollout per prompt (rows of a
    group share theirs), decoded with the policy in eval mode.

    The greedy completion gets the same reward function as the samples: the task's score, the
    configured training reward noise (drawn from its own stream, so the samples' noise is
    unchanged) and the method's overlong shaping where active. Source: Li et al.
    arXiv:2310.10505. Regime: any task.
    """
    prompts = PromptBatch(
        tokens_BP=rollout.prompt_tokens_BP[::group_size],
        attention_mask_BP=None if rollout.prompt_mask_BP is None
        else rollout.prompt_mask_BP[::group_size],
        targets_BT=None if rollout.targets_BT is None else rollout.targets_BT[::group_size],
        score_mask_BT=None if rollout.score_mask_BT is None
        else rollout.score_mask_BT[::group_size])
    policy.eval()
    greedy_cfg = SamplingConfig(temperature=0.0, stop_token_ids=cfg.sampling.stop_token_ids,
                                decode_graphs=cfg.sampling.decode_graphs and cfg.run.cuda_graphs)
    seeds_B = torch.zeros(prompts.batch_size, dtype=torch.long,
                          device=prompts.tokens_BP.device)
    if isinstance(task, Interactive):  # one greedy episode from each group's start
        assert rollout.env_seeds_B is not None
        greedy = generate_episodes(policy, task.environment_factory,
                                   rollout.env_seeds_B[::group_size], task.episode_budget,
                                   greedy_cfg, seeds_B, pool=task.episode_pool)
    else:
        greedy = generate(policy, prompts, greedy_cfg, seeds_B, max_new_tokens)
    scored = score_rollouts(greedy, policy, task, cfg, False, step, noise=step_generator(
        cfg.run.seed, step, GREEDY_NOISE_SEED_OFFSET))
    if OVERLONG[overlong.name].shapes_reward:
        scored = overlong_shaped(scored, max_new_tokens, overlong)
    assert scored.rewards_B is not None
    return scored.rewards_B.repeat_interleave(group_size)


@dataclass(frozen=True)
class RunParts:
    """What `setup` builds for one run before anything is written."""

    cfg: TrainConfig
    """The effective config (the task's stop tokens where none are given)."""
    spec: MethodSpec
    task: Task
    d: Derived
    overlong: OverlongConfig
    """The method's overlong handling; ``none`` on fixed-length completions."""
    device: torch.device
    policy: Policy
    value_head: ValueHead | None
    ref: Policy | None
    params: list[torch.Tensor]
    """The trainable tensors (a LoRA policy's frozen base stays out)."""
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    """The run's stream: prompts, sampling seeds, candidates, replay draws."""
    plan: UpdatePlan
    learn: Callable[[RolloutBatch, LearnerInputs, float, float], UpdateResult]
    """One update (eager `update`, or `GraphedUpdate` under CUDA graphs)."""
    want_expected: bool
    """Score with the exact E[r | x] where the task exposes it."""
    record_sum_p2: bool
    """The sampler records the behaviour's Σ_v μ(v)² per token: kondo's baseline, and the
    replay priorities that read the push-time advantage (replay.ADVANTAGE_PRIORITIES)."""
    parallel: distributed.DataParallel | None = None
    """This process's rank in a data-parallel run (`rlscope.distributed`); None = one
    process."""
    sampler: Policy | None = None
    """Under ``--fsdp``: the full copy of the sharded policy that samples, scores, evaluates
    and runs the no-grad forwards (`rlscope.distributed.sampling_copy`, refreshed after each
    update); None = ``policy`` itself."""
    teacher: Teacher | None = None
    """The frozen teacher of the distillation methods (`load_teacher`); None = none."""

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files (rank 0, or the only process)."""
        return self.parallel is None or self.parallel.is_main

    @property
    def acting(self) -> Policy:
        """The policy with whole weights: everything but the update reads it."""
        return self.policy if self.sampler is None else self.sampler


def setup(cfg: TrainConfig) -> RunParts:
    """Validate ``cfg`` and build the run's parts (threads and torch's seed set on the way)."""
    spec, task, d = validate(cfg)
    cfg = effective_config(cfg, d)  # the task's stop tokens where none are given
    r = cfg.run
    world_size = distributed.world_size()
    if world_size > 1:  # before anything is built or written
        errors = distributed.check_layout(d.num_prompts, world_size)
        if errors:
            raise ConfigError("; ".join(errors))
    if r.resume:  # before anything is built or written
        check_resume_config(cfg)
    device = resolve_device(r.device)
    dp = distributed.init(device.type, r.fsdp)
    if dp is not None and device.type == "cuda":
        device = torch.device("cuda", dp.local_rank)
    if r.threads:
        torch.set_num_threads(r.threads)
    torch.manual_seed(r.seed)
    policy = initial_policy(cfg, task, device)
    if isinstance(task, GroupSized):  # its evaluation metrics read K
        task.use_group_size(d.group_size)
    if isinstance(task, TrainsCompanion):  # its second model (twenty_questions' answerer)
        task.start_companion(device, r.seed)
    if spec.fp32_head:  # before the reference's copy, which keeps the patch
        fp32_output_head(policy)
    check_backend(cfg.sampling, policy, device)  # --backend static on a model it lacks
    dtype = next(policy.parameters()).dtype
    value_head = ValueHead(policy.hidden_size).to(device, dtype) if spec.needs_value else None
    ref = reference_of(policy) if spec.needs_reference else None
    try:  # the teacher's weights, vocabulary and distribution: before anything is written
        teacher = builtin_teacher(cfg, task) if spec.builtin_teacher \
            else load_teacher(cfg, task, device, policy, spec) if spec.needs_teacher else None
    except (ValueError, OSError) as e:  # a path that holds no loadable teacher
        raise ConfigError(str(e)) from None
    if cfg.learner.compile_blocks:  # after the reference's copy: only the trained policy
        cast("HFPolicy", policy).compile_blocks()
    sampler = None
    if dp is not None and dp.sharded:  # --fsdp: shard after the reference's and sampler's copies
        sampler = cast(Policy, distributed.sampling_copy(cast(torch.nn.Module, policy)))
        distributed.shard([cast(torch.nn.Module, m) for m in (policy, value_head)
                           if m is not None])
    # Frozen weights (a LoRA policy's base) stay out of the optimizer.
    params = [p for m in (policy, value_head) if m is not None for p in m.parameters()
              if p.requires_grad]
    # The CUDA-graph learner does not sum gradients over ranks: data parallel runs eager.
    use_graphs = r.cuda_graphs and graphs.supported(policy, device) and dp is None \
        and not spec.needs_batch_statistic and not spec.reads_step  # per-step inputs: eager
    # CUDA graphs need capturable AdamW; elsewhere the fused kernel (4x the default on CPU).
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                  betas=(cfg.optim.adam_beta1, cfg.optim.adam_beta2),
                                  capturable=use_graphs, fused=not use_graphs)
    try:  # what the built model allows (--packing on on a model it cannot pack: an error)
        # --fsdp: the padded learner (the packed one reads the head's weights outside a forward)
        packed = None if sampler is not None else resolve_learner(cfg.learner, policy)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # The kept set describes the sampled prefixes; label-trained methods read other tokens.
    plan = UpdatePlan(spec=spec, inner_epochs=r.inner_epochs, num_minibatches=r.num_minibatches,
                      micro_batch_size=d.micro_batch_size, max_len=d.max_new_tokens,
                      grad_clip=cfg.optim.grad_clip, group_size=d.group_size,
                      dist=SampledDistribution(cfg.sampling.temperature,
                                               cfg.sampling.replay_sampling_mask
                                               and not spec.needs_labels),
                      packed=packed,
                      token_budget=cfg.learner.token_budget, parallel=dp)
    learn = GraphedUpdate(plan, policy, value_head, optimizer, r.batch_size) if use_graphs \
        else functools.partial(update, plan, policy, value_head, optimizer)
    return RunParts(
        cfg=cfg, spec=spec, task=task, d=d, device=device, policy=policy,
        overlong=dataclasses.replace(spec.overlong, name=d.overlong),
        value_head=value_head, ref=ref, params=params, optimizer=optimizer,
        generator=torch.Generator().manual_seed(r.seed), plan=plan, learn=learn,
        want_expected=wants_expected_reward(spec, cfg.sampling.top_k, cfg.sampling.top_p),
        record_sum_p2=spec.needs_behaviour_sum_p2 or (
            cfg.replay.replay_capacity > 0
            and cfg.replay.replay_priority in ADVANTAGE_PRIORITIES),
        parallel=dp, teacher=teacher, sampler=sampler)


def initial_policy(cfg: TrainConfig, task: Task, device: torch.device) -> Policy:
    """The task's policy on ``device``; with ``--init`` its loaded weights, LoRA adapters on top
    where asked, and attached to a task that watches it."""
    # --init loads full weights; LoRA adapters then go on top, so the loaded model is the base
    lora_on_init = bool(cfg.run.init) and cfg.model.lora_rank > 0
    model_cfg = dataclasses.replace(cfg.model, lora_rank=0) if lora_on_init else cfg.model
    if cfg.learner.activation_checkpointing:
        model_cfg = dataclasses.replace(model_cfg, gradient_checkpointing=True)
    policy: Policy = make_policy_for(task, model_cfg).to(device)
    if cfg.run.init:
        checkpoint.load_init(cfg.run.init, policy, device)
        if lora_on_init:  # validation allows LoRA on Hugging Face models only
            policy = add_lora(cast("HFPolicy", policy), cfg.model)
        if isinstance(task, WatchesPolicy):  # its frozen initial copy is the loaded model
            task.attach_policy(policy)
    return policy


def builtin_teacher(cfg: TrainConfig, task: Task) -> Teacher:
    """The built-in teacher of ``--teacher`` over the task's targets (`TargetTeacher`):
    A = the student's vocabulary, V = the task's content alphabet (``--vocab``)."""
    t = cfg.teacher_options
    return TargetTeacher(t.teacher, task.vocab_size, cfg.task_options.vocab, t.teacher_epsilon,
                         t.teacher_temperature, t.special_token_weight)


def load_teacher(cfg: TrainConfig, task: Task, device: torch.device, student: Policy,
                 spec: MethodSpec) -> Teacher:
    """The frozen `PolicyTeacher` of ``--teacher_path``: an rlscope checkpoint file, run or
    ``rlscope sft`` directory loaded into the student's architecture (`checkpoint.load_init`,
    which rejects other shapes), or else a Hugging Face model directory (``--arch hf``); then
    rejected, with the reason, if its vocabulary or distribution cannot teach this method
    (`rlscope.methods.teacher.teacher_errors`)."""
    path = Path(cfg.teacher_options.teacher_path)
    rlscope_weights = path.is_file() or (path / "checkpoints").exists() \
        or (path / checkpoint.SFT_FILE).exists()
    model_cfg = dataclasses.replace(cfg.model, lora_rank=0, gradient_checkpointing=False)
    if not rlscope_weights:
        model_cfg = dataclasses.replace(model_cfg, arch="hf", path=str(path))
    policy: Policy = make_policy_for(task, model_cfg).to(device)
    if rlscope_weights:
        checkpoint.load_init(str(path), policy, device)
    teacher = PolicyTeacher(policy)
    errors = teacher_errors(teacher, student.vocab_size, spec.needs_teacher_distribution)
    if errors:
        raise ValueError("; ".join(errors))
    return teacher


def open_run(parts: RunParts, state: LoopState) -> tuple[Path, LoopState, list[str]]:
    """The run directory (new, or the one resumed with its checkpoint loaded into the parts and
    ``state``, and its logs cut back to the checkpoint's step) with ``config.json`` written;
    returns it, the loop state and the notices of the resume."""
    cfg, r, dp = parts.cfg, parts.cfg.run, parts.parallel
    run_dir = Path(r.resume) if r.resume else (
        checkpoint.new_run_dir(cfg, r.runs_dir) if parts.is_main else Path())
    if dp is not None:  # rank 0 names the directory
        run_dir = dp.broadcast(run_dir)
    notices: list[str] = []
    if r.resume:
        state, notices = checkpoint.load(
            run_dir, parts.policy, parts.value_head, parts.ref, parts.optimizer,
            parts.generator, state, parts.device,
            parts.task.load_companion_state if isinstance(parts.task, TrainsCompanion)
            else None)
        if parts.sampler is not None:
            distributed.sync_copy(cast(torch.nn.Module, parts.sampler),
                                  cast(torch.nn.Module, parts.policy))
        if r.num_steps < state.step:
            raise ConfigError(f"run.num_steps={r.num_steps} is below the step of the checkpoint "
                              f"resumed ({state.step}): set --num_steps {state.step} or more")
    if dp is not None:  # every rank has read the checkpoint before rank 0 writes
        dp.barrier()
    if not parts.is_main:
        return run_dir, state, notices
    if r.resume:
        notices += resume_cleanup(cfg, run_dir, state.step)
    checkpoint.atomic_write_text(run_dir / "config.json", json.dumps({
        "config": to_dict(cfg), "derived": to_dict(parts.d), "method_spec": to_dict(parts.spec),
        "task_description": parts.task.describe(), **environment_info(parts.device)}, indent=2))
    return run_dir, state, notices


class RunRecords:
    """Where a run's records go: the JSONL logs, the scalar sinks, the live display and the
    live doctor, the CSV of ``--output``; it also keeps the records `RunResult` returns. Every
    step kind logs through it (`RunLog` adds the rollout step's evaluation and samples)."""

    def __init__(self, cfg: TrainConfig, derived: dict[str, Any], run_dir: Path,
                 start_step: int, notices: list[str]) -> None:
        r = cfg.run
        self.cfg, self.run_dir = cfg, run_dir
        self.metrics, self.evals_log, self.samples = (
            JsonlWriter(run_dir / name, bool(r.resume)) for name in LOGS)
        self.sinks = ScalarSinks(parse_log_to(r.log_to), run_dir, run_dir.name,
                                 {"config": to_dict(cfg), "derived": derived})
        self.history: list[dict[str, float]] = []
        self.evals: list[dict[str, float]] = []
        self.display = LiveDisplay(r.progress, r.num_steps, f"{cfg.method} · {cfg.task}",
                                   start_step)
        for notice in notices:
            self.display.alert(f"resume: {notice}")
        self.doctor = LiveDoctor(r.doctor_every, json.loads((run_dir / "config.json").read_text()),
                                 run_dir.name)
        if r.resume:  # the doctor sees the whole run, not only the resumed part
            for old_record in read_jsonl(run_dir / "metrics.jsonl") + read_jsonl(
                    run_dir / "eval.jsonl"):
                self.doctor.add(old_record)
        self.t_run = time.perf_counter()

    def add_eval(self, record: dict[str, Any]) -> None:
        """Log one evaluation record (``step``, values, ``time/eval``, maybe ``phase``)."""
        r = self.cfg.run
        self.evals.append(record)
        self.doctor.add(record)
        self.evals_log.write(record)
        self.sinks.log(record)
        self.display.eval(record)
        if r.output:
            append_csv_rows(Path(r.output), [{
                "run": self.run_dir.name, "method": self.cfg.method, "task": self.cfg.task,
                "seed": r.seed, **record, "wall_time_s": time.perf_counter() - self.t_run}])

    def add_step(self, record: dict[str, Any]) -> None:
        """Log one trained step's record (``step`` and its values)."""
        self.history.append(record)
        self.metrics.write(record)
        self.sinks.log(record)
        for finding in self.doctor.step(record):
            self.display.alert(alert_line(finding))
        self.display.update({k: v for k, v in record.items() if k != "step"})

    def close(self) -> None:
        self.display.close()
        for log in (self.metrics, self.evals_log, self.samples):
            log.close()
        self.sinks.close()

    def result(self, steps: int, status: str, diverged: dict[str, Any]) -> RunResult:
        """Write the findings and the final status (``steps`` trained); the run's
        `RunResult`."""
        wall = time.perf_counter() - self.t_run
        (self.run_dir / "findings.json").write_text(json.dumps(
            findings_json(self.doctor.final()), indent=2, default=float))
        checkpoint.atomic_write_text(self.run_dir / "status.json", json.dumps(
            {"status": status, "steps": steps, "wall_time_s": wall} | diverged))
        return RunResult(run_dir=self.run_dir, seed=self.cfg.run.seed, status=status,
                         metrics=self.history, evals=self.evals, wall_time_s=wall,
                         reason=diverged.get("reason", ""))


class RunLog(RunRecords):
    """The rollout step's records: `RunRecords` plus its greedy held-out evaluation and the
    decoded samples."""

    def __init__(self, parts: RunParts, run_dir: Path, start_step: int, notices: list[str]
                 ) -> None:
        super().__init__(parts.cfg, to_dict(parts.d), run_dir, start_step, notices)
        self.parts = parts
        self.eval_prompts = heldout_batch(parts.task, parts.cfg.run.seed).to(parts.device)

    def evaluate(self, step: int, phase: str = "") -> None:
        """Greedy held-out evaluation, logged at ``step``; a built-in teacher's run adds the OPD
        diagnostics (`rlscope.evaluation.opd_evaluation`). ``phase`` (e.g. ``"switch"``, the
        warm-up switch's row) tags the record."""
        p, r = self.parts, self.parts.cfg.run
        t0 = time.perf_counter()
        p.acting.eval()
        values = _floats(evaluate(p.acting, p.task, [self.eval_prompts], p.d.max_new_tokens,
                                  p.cfg.sampling.stop_token_ids,
                                  decode_graphs=p.cfg.sampling.decode_graphs and r.cuda_graphs))
        if p.spec.builtin_teacher and p.teacher is not None:
            t, obj = p.cfg.teacher_options, p.spec.objective
            topk = "opd_top_k" in p.spec.objective_component.settings  # else k = overlap_k
            values |= _floats(opd_evaluation(
                p.acting, p.task, p.teacher, step_generator(r.seed, step, OPD_EVAL_OFFSET),
                r.batch_size, p.d.max_new_tokens, t.overlap_k,
                obj.opd_top_k if topk else t.overlap_k,
                obj.opd_support if topk else "student"))
        _sync(p.device)
        record: dict[str, Any] = {"step": step, **values, "time/eval": time.perf_counter() - t0}
        if phase:
            record["phase"] = phase
        self.add_eval(record)

    def step(self, step: int, values: dict[str, float], batch: RolloutBatch,
             adv_BT: torch.Tensor) -> None:
        """Log one trained step's values (and a few decoded samples when due)."""
        r = self.parts.cfg.run
        self.add_step({"step": step, **values})
        if r.log_samples and step % max(r.samples_every, 1) == 0:
            _write_samples(self.samples, step, batch, adv_BT, r.log_samples)


class _Quiet:
    """The live display of a rank that does not print."""

    def alert(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class RankLog(RunLog):
    """A data-parallel rank other than 0: keeps its records for `RunResult`, writes and
    prints nothing and does not evaluate (rank 0 logs the run)."""

    def __init__(self, parts: RunParts, run_dir: Path) -> None:
        self.parts, self.cfg, self.run_dir = parts, parts.cfg, run_dir
        self.history, self.evals = [], []
        self.display = _Quiet()  # type: ignore[assignment]
        self.t_run = time.perf_counter()

    def evaluate(self, step: int, phase: str = "") -> None:
        pass

    def step(self, step: int, values: dict[str, float], batch: RolloutBatch,
             adv_BT: torch.Tensor) -> None:
        self.history.append({"step": step, **values})

    def close(self) -> None:
        pass

    def result(self, steps: int, status: str, diverged: dict[str, Any]) -> RunResult:
        return RunResult(run_dir=self.run_dir, seed=self.parts.cfg.run.seed, status=status,
                         metrics=self.history, evals=self.evals,
                         wall_time_s=time.perf_counter() - self.t_run,
                         reason=diverged.get("reason", ""))


def shape_rewards(batch: RolloutBatch, parts: RunParts, step: int) -> RolloutBatch:
    """The reward-shaping stage on a scored batch: the method's overlong penalty where active,
    and ReMax's greedy baseline where the advantage reads it."""
    p = parts
    if OVERLONG[p.overlong.name].shapes_reward:
        batch = overlong_shaped(batch, p.d.max_new_tokens, p.overlong)
    if p.spec.needs_greedy_baseline:
        greedy_B = greedy_rewards(batch, p.acting, p.task, p.cfg, p.overlong, p.d.group_size,
                                  p.d.max_new_tokens, step)
        batch = dataclasses.replace(batch, greedy_rewards_B=greedy_B)
    return batch


class Collector:
    """The collect stage: sample ``num_prompts × group_size`` rollouts, score them, shape their
    rewards and, with ``--fill_batch``, draw more rounds until the batch holds enough mixed
    groups. The batch source calls it; it records the step's timings and fill metrics."""

    def __init__(self, parts: RunParts) -> None:
        self.parts = parts
        self.begin()

    def begin(self) -> None:
        """Start a step: clear the timings and metrics of the last one."""
        self.t_step = time.perf_counter()
        self.t_sampled: float | None = None
        self.t_scored: float | None = None
        self.metrics: dict[str, torch.Tensor] = {}

    def _sample(self) -> RolloutBatch:
        p = self.parts
        return sample_rollouts(p.acting, p.task, p.cfg, p.generator, p.device, p.d.num_prompts,
                               p.d.group_size, p.d.max_new_tokens, p.record_sum_p2,
                               p.parallel)

    def _scored(self, rollout: RolloutBatch, step: int) -> RolloutBatch:
        p = self.parts
        return shape_rewards(score_rollouts(rollout, p.acting, p.task, p.cfg, p.want_expected,
                                            step), p, step)

    def __call__(self, step: int) -> RolloutBatch:
        p, r = self.parts, self.parts.cfg.run
        fresh = self._sample()
        _sync(p.device)
        self.t_sampled = time.perf_counter()
        fresh = self._scored(fresh, step)
        if r.fill_batch:
            fresh, fill_rounds = fill_mixed_groups(
                fresh, lambda: self._scored(self._sample(), step), r.batch_size,
                p.d.group_size, r.max_fill_rounds)
            self.metrics["group/fill_rounds"] = torch.tensor(float(fill_rounds), device=p.device)
        if p.spec.advantage.gpg_min_valid > 0:
            fresh, fill_rounds = top_up_mixed_groups(
                fresh, lambda: self._scored(self._sample(), step), p.d.group_size,
                p.spec.advantage.gpg_min_valid, r.max_fill_rounds)
            self.metrics["group/fill_rounds"] = torch.tensor(float(fill_rounds), device=p.device)
        _sync(p.device)
        self.t_scored = time.perf_counter()
        self.metrics |= env_metrics(p.task, p.device)
        return fresh

    def timings(self) -> tuple[float, float, float]:
        """``(t_step, t_sampled, t_scored)``; a step that collected nothing (the fixed batch
        of ``--overfit_batch``) spent no time sampling or scoring."""
        now = time.perf_counter()
        t_sampled = now if self.t_sampled is None else self.t_sampled
        return self.t_step, t_sampled, t_sampled if self.t_scored is None else self.t_scored


CRITIC_PRETRAIN_OFFSET = 5_000_011
"""Stream offset of the critic pre-training draws (apart from the run's own stream)."""


def critic_pretrain_stage(parts: RunParts) -> dict[str, torch.Tensor]:
    """VAPO's value pre-training (METHODS_2026.md §2 ``critic_pretrain_steps``): train only
    the value head for ``spec.value.pretrain_steps`` steps on fresh samples of the frozen
    initial policy, regressing onto λ = 1 GAE targets (the Monte-Carlo return with γ = 1)
    with the method's value loss. Draws its prompts and seeds from a stream of its own, so
    the run's batches are those of a run without pre-training. Returns ``critic_pretrain/``
    metrics: the value loss of the first and the last step and the last explained variance."""
    p, steps = parts, parts.spec.value.pretrain_steps
    assert p.value_head is not None
    head_params = [q for q in p.value_head.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(head_params, lr=p.cfg.optim.lr,
                                  weight_decay=p.cfg.optim.weight_decay,
                                  betas=(p.cfg.optim.adam_beta1, p.cfg.optim.adam_beta2))
    losses: list[torch.Tensor] = []
    explained = torch.zeros(())
    for i in range(steps):
        stream = step_generator(p.cfg.run.seed, i, CRITIC_PRETRAIN_OFFSET)
        rollout = sample_rollouts(p.policy, p.task, p.cfg, stream, p.device, p.d.num_prompts,
                                  p.d.group_size, p.d.max_new_tokens, parallel=p.parallel)
        batch = shape_rewards(score_rollouts(rollout, p.policy, p.task, p.cfg, False, 0,
                                             noise=stream), p, 0)
        assert batch.rewards_B is not None
        mask_BT = batch.completion_mask_BT
        with torch.no_grad():
            hidden_BTD = forward_completion(p.policy, batch, batch.completion_tokens_BT,
                                            p.plan.dist, p.d.group_size).hidden_BTD
            old_values_BT = p.value_head(hidden_BTD) * mask_BT
            _, returns_BT = gae_returns(last_token_rewards(batch.rewards_B, mask_BT),
                                        old_values_BT, mask_BT, p.spec.advantage.gamma, 1.0)
        values_BT = p.value_head(hidden_BTD)
        loss_BT, _ = value_loss(values_BT, old_values_BT, returns_BT, p.spec.value)
        loss = est.masked_mean(loss_BT, mask_BT)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if p.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(head_params, p.cfg.optim.grad_clip)
        optimizer.step()
        losses.append(loss.detach())
        explained = est.value_metrics(values_BT.detach() * mask_BT, returns_BT,
                                      mask_BT)["value/explained_var"]
    return {"critic_pretrain/value_loss_first": losses[0],
            "critic_pretrain/value_loss_last": losses[-1],
            "critic_pretrain/explained_var": explained}


def select_stage(parts: RunParts, batch: RolloutBatch, state: LoopState, step: int
                 ) -> tuple[RolloutBatch, dict[str, torch.Tensor]]:
    """The rollout metrics of the batch the source chose, then the method's selection
    (`rlscope.methods.selection.select_rows`); counts the streak of mixed-group fallbacks."""
    p = parts
    m = rollout_metrics(batch, p.overlong, p.d.max_new_tokens)
    assert batch.rewards_B is not None
    if p.spec.advantage_component.grouped:  # the contrast a group baseline learns from
        m |= est.group_outcome_metrics(batch.rewards_B, p.d.group_size)
    batch, select_m, fallback = select_rows(
        batch, p.spec.selection, p.overlong, p.d.max_new_tokens,
        SelectionInputs(p.d.group_size, p.spec.keep_ratio, p.spec.gate.eta, p.cfg.run.seed,
                        step))
    state.fallback_streak = state.fallback_streak + 1 if fallback else 0
    return batch, m | select_m


def prepare_stage(parts: RunParts, batch: RolloutBatch, state: LoopState
                  ) -> tuple[LearnerInputs, dict[str, torch.Tensor]]:
    """Candidates where the objective reads them, then `rlscope.learner.prepare` (advantages
    and every fixed per-row input of the update) and the advantage metrics."""
    p, plan = parts, parts.plan
    p.acting.eval()
    candidates = sample_candidates(p.acting, batch, p.d.group_size, p.generator,
                                   plan.dist) \
        if p.spec.needs_candidates else None
    inputs, m = prepare(p.spec, batch, p.acting, p.value_head, p.ref, state.beta,
                        p.d.group_size, plan.dist, candidates, plan.packed, p.teacher)
    assert batch.rewards_B is not None
    m |= est.advantage_metrics(inputs.adv_BT, inputs.mask_BT, batch.rewards_B, p.d.group_size)
    m |= episode_loss_metrics(batch.env_mask_BT, inputs.mask_BT)
    return inputs, m


def learn_stage(parts: RunParts, batch: RolloutBatch, inputs: LearnerInputs, state: LoopState,
                diagnose: bool) -> dict[str, torch.Tensor]:
    """One update on ``batch`` and its metrics; at evaluation steps (``diagnose``) the
    configured gradient and entropy diagnostics around it."""
    p, plan, diag = parts, parts.plan, parts.cfg.diagnostics
    p.policy.train()
    m: dict[str, torch.Tensor] = {}
    if p.spec.reads_step:  # a warm-up switch (opd_topk_reverse_kl's --opd_warmup_steps)
        inputs = dataclasses.replace(inputs, step=torch.tensor(state.step))
    if diagnose and diag.grad_diagnostics:
        m |= gradient_diagnostics(p.spec, p.policy, p.value_head, batch, inputs, state.beta,
                                  plan.dist, plan.grad_clip,
                                  state.entropy_coef)
    entropy = diagnose and diag.entropy_diagnostics
    before = snapshot(p.policy, batch, inputs, plan.dist) \
        if entropy else None
    if p.spec.needs_batch_statistic:  # Clip-Cov's draws: from the run seed and the step
        inputs = dataclasses.replace(inputs, draw_seed=torch.tensor(
            (p.cfg.run.seed * 1_000_003 + state.step) % 2**62))
    updated = p.learn(batch, inputs, state.beta, state.entropy_coef)
    if p.sampler is not None:  # the updated shards into the full copy
        distributed.sync_copy(cast(torch.nn.Module, p.sampler), cast(torch.nn.Module, p.policy))
    if before is not None:
        after = snapshot(p.policy, batch, inputs, plan.dist)
        m |= entropy_diagnostics(before, after, inputs)
    mb_rows = minibatch_rows(batch.batch_size, plan.num_minibatches, p.d.group_size)
    if p.spec.fp32_head and not p.spec.corrected and not p.spec.needs_labels:
        # the head's precision shows in the sampler/learner mismatch (a correction logs its own)
        d_BT = (updated.first.logp_BT - batch.logp_sampler_BT).clamp(
            -est.LOG_RATIO_CLAMP, est.LOG_RATIO_CLAMP)
        m["sampler/k3"] = est.masked_mean(torch.expm1(d_BT) - d_BT, inputs.mask_BT)
    return m | update_metrics(updated, batch, inputs, p.spec.needs_labels,
                              n_minibatches=-(-batch.batch_size // mb_rows),
                              grad_clip=plan.grad_clip)


def companion_stage(parts: RunParts, batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """After the policy's update: the task's second model's step (`TrainsCompanion`: its own
    update where it trains, and its metrics); nothing for other tasks."""
    task = parts.task
    return task.companion_step(batch) if isinstance(task, TrainsCompanion) else {}


def step_values(parts: RunParts, m: dict[str, torch.Tensor], batch: RolloutBatch,
                inputs: LearnerInputs, state: LoopState, source: BatchSource,
                times: tuple[float, float, float, float, float]) -> tuple[dict[str, float], float]:
    """The step's metrics as floats (one device transfer) with the controllers, timings,
    throughput, the source's statistics and peak memory; and the count of non-finite parameter
    tensors. ``times``: step start, sampled, scored, learn start, end."""
    p, r = parts, parts.cfg.run
    t_step, t_sampled, t_scored, t_learn, t_end = times
    values = _floats({**m, NONFINITE_PARAMS: nonfinite_count(p.params)})
    bad_params = values.pop(NONFINITE_PARAMS)
    n_rows = batch.batch_size
    n_gen = values["length/mean"] * n_rows
    learn_tokens = n_rows * (batch.prompt_len + inputs.tokens_BT.shape[1]) * r.inner_epochs
    values |= {
        "optim/lr": p.cfg.optim.lr, "kl_ctrl/beta": state.beta,
        "entropy_ctrl/coef": state.entropy_coef,
        "time/sample": t_sampled - t_step, "time/score": t_scored - t_sampled,
        "time/ref": t_learn - t_scored, "time/learn": t_end - t_learn,
        "time/step": t_end - t_step,
        "time/sampler_weight_sync": take_weight_sync_seconds(),
        "throughput/sample_tokens_per_s": n_gen / max(t_sampled - t_step, 1e-9),
        "throughput/learn_tokens_per_s": learn_tokens / max(t_end - t_learn, 1e-9)}
    values |= source.stats()
    if p.device.type == "cuda":
        values["perf/peak_memory_mb"] = torch.cuda.max_memory_allocated(p.device) / 2**20
    if p.parallel is not None:  # the only values that differ across ranks
        values = p.parallel.reduce_timings(values)
    return values, bad_params


def eval_due(step: int, r: RunConfig) -> bool:
    """Evaluate before this step's update: from ``delay`` on, every ``eval_every`` steps."""
    return step >= r.delay and bool(r.eval_every) and (step - r.delay) % r.eval_every == 0


def save_checkpoint(parts: RunParts, run_dir: Path, state: LoopState) -> None:
    """Rank 0's checkpoint (the weights are replicated: it resumes on any number of ranks);
    under ``--fsdp`` every rank writes its shards (`rlscope.checkpoint.save_sharded`)."""
    p = parts
    if p.parallel is not None and p.parallel.sharded:
        checkpoint.save_sharded(run_dir, p.policy, p.value_head, p.ref, p.optimizer,
                                p.generator, state, p.parallel)
        return
    if not p.is_main:
        return
    checkpoint.save(run_dir, p.policy, p.value_head, p.ref, p.optimizer, p.generator, state,
                    p.task.companion_state() if isinstance(p.task, TrainsCompanion) else None)


def finish(parts: RunParts, log: RunLog, state: LoopState, status: str) -> None:
    """After the last step: the final evaluation (a completed run), the final checkpoint and
    the LoRA adapter (non-finite weights are not saved: resume from the last good)."""
    if status == "completed":
        log.evaluate(parts.cfg.run.num_steps)
    if status == "diverged":
        return
    save_checkpoint(parts, log.run_dir, state)
    if parts.cfg.model.lora_rank > 0 and parts.is_main:
        from rlscope.policy.hf import HFPolicy

        assert isinstance(parts.policy, HFPolicy)
        parts.policy.save_adapter(log.run_dir / "adapter")


def train(cfg: TrainConfig) -> RunResult:
    """Run ``cfg`` with its method's step kind: the rollout loop (`rollout_train`), or the loop
    of another kind (`kind_train`, `rlscope.steps.STEPS`)."""
    kind = kind_of(cfg)
    return rollout_train(cfg) if kind == ROLLOUT else kind_train(cfg, kind)


def kind_train(cfg: TrainConfig, kind: str) -> RunResult:
    """Run a method of step kind ``kind`` (`rlscope.steps`): checks, then eval (when due) →
    `KindStep.train_step` → log → checkpoint per step, with the rollout loop's run directory,
    logs, live doctor, divergence stop and exact resume."""
    validate_run(cfg)
    spec = resolve_method(cfg.method, cfg.components)
    r = cfg.run
    if r.resume:
        check_resume_config(cfg)
    threads_before = torch.get_num_threads()
    device = resolve_device(r.device)
    if r.threads:
        torch.set_num_threads(r.threads)
    torch.manual_seed(r.seed)
    stepper = STEPS[kind].build(cfg, spec, device)
    start, notices = 0, list[str]()
    run_dir = Path(r.resume) if r.resume else checkpoint.new_run_dir(cfg, r.runs_dir)
    if r.resume:
        start, saved, notices = checkpoint.load_state(run_dir, device)
        stepper.load_state_dict(saved)
        if r.num_steps < start:
            raise ConfigError(f"run.num_steps={r.num_steps} is below the step of the checkpoint "
                              f"resumed ({start}): set --num_steps {start} or more")
        notices += resume_cleanup(cfg, run_dir, start)
    checkpoint.atomic_write_text(run_dir / "config.json", json.dumps({
        "config": to_dict(cfg), "derived": {}, "method_spec": to_dict(spec),
        "task_description": stepper.describe(), **environment_info(device)}, indent=2))
    log = RunRecords(cfg, {}, run_dir, start, notices)
    done, status, diverged = start, "completed", {}

    def evaluate(step: int) -> None:
        t0 = time.perf_counter()
        values = stepper.evaluate(step)
        log.add_eval({"step": step, **values, "time/eval": time.perf_counter() - t0})

    try:
        for step in range(start, r.num_steps):
            if eval_due(step, r):
                evaluate(step)
            t0 = time.perf_counter()
            values = stepper.train_step(step)
            values["time/step"] = time.perf_counter() - t0
            log.add_step({"step": step, **values})
            for sample in getattr(stepper, "take_samples", list)():  # optional: samples.jsonl
                log.samples.write(sample)
            done = step + 1
            diverged = loss_divergence(values, step)
            if diverged:
                status = "diverged"
                log.display.alert(f"diverged: {diverged['reason']}")
                break
            if r.checkpoint_every and done % r.checkpoint_every == 0:
                checkpoint.save_state(run_dir, done, stepper.state_dict())
                export_kind(stepper, run_dir)
        if status == "completed":
            evaluate(r.num_steps)
            checkpoint.save_state(run_dir, done, stepper.state_dict())
            export_kind(stepper, run_dir)
    except BaseException as error:
        checkpoint.atomic_write_text(run_dir / "status.json", json.dumps(
            {"status": "failed", "steps": done, "error": repr(error)}))
        raise
    finally:
        torch.set_num_threads(threads_before)
        log.close()
    return log.result(done, status, diverged)


def export_kind(stepper: KindStep, run_dir: Path) -> None:
    """A step kind's optional export beside its checkpoint (``export(directory)``: e.g. the
    tree step's adapter, tokenizer and model config) into ``<run_dir>/model``."""
    export = getattr(stepper, "export", None)
    if export is not None:
        export(run_dir / "model")


def resume_cleanup(cfg: TrainConfig, run_dir: Path, step: int) -> list[str]:
    """A resumed run's directory made ready to go on from ``step``: the checkpoint adopted,
    records logged after it cut (the resumed run writes them again), the CSV rows after it
    dropped and the earlier leg's final status removed (a kill from here leaves none)."""
    checkpoint.adopt(run_dir, step)
    notices: list[str] = []
    for name in LOGS:
        notices += truncate_jsonl(run_dir / name, step)
    if cfg.run.output:
        notices += truncate_csv_rows(Path(cfg.run.output), run_dir.name, step)
    (run_dir / "status.json").unlink(missing_ok=True)
    return notices


def rollout_train(cfg: TrainConfig) -> RunResult:
    """Run a rollout-step method (module docstring): setup, then eval → collect → select →
    prepare → learn → log → checkpoint per step."""
    threads_before = torch.get_num_threads()
    parts = setup(cfg)
    r, spec = parts.cfg.run, parts.spec
    parts = dataclasses.replace(parts, task=with_env_workers(  # --env_workers: scoring in Ray
        parts.task, parts.cfg.task, parts.cfg.task_options,
        PoolOptions(r.env_workers, r.env_timeout_s, r.env_retries, r.env_chunk_size)))
    collect = Collector(parts)
    source = batch_source(parts.cfg.replay, r.delay, r.overfit_batch, collect, parts.generator)
    state = LoopState(beta=spec.kl.coef, entropy_coef=spec.entropy_coef, source=source)
    run_dir, state, notices = open_run(parts, state)
    log = RunLog(parts, run_dir, state.step, notices) if parts.is_main \
        else RankLog(parts, run_dir)
    for warning in correction_warnings(parts.cfg, spec):
        log.display.alert(f"warning: {warning}")
    status, diverged = "completed", {}
    pretrain_m: dict[str, torch.Tensor] = {}
    try:
        if parts.value_head is not None and spec.value.pretrain_steps > 0 and state.step == 0:
            pretrain_m = critic_pretrain_stage(parts)
        for step in range(state.step, r.num_steps):
            if spec.kl.control == "warmup":
                state.beta = kl_warmup_beta(step, spec.kl)
            diagnose = eval_due(step, r)
            switch = 0 < spec.objective.opd_warmup_steps == step and spec.reads_step
            if diagnose or switch:  # the warm-up switch's row: before step W's update
                log.evaluate(step, "switch" if switch else "")
            collect.begin()
            batch = source.next(step)
            t_step, t_sampled, t_scored = collect.timings()
            batch, m = select_stage(parts, batch, state, step)
            if state.fallback_streak >= OUT_OF_REGIME_STREAK:
                status = "out_of_regime"
                break
            inputs, prep_m = prepare_stage(parts, batch, state)
            _sync(parts.device)
            t_learn = time.perf_counter()
            learn_m = learn_stage(parts, batch, inputs, state, diagnose)
            learn_m |= companion_stage(parts, batch)
            _sync(parts.device)
            values, bad_params = step_values(
                parts, collect.metrics | m | prep_m | learn_m | pretrain_m, batch, inputs,
                state, source,
                (t_step, t_sampled, t_scored, t_learn, time.perf_counter()))
            update_controllers(state, spec, values, batch.batch_size)
            log.step(step, values, batch, inputs.adv_BT)
            pretrain_m = {}  # logged once, with the first step
            state.step = step + 1
            diverged = divergence(values, bad_params, parts.params, parts.policy,
                                  parts.value_head, step)
            if diverged:
                status = "diverged"
                log.display.alert(f"diverged: {diverged['reason']}")
                break
            if r.checkpoint_every and state.step % r.checkpoint_every == 0:
                save_checkpoint(parts, run_dir, state)
        finish(parts, log, state, status)
        if parts.parallel is not None:  # rank 0's files are written when any rank returns
            parts.parallel.barrier()
    except BaseException as error:
        if parts.is_main:
            checkpoint.atomic_write_text(run_dir / "status.json", json.dumps(
                {"status": "failed", "steps": state.step, "error": repr(error)}))
        raise
    finally:
        torch.set_num_threads(threads_before)
        log.close()
        close_env_workers(parts.task)
    return log.result(state.step, status, diverged)


def check_resume_config(cfg: TrainConfig) -> None:
    """Refuse a ``--resume`` whose configuration differs from the run's ``config.json`` in
    anything but `checkpoint.RESUME_MAY_CHANGE`, listing every differing field (`ConfigError`);
    nothing is written then."""
    config_file = Path(cfg.run.resume) / "config.json"
    try:
        stored = json.loads(config_file.read_text(encoding="utf-8"))["config"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ConfigError(f"--resume {cfg.run.resume}: not a run directory (cannot read "
                          f"{config_file}: {error.__class__.__name__})") from None

    def normal(config: dict[str, Any]) -> dict[str, Any]:
        config = json.loads(json.dumps(config))
        try:
            config["method"] = canonical_method_name(str(config.get("method")))
        except ValueError:
            pass
        return config

    changes = checkpoint.config_changes(normal(stored), normal(to_dict(cfg)),
                                        normal(to_dict(TrainConfig())))
    if changes:
        raise ConfigError(
            f"--resume {cfg.run.resume}: the configuration differs from the run's config.json "
            f"in {'; '.join(changes)}. Only {', '.join(checkpoint.RESUME_MAY_CHANGE)} may "
            "change on resume: drop the other options, or start a new run")


def nonfinite_count(params: list[torch.Tensor]) -> torch.Tensor:
    """How many of ``params`` hold a NaN or an infinity (a 0-dim tensor, on their device)."""
    if not params:
        return torch.zeros(())
    if any(distributed.local(p) is not p for p in params):  # sharded: every rank's parts
        return distributed.nonfinite_any(params).sum()
    return (~torch.stack([torch.isfinite(p).all() for p in params])).sum()


def divergence(values: dict[str, float], bad_params: float, params: list[torch.Tensor],
               policy: Policy, value_head: ValueHead | None, step: int
               ) -> dict[str, Any]:
    """Why the run diverged at ``step`` (``{"diverged_step", "diverged_metric", "reason"}``),
    or ``{}``: a non-finite loss (``loss/*``) or non-finite trainable parameters. A
    non-finite gradient alone is not divergence: the eager learner skips that optimizer step
    and counts it in ``optim/nonfinite_steps``."""
    diverged = loss_divergence(values, step)
    if diverged:
        return diverged
    if not bad_params:
        return {}
    names = {id(p): f"{prefix}{n}" for prefix, m in (("", policy), ("value_head.", value_head))
             if m is not None for n, p in m.named_parameters()}
    first = next((names.get(id(p), "?") for p in params
                  if not torch.isfinite(distributed.local(p)).all()), "?")
    return {"diverged_step": step, "diverged_metric": "parameters",
            "reason": f"{int(bad_params)} parameter tensors non-finite after step {step} "
                      f"(first: {first})"}


def loss_divergence(values: dict[str, float], step: int) -> dict[str, Any]:
    """`divergence`'s first test: the first non-finite ``loss/*`` value (``loss/total``
    first), or ``{}``."""
    losses = sorted((k for k in values if k.startswith("loss/")), key=lambda k: k != "loss/total")
    metric = next((k for k in losses if not math.isfinite(values[k])), None)
    if metric is None:
        return {}
    return {"diverged_step": step, "diverged_metric": metric,
            "reason": f"{metric} = {values[metric]} at step {step}"}


def rollout_metrics(batch: RolloutBatch, overlong: OverlongConfig, max_new_tokens: int
                    ) -> dict[str, torch.Tensor]:
    """``reward/``, ``length/`` and sampled-entropy metrics of the batch about to be trained,
    before selection."""
    assert batch.rewards_B is not None and batch.raw_rewards_B is not None
    m = est.reward_metrics(batch.rewards_B, batch.raw_rewards_B)
    if batch.noise_B is not None:
        m["reward/noise_rate"] = batch.noise_B.float().mean()
    m |= est.length_metrics(batch.completion_mask_BT, batch.finished_by_stop_B)
    m["policy/entropy_sampled"] = est.masked_mean(-batch.logp_sampler_BT,
                                                  batch.completion_mask_BT)
    if OVERLONG[overlong.name].shapes_reward:
        m["reward/overlong_penalty_mean"] = overlong_penalty_B(
            batch.completion_mask_BT.sum(-1), max_new_tokens, overlong).mean()
    if batch.greedy_rewards_B is not None:
        m["reward/greedy_mean"] = batch.greedy_rewards_B.mean()
    return m | episode_metrics(batch)


def update_controllers(state: LoopState, spec: MethodSpec, values: dict[str, float],
                       n_rows: int) -> None:
    """After a step: the adaptive KL coefficient and the adaptive entropy bonus (METHODS.md,
    "KL and entropy regularisers"). The KL warm-up is a function of the step, set before it."""
    if spec.kl.control == "adaptive" and "policy/kl_ref_seq_k1" in values:
        state.beta = adaptive_kl_update(state.beta, values["policy/kl_ref_seq_k1"], n_rows,
                                        spec.kl)
    if spec.entropy.control == "adaptive":
        state.entropy_history = [*state.entropy_history, values["policy/entropy"]][
            -spec.entropy.window:]
        state.entropy_coef = adaptive_entropy_update(state.entropy_coef, state.entropy_history,
                                                     spec.entropy)


def update_metrics(updated: UpdateResult, batch: RolloutBatch, inputs: LearnerInputs,
                   label_trained: bool, n_minibatches: int, grad_clip: float
                   ) -> dict[str, torch.Tensor]:
    """``policy/``, ``sampler/``, ``loss/`` and ``optim/`` metrics of one update.

    Ratio, KL and clip metrics come from the last pass and, suffixed ``_first``, from the first
    pass; the sampler mismatch from the first pass (it compares the sampled tokens, so not for
    label-trained methods); losses are means over the pass's minibatches.
    """
    first, last, mask_BT = updated.first, updated.last, inputs.mask_BT
    m = est.pass_metrics(first.logp_BT, inputs.logp_old_BT, mask_BT, first.stats, "_first")
    m |= est.pass_metrics(last.logp_BT, inputs.logp_old_BT, mask_BT, last.stats, "")
    if not label_trained:
        m |= est.sampler_metrics(first.logp_BT, batch.logp_sampler_BT, mask_BT)
    m["policy/entropy"] = est.masked_mean(first.entropy_BT, mask_BT)
    m |= {k: v / n_minibatches for k, v in last.parts.items()}
    m |= updated.stat_metrics
    m["loss/total"] = last.loss / n_minibatches
    norms_S = updated.grad_norms_S
    m["optim/nonfinite_steps"] = (~torch.isfinite(norms_S)).sum().float()
    m["optim/grad_norm"] = norms_S.mean()
    if grad_clip > 0:
        m["optim/grad_norm_clipped"] = norms_S.clamp_max(grad_clip).mean()
        m["optim/clip_active"] = (norms_S > grad_clip).float().mean()
    else:
        m["optim/grad_norm_clipped"] = norms_S.mean()
        m["optim/clip_active"] = torch.zeros_like(norms_S[0])
    return m


def _write_samples(log: JsonlWriter, step: int, batch: RolloutBatch, adv_BT: torch.Tensor,
                   n: int) -> None:
    rows = min(n, batch.batch_size)
    mask_BT = batch.completion_mask_BT[:rows]
    adv_B = (adv_BT[:rows] * mask_BT).sum(-1) / mask_BT.sum(-1).clamp_min(1.0)
    assert batch.rewards_B is not None
    for i in range(rows):
        prompt = batch.prompt_tokens_BP[i]
        if batch.prompt_mask_BP is not None:
            prompt = prompt[batch.prompt_mask_BP[i].bool()]
        length = int(mask_BT[i].sum())
        episode = {}
        if batch.turn_BT is not None and batch.env_mask_BT is not None:
            # an episode: the whole interleaved completion, and which tokens are the environment's
            length = int((batch.turn_BT[i] >= 0).sum())
            episode = {"env_mask": batch.env_mask_BT[i, :length].long().tolist()}
        log.write({"step": step, "prompt": prompt.tolist(),
                   "completion": batch.completion_tokens_BT[i, :length].tolist(),
                   "reward": float(batch.rewards_B[i]), "advantage": float(adv_B[i]),
                   **episode})


__all__ = ["LoopState", "RunParts", "RunResult", "kind_train", "rollout_metrics",
           "rollout_train", "sample_rollouts", "score_rollouts", "setup", "train",
           "update_controllers", "update_metrics"]
