"""The training configuration: frozen dataclasses nested per concern.

``TrainConfig`` is what `rlscope train` parses (every field's docstring is its ``--help``).
Derived values (the effective group size, completion length, micro-batch size) are computed by
`derive` and logged in ``config.json``; the config itself is never mutated.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rlscope.checks import (
    MemoryTerm,
    device_errors,
    field_errors,
    memory_errors,
    model_module_errors,
    readable_errors,
    writable_dir_errors,
)
from rlscope.envs.rlm.config import RlmConfig
from rlscope.envs.rlm.trainer import RlmTrainConfig
from rlscope.methods import MethodConfig, MethodSpec, canonical_method_name, resolve_method
from rlscope.methods import validate_method as _validate_method
from rlscope.methods.advantages import ADVANTAGES
from rlscope.methods.component import record
from rlscope.methods.configs import ObjectiveConfig
from rlscope.methods.pedagogy import PedagogyConfig, unused_pedagogy_errors
from rlscope.methods.teacher import TeacherConfig, builtin_teacher_errors
from rlscope.metrics.sinks import parse_log_to
from rlscope.paths import check_name_component
from rlscope.policy import ModelConfig
from rlscope.replay import ReplayConfig, validate_replay
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TASKS, Task, TaskConfig, make_task
from rlscope.tasks.base import (
    EPISODE_OPTIONS,
    Interactive,
    TrainingChecks,
    env_option_errors,
    unused_option_errors,
)
from rlscope.tasks.noise import validate_noise


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser (Adam, the sandbox default of METHODS.md)."""

    lr: float = 1e-3
    """Learning rate."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    adam_beta1: float = 0.9
    """Adam β1."""
    adam_beta2: float = 0.999
    """Adam β2."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW when > 0)."""


@dataclass(frozen=True)
class DiagnosticsConfig:
    """Optional diagnostics at evaluation steps (they cost extra forwards and backwards;
    computed by `rlscope.diagnostics`)."""

    entropy_diagnostics: bool = False
    """Entropy before/after the update, π–Δlogit covariance, entropy change by advantage sign
    and by surprisal and delight tertiles (diag/...)."""
    grad_diagnostics: bool = False
    """Cosine between the method's gradient and the cross-entropy-oracle gradient, and the
    gradient norm before and after clipping (diag/...)."""


@dataclass(frozen=True)
class LearnerConfig:
    """How the learner lays out its forward passes (Hugging Face policies; the tiny
    transformer keeps its padded, CUDA-graphed learner). Same update either way
    (`rlscope.learner_packed`)."""

    packing: Literal["auto", "on", "off"] = "auto"
    """Pack each micro-batch's rows into one sequence without padding (real prompt tokens +
    completion up to the last loss position; attention kept within each row: flash-attn
    varlen with attn_implementation=flash_attention_2, else a block-diagonal causal mask).
    auto = on for Hugging Face policies, off for the tiny transformer; on = require it."""
    logprob_chunk: int = 1024
    """Compute the learner's log-probs and entropies of the chosen tokens this many positions
    at a time from the final hidden states, recomputing each chunk's logits in the backward
    pass, so the B×T×V float32 logits never exist (1024 × a 152k vocabulary is 0.6 GB).
    Applies to Hugging Face policies where the method allows: no replayed top-k/top-p kept
    set, no full KL in the loss, no objective reading the whole distribution (else full
    logits); the tiny transformer ignores it. 0 = off (full logits)."""
    token_budget: int = 0
    """Form micro-batches of whole rows whose packed token count (prompt + completion up to
    the last loss position) stays within this budget (a longer row goes alone), instead of
    --micro_batch_size rows; gradients accumulate with the minibatch's global denominators,
    so the update is unchanged. 0 = --micro_batch_size rows."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of storing
    them (Hugging Face policies; non-reentrant). Same as --model.gradient_checkpointing."""
    compile_blocks: bool = False
    """torch.compile each transformer block of a Hugging Face policy (dynamic shapes, so one
    compilation serves every packed layout; the first steps pay the compilation). Fuses the
    blocks' element-wise work; see docs/performance.md for what it buys on an H100."""

    def validate(self, arch: str) -> list[str]:
        """Why this config cannot run with ``--arch arch`` (empty when it can)."""
        errors = []
        if self.packing not in ("auto", "on", "off"):
            errors.append(f"learner.packing={self.packing!r}: use auto, on or off")
        if self.token_budget < 0:
            errors.append(f"learner.token_budget={self.token_budget} must be >= 0 "
                          "(0 = --micro_batch_size rows)")
        if arch == "tiny":
            asked = [name for name, on in (
                ("packing=on", self.packing == "on"),
                ("token_budget", self.token_budget > 0),
                ("activation_checkpointing", self.activation_checkpointing),
                ("compile_blocks", self.compile_blocks)) if on]
            if asked:
                errors.append(f"learner.{', learner.'.join(asked)}: "
                              f"{'needs' if len(asked) == 1 else 'need'} a Hugging Face policy "
                              "(--arch llama, qwen2 or hf); drop it for the tiny transformer, "
                              "whose learner is padded and CUDA-graphed")
        return errors


@dataclass(frozen=True)
class RunConfig:
    """Run length, batch layout, evaluation, logging and checkpoints."""

    seed: int = 0
    """Run seed: model init, prompts, sampling and evaluation sets all derive from it."""
    num_seeds: int = 1
    """Run seeds seed, seed+1, ..., seed+num_seeds-1."""
    jobs: int = 1
    """Worker processes running seeds in parallel (give each --threads cores / jobs)."""
    num_steps: int = 300
    """Optimizer steps (sampling rounds)."""
    batch_size: int = 96
    """Rollouts per step (prompts × group_size)."""
    group_size: int = 0
    """Rollouts per prompt; 0 = 8 for grouped methods and 1 otherwise (rlm_grpo: trees per
    prompt, 0 = 4)."""
    inner_epochs: int = 1
    """Passes over each batch."""
    num_minibatches: int = 1
    """Optimizer steps per pass (the batch is split into this many minibatches)."""
    micro_batch_size: int = 0
    """Rows per forward/backward (gradient accumulation; never changes the update). 0 = whole
    minibatch (rlm_grpo: segments per forward/backward, 0 = 1)."""
    delay: int = 0
    """Staleness: train on the batch sampled this many steps ago."""
    fill_batch: bool = False
    """With mixed-group selection, sample more prompts until mixed groups fill the batch
    (DAPO's dynamic sampling)."""
    overfit_batch: bool = False
    """Overfit one batch (the standard sanity check): sample and score the first batch once and
    train on that same batch every step. Its behaviour log-probs stay those of that sampling
    while the learner's logits are fresh each step, so the ratios drift away from 1 as the
    policy moves; that is the point. A loss that does not fall here points at the learner,
    not the data. Not with --delay, --replay_capacity or --fill_batch."""
    max_fill_rounds: int = 4
    """Generation rounds --fill_batch may use per step before it stops with an error."""
    eval_every: int = 20
    """Evaluate every this many steps (before the update) and after the last step; 0 = only
    at the end."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto (cuda when available)."""
    threads: int = 0
    """CPU threads for torch (0 = leave torch's default)."""
    runs_dir: str = "runs"
    """Parent folder of run directories."""
    name: str = ""
    """Run directory name (default: <method>_<task>_s<seed>_<time>): one plain directory
    inside --runs_dir (no '/', '..' or absolute path)."""
    output: str = ""
    """Append one tidy CSV row per evaluation per seed to this file."""
    log_samples: int = 4
    """Decoded rollouts written to samples.jsonl per logged step."""
    samples_every: int = 20
    """Write samples every this many steps."""
    doctor_every: int = 10
    """Run the doctor's rules on the run's own metrics every this many steps and print a
    one-line alert when a finding first fires (0 = off; findings.json is written at the end
    either way)."""
    checkpoint_every: int = 0
    """Save a resumable checkpoint every this many steps (0 = only at the end)."""
    resume: str = ""
    """Resume the run in this run directory from its latest checkpoint."""
    init: str = ""
    """Start the policy from these weights: an `rlscope sft` output (its directory or
    sft.pt), a run directory (its latest checkpoint) or a checkpoint file. The model must have
    the same shapes; the KL reference is the initialised policy. Empty = random init."""
    log_to: str = "none"
    """Also write the metrics, under their canonical names, to these loggers: 'none' or a
    comma-separated list of 'tensorboard' (event files in <run dir>/tensorboard/) and 'wandb'
    (<run dir>/wandb/, offline unless W&B is configured: WANDB_MODE, WANDB_API_KEY or a
    login). metrics.jsonl is always written. Needs rlscope[logging]."""
    progress: bool = True
    """Show the live progress bar and metrics line."""
    nproc: int = 1
    """Data-parallel ranks on this node: above 1, `rlscope train` relaunches itself through
    torchrun (torch.distributed.run) with this many processes (one per GPU on CUDA, gloo on
    CPU); under torchrun the launcher's count is used. docs/scaling.md."""
    fsdp: bool = False
    """With data parallel (--nproc 2 or more, or torchrun): shard the policy's (and value
    head's) weights, gradients and optimizer state over the ranks with FSDP2 (fully_shard per
    transformer block, then the root), for models whose training state does not fit one device;
    the update is the same as without it. Each rank keeps a full copy of the weights for
    sampling, evaluation and the no-grad forwards (refreshed after every update), and
    checkpoints are sharded (torch.distributed.checkpoint directories). docs/scaling.md."""
    cuda_graphs: bool = True
    """On CUDA with the tiny transformer, replay the sampler's decode step and the learner's
    optimizer step from CUDA graphs (same results up to float rounding, several times faster
    at sandbox sizes). False turns both off (and overrides sampling.decode_graphs)."""
    env_workers: int = 0
    """Score the task's rewards in this many Ray actors (rlscope.env_workers; the code task's
    sandbox, any slow or unsafe reward), in parallel chunks, a failing, dying or hanging worker
    retried and counted in env/errors; 0 = in this process. Needs pip install -e '.[ray]'."""
    env_timeout_s: float = 120.0
    """With --env_workers: seconds one chunk's scoring may take before its worker is killed and
    the chunk retried."""
    env_retries: int = 2
    """With --env_workers: retries of a chunk whose scoring failed (raised, worker died or timed
    out); then its rows get the task's failure reward (0 for the code task)."""
    env_chunk_size: int = 0
    """With --env_workers: rows per scoring call (0 = the batch split evenly over the workers;
    1 = a failure costs only its own sample's reward)."""


@dataclass(frozen=True)
class TrainConfig:
    """One RL training run: a method on a task."""

    method: str = "grpo"
    """Update rule preset (see `rlscope methods`); case-insensitive, CamelCase aliases work."""
    task: str = "token_reversal"
    """Task (see `rlscope tasks`)."""
    run: RunConfig = field(default_factory=RunConfig)
    task_options: TaskConfig = field(default_factory=TaskConfig)
    components: MethodConfig = field(default_factory=MethodConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    teacher_options: TeacherConfig = field(default_factory=TeacherConfig)
    pedagogy: PedagogyConfig = field(default_factory=PedagogyConfig)
    rlm: RlmConfig = field(default_factory=RlmConfig)
    rlm_train: RlmTrainConfig = field(default_factory=RlmTrainConfig)


@dataclass(frozen=True)
class Derived:
    """Values computed from a `TrainConfig` (logged, never written back)."""

    group_size: int
    num_prompts: int
    max_new_tokens: int
    micro_batch_size: int
    minibatch_size: int
    overlong: str = "none"
    """The method's overlong handling in force: its own where completions can end early
    (`variable_lengths`), else ``none`` (on fixed-length completions it is a no-op)."""
    stop_token_ids: tuple[int, ...] = ()
    """The stop tokens in force: --stop_token_ids where given, else the task's own
    (``task.stop_token_ids``, e.g. the newline of the text tasks), else none."""


FIELD_ALIASES = {"components": "method", "task_options": "task", "teacher_options": "teacher"}
"""How messages name the nested configs of `TrainConfig` (``method.kl_coef``, ``task.vocab``)."""


class ConfigError(ValueError):
    """A configuration that cannot run; the message lists every problem and what to change."""


def derive(cfg: TrainConfig, spec: MethodSpec, task: Task) -> Derived:
    group = cfg.run.group_size or (8 if spec.grouped else 1)
    minibatch = max(cfg.run.batch_size // max(cfg.run.num_minibatches, 1), 1)
    max_new_tokens = cfg.sampling.max_new_tokens or task.completion_len
    stops = stop_tokens(cfg, task)
    return Derived(
        group_size=group,
        num_prompts=cfg.run.batch_size // max(group, 1),
        max_new_tokens=max_new_tokens,
        micro_batch_size=cfg.run.micro_batch_size or minibatch,
        minibatch_size=minibatch,
        overlong=spec.overlong.name if variable_lengths(stops, max_new_tokens) else "none",
        stop_token_ids=stops,
    )


def stop_tokens(cfg: TrainConfig, task: Task) -> tuple[int, ...]:
    """--stop_token_ids where given, else the task's default stop tokens (none for the token
    sandbox, the newline for the byte-level text tasks)."""
    return tuple(cfg.sampling.stop_token_ids) or task.traits.stop_token_ids


def effective_config(cfg: TrainConfig, d: Derived) -> TrainConfig:
    """``cfg`` with the stop tokens in force (``d.stop_token_ids``) as its sampling stops: what
    `rlscope.train.train` runs and logs (a new config; ``cfg`` is unchanged)."""
    if cfg.sampling.stop_token_ids == d.stop_token_ids:
        return cfg
    return dataclasses.replace(cfg, sampling=dataclasses.replace(
        cfg.sampling, stop_token_ids=d.stop_token_ids))


def validate(cfg: TrainConfig) -> tuple[MethodSpec, Task, Derived]:
    """Resolve and check everything before training; raise `ConfigError` listing all problems."""
    errors: list[str] = []
    try:
        canonical_method_name(cfg.method)
    except ValueError as e:
        raise ConfigError(f"--method: {e}") from None
    if cfg.task not in TASKS:
        raise ConfigError(f"--task: unknown task {cfg.task!r}; valid tasks: {', '.join(TASKS)}")
    spec = resolve_method(cfg.method, cfg.components)
    # METHODS.md has one λ_age: the freshness gate reads --replay_age_decay
    spec = dataclasses.replace(spec, gate=dataclasses.replace(
        spec.gate, gate_age_decay=cfg.replay.replay_age_decay))
    # non-finite floats and negative counts first: the checks below assume ordinary numbers
    if errors := field_errors(cfg, aliases=FIELD_ALIASES):
        errors += environment_errors(cfg, errors)
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
    task = make_task(cfg.task, cfg.task_options)
    d = derive(cfg, spec, task)
    r = cfg.run
    errors += overlong_errors(cfg, spec, d)
    try:
        parse_log_to(cfg.run.log_to)
    except ValueError as e:
        errors.append(str(e))
    if r.batch_size < 1:
        errors.append(f"run.batch_size={r.batch_size} must be >= 1")
    if r.group_size < 0:
        errors.append(f"run.group_size={r.group_size} must be >= 0")
    errors += _validate_method(spec, d.group_size, r.batch_size)
    if r.num_steps < 0 or r.inner_epochs < 1 or r.num_minibatches < 1:
        errors.append("run.num_steps must be >= 0, run.inner_epochs and run.num_minibatches "
                      ">= 1")
    if r.num_minibatches >= 1 and r.batch_size % r.num_minibatches:
        errors.append(f"run.batch_size={r.batch_size} is not divisible by "
                      f"run.num_minibatches={r.num_minibatches}")
    if spec.needs_whole_groups and d.micro_batch_size % d.group_size:
        errors.append(f"run.micro_batch_size={d.micro_batch_size} must hold whole groups of "
                      f"{d.group_size}: objective {spec.objective.name!r} compares the samples "
                      "of a group")
    if spec.grouped and r.num_minibatches > 1 and d.minibatch_size % d.group_size:
        errors.append(f"minibatch size {d.minibatch_size} must hold whole groups of "
                      f"{d.group_size}")
    if r.fill_batch and not spec.selection_component.drops_groups:
        errors.append("run.fill_batch needs mixed-group selection: use a grouped method or "
                      "--selection mixed_groups")
    if r.overfit_batch and (r.delay or cfg.replay.replay_capacity or r.fill_batch):
        errors.append("run.overfit_batch trains on one fixed batch, so it cannot be combined "
                      "with --delay, --replay_capacity or --fill_batch: drop those")
    if r.max_fill_rounds < 1:
        errors.append(f"run.max_fill_rounds={r.max_fill_rounds} must be >= 1")
    if r.micro_batch_size < 0:
        errors.append(f"run.micro_batch_size={r.micro_batch_size} must be >= 0")
    if r.delay < 0 or r.eval_every < 0 or r.num_seeds < 1 or r.jobs < 1 or r.doctor_every < 0:
        errors.append("run.delay, run.eval_every and run.doctor_every must be >= 0, "
                      "run.num_seeds and run.jobs >= 1")
    if spec.needs_labels and not task.has_labels:
        errors.append(f"method {cfg.method!r} trains on ground-truth labels, which task "
                      f"{cfg.task!r} does not provide")
    if cfg.optim.lr <= 0 or cfg.optim.grad_clip < 0:
        errors.append("optim.lr must be > 0 and optim.grad_clip >= 0")
    errors += task.validate() + cfg.sampling.validate() + cfg.model.validate()
    errors += cfg.learner.validate(cfg.model.arch)
    # what only RL training needs (preference_rm: a reward model); sft and rm skip this
    if isinstance(task, TrainingChecks):
        errors += task.validate_training()
    errors += validate_noise(cfg.task_options, task.family)
    errors += validate_replay(cfg.replay, r.delay)
    errors += requirement_errors(cfg, spec, task)
    errors += episode_errors(cfg, spec, task)
    from rlscope.env_workers import PoolOptions, env_worker_errors

    errors += env_worker_errors(PoolOptions(r.env_workers, r.env_timeout_s, r.env_retries,
                                            r.env_chunk_size), cfg.task, task)
    if r.env_workers and (r.nproc > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1):
        # every rank scores the whole batch: pools whose timeouts and retries differ by rank
        # would give the ranks different rewards, hence different batches and collectives
        errors.append("run.env_workers with data parallel (--nproc / torchrun): every rank "
                      "scores the whole batch, and separate worker pools could give the ranks "
                      "different rewards; drop --env_workers or run one process")
    errors += fsdp_errors(cfg, spec, task)
    errors += teacher_config_errors(cfg, spec)
    errors += opd_config_errors(cfg, spec, task)
    errors += unused_pedagogy_errors(cfg.pedagogy, cfg.task)
    errors += environment_errors(cfg, errors)
    if not errors:
        errors += memory_errors(step_memory(cfg, task, d), _memory_device(r.device))
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
    return spec, task, d


def fsdp_errors(cfg: TrainConfig, spec: MethodSpec, task: Task) -> list[str]:
    """Why ``--fsdp`` cannot shard this run (empty without --fsdp or when it can)."""
    r, out = cfg.run, list[str]()
    if not r.fsdp:
        return out
    if r.nproc < 2 and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        out.append("run.fsdp shards the model over data-parallel ranks: give --nproc 2 or "
                   "more (or launch with torchrun --nproc_per_node N), or drop --fsdp")
    blocked = [(cfg.model.lora_rank > 0, "--lora_rank (LoRA adapters: train them without "
                "--fsdp, the frozen base needs no optimizer state)"),
               (cfg.learner.compile_blocks, "--compile_blocks"),
               (cfg.learner.packing == "on", "--packing on (the packed learner reads the head "
                "weights outside a forward; use --packing off or auto)"),
               (cfg.diagnostics.grad_diagnostics, "--grad_diagnostics"),
               (cfg.diagnostics.entropy_diagnostics, "--entropy_diagnostics"),
               (spec.value.pretrain_steps > 0, f"method {cfg.method!r}'s critic pre-training"),
               (hasattr(task, "attach_policy"), f"task {cfg.task!r}, which reads the trained "
                "policy while scoring")]
    out += [f"run.fsdp cannot be combined with {what}: drop --fsdp (every rank then holds the "
            "whole model) or that option" for bad, what in blocked if bad]
    return out


def environment_errors(cfg: TrainConfig, errors: list[str]) -> list[str]:
    """Why the machine cannot run ``cfg``: the device, the files it reads (--init, --resume,
    --rm_path), the directories it writes (--runs_dir, --output), the run name (one directory
    inside --runs_dir) and optional modules. ``errors`` (found so far) avoids repeating one."""
    r, out = cfg.run, []
    out += device_errors(r.device)
    if r.name and (problem := check_name_component(r.name, "--name")):
        out.append(problem)
    if r.init:
        what = "give an `rlscope sft` output, a run directory or a checkpoint file (or drop --init)"
        unreadable = readable_errors(r.init, "--init", what)
        out += unreadable
        if not unreadable and Path(r.init).is_dir():
            from rlscope.checkpoint import init_weights_path

            try:
                init_weights_path(r.init)
            except FileNotFoundError as e:
                out.append(f"{e}; {what}")
    if r.resume:
        unreadable = readable_errors(r.resume, "--resume", "give a run directory written by "
                                     "`rlscope train` (runs/NAME)")
        saved = Path(r.resume) / "checkpoints"
        if not unreadable and not (saved.is_dir() and any(saved.iterdir())):
            unreadable.append(f"--resume {r.resume}: no checkpoint in {saved}; resume a run "
                              "directory that saved one (--checkpoint_every N saves them "
                              "during the run)")
        out += unreadable or writable_dir_errors(r.resume, "--resume")
    else:
        out += writable_dir_errors(r.runs_dir, "--runs_dir")
    rm_path = cfg.task_options.rm_path
    if rm_path and not any("--rm_path" in e for e in errors):
        out += readable_errors(rm_path, "--rm_path", "train a reward model with `rlscope rm "
                               "--task preference_rm --name NAME` and pass --rm_path runs/NAME")
    if r.output:
        out += writable_dir_errors(str(Path(r.output).parent), "--output")
    return out + model_module_errors(cfg.model)


def _memory_device(name: str) -> str:
    """The device a run on ``name`` uses, as a string (``auto`` resolved)."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _hf_sizes(path: str) -> dict[str, int]:
    """The integer sizes in ``path/config.json`` (a local Hugging Face model; empty when it
    cannot be read)."""
    import json

    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    raw = raw.get("text_config", raw) if isinstance(raw, dict) else {}
    return {k: v for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}


def step_memory(cfg: TrainConfig, task: Task, d: Derived) -> list[MemoryTerm]:
    """A lower bound on the bytes one training step holds at its peak, as parts: the model
    with its gradients and Adam state, plus the larger of the sampler's (KV cache and logits
    of a batch or an evaluation batch) and the learner's (logits and log-probs of a
    micro-batch, float32, and one saved activation per layer) allocations."""
    m = cfg.model
    width = 8 if m.dtype == "float64" else 4
    act = 2 if m.autocast != "none" else width
    vocab, seq = task.vocab_size, task.prompt_len + d.max_new_tokens
    dim, layers, heads = m.d_model, m.n_layers, m.n_heads
    inner, kv_heads = m.intermediate_size or 2 * dim, m.n_kv_heads
    if m.arch == "hf":  # a local model: its config.json has the sizes (none: count none)
        hf = _hf_sizes(m.path)
        dim, layers, heads = hf.get("hidden_size", 0), hf.get("num_hidden_layers", 0), \
            hf.get("num_attention_heads", 1)
        vocab = max(vocab, hf.get("vocab_size", 0))
        inner, kv_heads = hf.get("intermediate_size", 0), hf.get("num_key_value_heads", heads)
    if m.arch == "tiny":
        params, kv_dim = vocab * dim + seq * dim + layers * 12 * dim * dim, dim
    else:
        kv_heads = kv_heads or (heads // 2 if heads % 2 == 0 else heads)
        params = layers * (4 * dim * dim + 3 * dim * inner) + 2 * vocab * dim
        kv_dim = dim * kv_heads // max(heads, 1)
    model = MemoryTerm("the frozen model" if m.lora_rank else
                       "the model with gradients and Adam state",
                       params * width * (1 if m.lora_rank else 4),
                       "train LoRA adapters (--lora_rank 16) or use a smaller model"
                       if m.arch == "hf" else "lower --d_model or --n_layers")
    ranks = max(cfg.run.nproc, int(os.environ.get("WORLD_SIZE", "1")))
    if cfg.run.fsdp and ranks > 1:  # a shard of the training state, plus the sampling copy
        model = MemoryTerm(f"the model's shard of weights, gradients and Adam state over "
                           f"{ranks} ranks and its full sampling copy",
                           int(params * width * (1 + 4 / ranks)), "use more ranks (--nproc)")
    rows, eval_rows = cfg.run.batch_size, cfg.task_options.eval_batch_size
    sample_rows = max(rows, eval_rows)
    sample_flag = "lower --batch_size" if rows >= eval_rows else "lower --eval_batch_size"
    per_row = (2 * layers * seq * kv_dim * act + 2 * vocab * 4) if cfg.sampling.use_cache \
        else 2 * seq * vocab * 4 + layers * seq * dim * act
    sampler = MemoryTerm(f"the sampler's KV cache and logits for {sample_rows} rollouts of "
                         f"{seq} tokens", sample_rows * per_row, sample_flag)
    saved_layers = 1 if m.gradient_checkpointing or cfg.learner.activation_checkpointing \
        else layers
    tokens = cfg.learner.token_budget or d.micro_batch_size * seq
    # chunked log-probs (Hugging Face policies) hold one chunk's logits, not the micro-batch's
    logit_tokens = tokens if m.arch == "tiny" or cfg.learner.logprob_chunk == 0 \
        else min(tokens, cfg.learner.logprob_chunk)
    learner = MemoryTerm(
        f"the learner's logits and activations for {d.micro_batch_size} rows of {seq} tokens",
        logit_tokens * 2 * vocab * 4 + tokens * saved_layers * dim * act,
        "lower --micro_batch_size" if cfg.run.micro_batch_size else "set --micro_batch_size "
        "below the minibatch (or lower --batch_size)")
    return [model, max(sampler, learner, key=lambda t: t.bytes)]


def variable_lengths(stop_token_ids: tuple[int, ...], max_new_tokens: int) -> bool:
    """Whether completions can end before ``max_new_tokens`` (a stop token is in force and
    more than one token is generated); otherwise every completion has exactly L_max tokens."""
    return bool(stop_token_ids) and max_new_tokens > 1


def overlong_errors(cfg: TrainConfig, spec: MethodSpec, d: Derived) -> list[str]:
    """Why the configured overlong handling cannot act (empty when it can)."""
    errors = []
    explicit = cfg.components.overlong not in (None, "none")
    if explicit and not variable_lengths(d.stop_token_ids, d.max_new_tokens):
        errors.append(
            f"method.overlong={cfg.components.overlong!r} handles completions that reach "
            f"max_new_tokens={d.max_new_tokens}, but with no --stop_token_ids (or a single "
            "generated token) every completion of task "
            f"{cfg.task!r} has exactly that length, so it would mask or penalise every row "
            "alike: set --stop_token_ids or drop --overlong")
    if spec.overlong.buffer > d.max_new_tokens:
        errors.append(f"method.overlong_buffer={spec.overlong.buffer} must be <= "
                      f"max_new_tokens={d.max_new_tokens}")
    return errors


def correction_warnings(cfg: TrainConfig, spec: MethodSpec) -> list[str]:
    """Why the configured sampler-vs-learner correction cannot act (METHODS_2026.md §4: warn,
    do not reject): the learner samples with the same weights and kernels (the tiny
    transformer, or a Hugging Face model sampled by the eager backend or on CPU), on-policy (no
    --delay, no replay buffer, no --overfit_batch), and either replays the top-k/top-p kept set
    or filters nothing, so ℓ_s = ℓ_o up to rounding and every weight is 1."""
    s, r = cfg.sampling, cfg.run
    filtered = s.top_k > 0 or s.top_p < 1
    # the static sampler decodes from its own weight copy (bf16 under --autocast on CUDA) with
    # its own kernels: ℓ_s differs from ℓ_o and the correction acts
    own_sampler = s.backend == "static" or (
        s.backend == "auto" and cfg.model.arch != "tiny" and r.device != "cpu")
    if spec.gate_component.sampler_mismatch and not (
            r.delay or cfg.replay.replay_capacity or r.overfit_batch
            or (filtered and not s.replay_sampling_mask) or own_sampler):
        return [f"method {cfg.method!r}: gate={spec.gate.name!r} drops rows only where the "
                "sampler's log-probs differ from the learner's; the learner is the sampler "
                "here, so it acts only through later inner epochs"]
    if not spec.corrected or r.delay or cfg.replay.replay_capacity or r.overfit_batch \
            or (filtered and not s.replay_sampling_mask) or own_sampler:
        return []
    return [f"method {cfg.method!r}: the sampler-vs-learner correction "
            f"is_correction={spec.correction.name!r} does nothing here: the learner is the "
            "sampler (no --delay, no replay buffer, no --overfit_batch, the top-k/top-p kept "
            "set replayed or none), so every weight is 1 and the run equals "
            "--is_correction none"]


def opd_config_errors(cfg: TrainConfig, spec: MethodSpec, task: Task) -> list[str]:
    """Why the built-in teacher and the OPD settings do not fit (COMPANIONS.md §1,
    "Validation"): the teacher's own settings (`builtin_teacher_errors`), k within the
    vocabulary, 0 ≤ W < num_steps and W > 0 only with the warm-up objective, clip bounds > 0;
    and any OPD setting given to a method that reads no built-in teacher."""
    t, obj = cfg.teacher_options, spec.objective
    default_t = TeacherConfig()
    if not spec.builtin_teacher:
        changed = [f"--{name}" for name in ("teacher", "teacher_epsilon", "teacher_temperature",
                                           "special_token_weight", "overlap_k")
                   if getattr(t, name) != getattr(default_t, name)]
        changed += [f"--{name}" for name in ("opd_top_k", "opd_support", "opd_warmup_steps")
                    if getattr(obj, name) != getattr(ObjectiveConfig(), name)]
        return [f"{', '.join(changed)}: set, but method {cfg.method!r} reads no built-in "
                "teacher (opd_reverse_kl, opd_topk_reverse_kl and opd_pg do); drop them"] \
            if changed else []
    A = task.vocab_size
    errors = builtin_teacher_errors(t, cfg.task, A)
    if "opd_top_k" in spec.objective_component.settings and not 1 <= obj.opd_top_k <= A:
        errors.append(f"method.opd_top_k={obj.opd_top_k} must lie in [1, {A}] (the student's "
                      "actions)")
    W = obj.opd_warmup_steps
    if W > 0 and not spec.reads_step:
        errors.append(f"method.opd_warmup_steps={W}: the warm-up switches to the top-k loss, "
                      "so it needs --method opd_topk_reverse_kl; drop --opd_warmup_steps")
    elif W >= max(cfg.run.num_steps, 1):
        errors.append(f"method.opd_warmup_steps={W} must be below run.num_steps="
                      f"{cfg.run.num_steps} (the switch happens at step W)")
    if "clip_low" in spec.objective_component.settings and (obj.clip_low <= 0
                                                              or obj.clip_high <= 0):
        errors.append(f"method.clip_low={obj.clip_low} and method.clip_high={obj.clip_high} "
                      "must be > 0 for an OPD preset")
    return errors


def teacher_config_errors(cfg: TrainConfig, spec: MethodSpec) -> list[str]:
    """Why the teacher setting does not fit the method (METHODS_2026.md §4): a method that
    reads a teacher (opd, gkd) without ``--teacher_path``, a path that does not exist, or a
    teacher given to a method that reads none. The teacher's vocabulary and distribution are
    checked once it is built (`rlscope.methods.teacher.teacher_errors`)."""
    path = cfg.teacher_options.teacher_path
    if spec.builtin_teacher:  # --teacher oracle|soft: `opd_config_errors`
        return []
    if spec.needs_teacher and not path:
        return [f"method {cfg.method!r} distils from a teacher: set --teacher_path (an rlscope "
                "checkpoint or run directory of the same model and task, or a Hugging Face "
                "directory with the same tokenizer)"]
    if path and not spec.needs_teacher:
        return [f"teacher.teacher_path is set but method {cfg.method!r} reads no teacher "
                "(opd, gkd do)"]
    if path and not Path(path).exists():
        return [f"teacher.teacher_path={path!r}: no such file or directory"]
    errors = []
    if path and Path(path).is_dir() and not any(
            (Path(path) / name).exists() for name in ("checkpoints", "sft.pt", "config.json")):
        errors.append(f"teacher.teacher_path={path!r} is a directory that holds no teacher: "
                      "give an rlscope run (checkpoints/), an rlscope sft output (sft.pt) or a "
                      "Hugging Face model directory (config.json)")
    s = cfg.sampling
    if spec.needs_teacher_distribution and (s.top_k > 0 or s.top_p < 1) \
            and s.replay_sampling_mask:
        errors.append(f"method {cfg.method!r} compares the student's whole distribution with "
                      "the teacher's, but the replayed top-k/top-p kept set truncates the "
                      "student's (KL(P_T‖P_θ) would be infinite): sample without "
                      "--top_k/--top_p or pass --no_replay_sampling_mask")
    adv = spec.advantage
    if spec.needs_teacher and adv.teacher_env_coef != 0 \
            and record(ADVANTAGES, adv.env_advantage).grouped and cfg.run.group_size < 2:
        errors.append(f"method.env_advantage={adv.env_advantage!r} compares the samples of a "
                      "group, so --teacher_env_coef needs run.group_size > 1 (or an ungrouped "
                      "estimator such as constant)")
    return errors


def requirement_errors(cfg: TrainConfig, spec: MethodSpec, task: Task) -> list[str]:
    """Why the run cannot give the method what its ``requires`` names (empty when it can)."""
    noisy = cfg.task_options.reward_noise > 0
    replay = cfg.replay.replay_capacity > 0
    checks = {
        "replay": (replay, "needs a replay buffer: set --replay_capacity > 0"),
        "staleness": (replay or cfg.run.delay > 0,
                      "weighs batches by age, so it needs staleness: set --delay > 0 or "
                      "--replay_capacity > 0"),
        "token_rewards": (task.traits.decomposable_token_rewards and not noisy
                          and not cfg.task_options.binary_reward,
                          "needs clean, non-binary rewards that decompose over tokens "
                          "(token_reversal or masked_reversal, no --binary_reward, no "
                          "--reward_noise)"),
        "binary_rewards": (task.traits.binary_rewards,
                           "needs binary rewards (a bandit task, or --binary_reward)"),
        "clean_rewards": (not noisy, "needs clean rewards: drop --reward_noise"),
        "bandit": (task.family == "bandit", "is for one-action (bandit) tasks: use "
                   "--task digits_bandit or lm_bandit"),
        "on_policy": (not replay and cfg.run.delay == 0,
                      "is defined on-policy (its targets come from the behaviour policy of "
                      "this very step): drop --delay and --replay_capacity"),
        "single_epoch": (cfg.run.inner_epochs == 1 and cfg.run.num_minibatches == 1,
                         "takes one on-policy step per batch: set --inner_epochs 1 and "
                         "--num_minibatches 1"),
        "token_labels": (task.has_labels and task.family != "bandit",
                         "trains on the task's per-token labels at the actor's prefixes: use a "
                         "sequence task with labels (token_reversal, masked_reversal, "
                         "chain_reversal)"),
        "no_kl": (spec.kl.coef == 0, "has no KL term by definition: drop --kl_coef"),
        "one_epoch": (cfg.run.inner_epochs == 1,
                      "takes one pass per batch (it has no importance ratio): set "
                      "--inner_epochs 1"),
        "no_selection": (spec.selection == "none",
                         "needs no selection: it rescales by the valid-group fraction instead "
                         "of filtering (α would be 1 and filtering double-counts): set "
                         "--selection none"),
        "critic_pretrain": (spec.needs_value and spec.value.pretrain_steps >= 1,
                            "needs a value head pre-trained first: set "
                            "--critic_pretrain_steps >= 1 and a value-head advantage (gae, "
                            "gae_decoupled)"),
    }
    return [f"method {cfg.method!r} {message}" for need in spec.requires
            for ok, message in [checks[need]] if not ok]


def episode_errors(cfg: TrainConfig, spec: MethodSpec, task: Task) -> list[str]:
    """Why ``cfg`` cannot train on an interactive task's episodes (`Interactive`), each saying
    what to change; for other tasks, the episode options set anyway. An episode is one row whose
    loss mask covers the policy's tokens only and whose reward is the episode's return, so a
    method that needs more than sequences give is refused with its reason."""
    if not isinstance(task, Interactive):
        return unused_option_errors(cfg.task_options, cfg.task, EPISODE_OPTIONS,
                                    " (it is not an interactive task)") \
            + env_option_errors(cfg.task_options, cfg.task, None)
    why = (
        (spec.needs_value, "bootstraps a value head across positions, which on an episode "
         "would read the environment's tokens as terminal states; use a group or batch "
         "baseline (grpo, rloo, dr_grpo, ...)"),
        (spec.needs_candidates, "scores next-token candidates against the task's labels at "
         "every position, which episodes do not have"),
        (spec.needs_token_labels, "reads per-token labels, which episodes do not have"),
    )
    errors = [f"method {cfg.method!r} {message} (task {cfg.task!r} is interactive)"
              for refused, message in why if refused]
    stops = tuple(task.environment_factory.turn_stop_token_ids)
    if cfg.sampling.stop_token_ids and tuple(cfg.sampling.stop_token_ids) != stops:
        errors.append(f"sampling.stop_token_ids: turns of {cfg.task!r} end at the environment's "
                      f"turn stop tokens {list(stops)}; drop --stop_token_ids")
    if cfg.sampling.max_new_tokens:
        errors.append(f"sampling.max_new_tokens={cfg.sampling.max_new_tokens}: episodes are "
                      "limited by --max_episode_tokens and --max_turn_tokens; drop "
                      "--max_new_tokens")
    if cfg.sampling.backend == "static":
        errors.append("sampling.backend='static' decodes single completions; episodes run on "
                      "the eager backend: drop --backend static")
    if cfg.run.env_workers:
        errors.append(f"run.env_workers scores completions in Ray actors; the environments of "
                      f"{cfg.task!r} step inside the episode sampler: drop --env_workers")
    return errors


def to_dict(cfg: object) -> dict[str, object]:
    return dataclasses.asdict(cfg)  # type: ignore[call-overload]
