"""The task contract (TASKS.md) and the configuration every task reads.

A task makes prompts, scores completions and evaluates a policy; the loop holds no task-specific
code. Training rewards may later be corrupted by reward noise; evaluation is always clean and on
a held-out set fixed per seed, drawn from a generator the training stream never touches.

The contract, in full (every check on a task goes through one of these; none through
``getattr``/``hasattr``):

- `Task`: the protocol every registered task satisfies (prompts, scoring, evaluation, its
  command-line options, validation) and its ``traits``.
- `TaskTraits`: what a task declares about itself as data: its default stop tokens, whether its
  rewards are 0/1, whether they decompose over tokens (dense credit is exact).
- Capabilities, small runtime-checkable protocols detected with ``isinstance``:

  - `OwnsPolicy` (``build_policy``): the task builds its own default model (digits_bandit's
    MLP, lm_bandit's byte model).
  - `GroupSized` (``use_group_size``): the task's evaluation metrics read the run's group
    size (unique_path's pass@K and M(q, K)); the loop passes it when the run starts.
  - `WatchesPolicy` (``attach_policy``): the task reads the policy being trained (lm_bandit's
    perplexity and its frozen π_ref); `rlscope train --init` attaches the loaded model.
  - `SupervisedPairs` (``sft_pairs``): correct (prompt, completion) pairs, the warm-start data
    of `rlscope sft` (an interactive task's are demonstration episodes with a loss mask on the
    policy's segments, `MaskedPair`).
  - `PreferencePairs` (``preference_pairs``, ``repeat_probe_pairs``): comparisons that train a
    reward model (`rlscope rm`) and its out-of-distribution probe.
  - `TrainingChecks` (``validate_training``): problems that stop `rlscope train` only (e.g.
    preference_rm without ``--rm_path``), not the supervised jobs.
  - `Tokenized` (``tokenizer``): a text tokenizer, so `rlscope sft --data FILE.jsonl` can read
    text pairs. The byte-level text tasks share their plumbing in `rlscope.tasks.text`.
  - `Interactive` (``environment_factory``, ``episode_budget``, ``episode_pool``): a
    multi-turn task; the loop samples its rows as episodes against the factory's environments
    (`rlscope.sampling.episodes.generate_episodes`) instead of single completions. Its prompts
    carry ``env_seeds_B``. `rlscope.tasks.episodes.EpisodeTask` adapts any factory.
  - `TrainsCompanion` (``start_companion``, ``companion_step``, ``companion_state``,
    ``load_companion_state``): the task owns a second model besides the policy
    (twenty_questions' model answerer); the loop puts it on the run's device, lets the task
    train or measure it after each policy update, and checkpoints its state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.envs.base import EnvironmentFactory, EpisodeBudget
from rlscope.envs.config import EnvConfig
from rlscope.policy.base import Policy
from rlscope.sampling.episodes import EpisodePool
from rlscope.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from rlscope.policy import ModelConfig

EVAL_OPTIONS = ("eval_batches", "eval_batch_size")
NOISE_OPTIONS = ("reward_noise", "reward_noise_mode")


@dataclass(frozen=True)
class TaskConfig:
    """Task options (each task reads the fields that apply to it)."""

    vocab: int = 2
    """Content alphabet size V of the token tasks (the policy sees V + 1 symbols, SEP = V;
    format_answer adds the ANSWER tag, id V + 1)."""
    seq_len: int = 10
    """Content tokens per prompt; also the completion length of the token tasks."""
    binary_reward: bool = False
    """Reward 1 only on an exact match (token_reversal, masked_reversal)."""
    score_len: int = 5
    """masked_reversal: how many final output positions are scored."""
    eval_batches: int = 10
    """Held-out evaluation: number of batches (vector_pareto: independent pools of 12 sets per
    prompt)."""
    eval_batch_size: int = 100
    """Held-out evaluation: prompts per batch."""
    reward_noise: float = 0.0
    """Probability in [0, 1] that a training sample's reward is corrupted (evaluation is always
    clean); needs a reward_noise_mode other than none."""
    reward_noise_mode: str = "none"
    """How a corrupted training reward changes: none, label_flip, random_reward,
    false_positive_action0, spurious_feature, false_positive_rare_token (docs/tasks.md)."""
    context_len: int = 32
    """lm_bandit: bytes of corpus text in each prompt (the action predicts the next byte)."""
    lm_kl_shaping: float = 0.0
    """lm_bandit: β of the KL-shaped training reward r − β(log π(a) − log π_ref(a)), π_ref the
    frozen initial policy (0 = plain reward; not combinable with reward_noise)."""
    difficulty: int = 1
    """arithmetic: 1 = a+b with operands 0..99; 2 = a+b or a−b with operands 10..999;
    3 = three or four operands 0..99 joined by + or − (docs/tasks.md)."""
    format_reward: float = 0.0
    """arithmetic: reward in [0, 1) for a well-formed but wrong answer (a terminated integer in
    canonical form); 0 = binary reward."""
    length_limit: int = 64
    """length_target, preference_rm: most tokens (bytes, stop included) a completion may
    have."""
    band_min_words: int = 0
    """length_target: with band_max_words > 0, the least words of a rewarded answer."""
    band_max_words: int = 0
    """length_target: reward 1 inside [band_min_words, band_max_words] words, else 0;
    0 = the default reward 2 − words/16 (shorter is better)."""
    rm_path: str = ""
    """preference_rm: the reward model to train against (the output directory of
    `rlscope rm`, or its rm.pt); required by rlscope train on that task."""
    code_completion_len: int = 256
    """code_unit_tests: most tokens generated for a function body (the END stop token
    included)."""
    code_workers: int = 2
    """code_unit_tests: sandboxes run at a time when a batch is scored (each takes up to one
    CPU core)."""
    code_cpu_seconds: int = 2
    """code_unit_tests: CPU seconds of one sandboxed program (RLIMIT_CPU) before it is killed
    (reward 0)."""
    code_wall_seconds: float = 5.0
    """code_unit_tests: wall-clock seconds of one sandboxed program before the trainer kills it
    (reward 0); keep it above code_cpu_seconds plus interpreter start-up."""
    code_per_test_seconds: float = 1.0
    """code_unit_tests: alarm per hidden test call inside the sandbox (a slow test fails
    alone)."""
    unsafe_sandbox: bool = False
    """code_unit_tests: run generated code in the WEAK sandbox (a plain subprocess with an
    in-process audit hook, escapable by a determined program) instead of refusing to start
    where bubblewrap (apt-get install bubblewrap) or seccomp is unavailable; docs/sandbox.md."""
    max_turns: int = 8
    """Interactive (multi-turn) tasks: most policy turns per episode; the episode is truncated
    ('max_turns') after the last one."""
    max_turn_tokens: int = 16
    """Interactive tasks: most tokens the policy writes in one turn (its stop token included);
    a longer turn is cut and handed to the environment as is."""
    max_episode_tokens: int = 256
    """Interactive tasks: most tokens after the initial observation (policy and environment
    tokens together); the episode is truncated ('max_episode_tokens') when it is full."""
    turn_discount: float = 1.0
    """Interactive tasks: per-turn discount γ in (0, 1] of the episode return
    Σ_k γ^k r_k (k = 0 for the first turn); 1 = the plain sum of the turns' rewards."""
    env_processes: int = 0
    """Interactive tasks: step the environments in this many worker processes, the batch
    decoded in as many sub-batches of whole groups, each decoding while the others'
    environments step (for slow environments: sandboxes, tools); 0 = in the trainer's
    process."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The multi-turn environments' options (guess_number, twenty_questions, calculator_tool,
    code_repair), each prefixed by its environment's name: docs/environments.md."""
    num_prompts: int = 0
    """unique_path: number of prompts (0 = 128); vector_pareto: number of prompts (0 = 8)."""
    horizon: int = 3
    """unique_path: decisions H per episode (>= 1)."""
    branching: int = 4
    """unique_path: actions b at each decision (>= 2)."""
    task_seed: int = 0
    """unique_path: seed of the random target action per (prompt, depth); the run seed never
    changes the targets."""
    initial_correct_probability: float = 0.5
    """unique_path: p₀ in (0, 1), the tabular policy's initial probability of each target
    action."""
    num_candidates: int = 3
    """vector_pareto: candidates M per set (the SetPolicy's slots); scalar_grpo needs 1,
    vpo_grpo and multi_rlvr more than 1."""
    num_weight_samples: int = 16
    """vector_pareto: preference weights N_w ~ Dirichlet(1, 1) drawn per group and shared by
    its K sets (vpo_grpo's set score averages over them)."""
    set_hidden: int = 32
    """vector_pareto: width h of the SetPolicy (prompt and slot embeddings, hidden layer)."""


@dataclass(frozen=True)
class Scores:
    """What `Task.score` returns: scalar rewards and, where defined, dense per-token rewards."""

    rewards_B: torch.Tensor
    token_rewards_BT: torch.Tensor | None = None
    unshaped_rewards_B: torch.Tensor | None = None
    """The task's reward before any shaping it applies (None when it applies none)."""
    valid_mask_BT: torch.Tensor | None = None
    """1 on the completion positions that count (e.g. up to the first wrong action of
    unique_path, after which the episode has ended), multiplied into the loss mask; None = all
    generated positions count."""


def first_token_correct(batch: RolloutBatch, task_name: str) -> torch.Tensor:
    """``[B]`` float for one-action tasks: the first completion token counts and equals the
    target."""
    if batch.targets_BT is None:
        raise ValueError(f"{task_name}: rollout batch carries no targets")
    return ((batch.completion_tokens_BT[:, 0] == batch.targets_BT[:, 0])
            & batch.completion_mask_BT[:, 0].bool()).float()


@dataclass(frozen=True)
class TaskTraits:
    """What a task declares about itself, read by the config checks and the loop."""

    stop_token_ids: tuple[int, ...] = ()
    """Default stop tokens (used unless --stop_token_ids is given): none for the token sandbox,
    the newline for the byte-level text tasks."""
    binary_rewards: bool = False
    """Training rewards are 0/1 (methods that require binary rewards check this)."""
    decomposable_token_rewards: bool = False
    """The reward is a mean of per-position rewards, so dense per-token credit is exact
    (``token_rewards`` methods)."""


@runtime_checkable
class Task(Protocol):
    """A registered task: the interface the loop relies on (capabilities: module docstring)."""

    name: str
    family: str
    """"sequence" (token tasks) or "bandit" (one action): decides which reward-noise modes
    exist for the task."""
    vocab_size: int
    """Token ids the policy reads and writes."""

    @property
    def prompt_len(self) -> int:
        """Prompt positions the policy's context must hold (an attribute of most tasks; a
        property where it is computed, as for the interactive tasks)."""
        ...

    completion_len: int
    """Default number of generated tokens."""
    options: tuple[str, ...]
    """The `TaskConfig` fields (command-line options) the task reads."""
    has_labels: bool
    """Whether prompts carry ground-truth targets (needed by the `ce` oracle)."""

    @property
    def traits(self) -> TaskTraits:
        """What the task declares about itself (`TaskTraits`)."""
        ...

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch: ...

    def score(self, batch: RolloutBatch) -> Scores: ...

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """Exact E[r | x] from the behaviour log-probs of the targets, or None if not exposed."""
        ...

    def eval_prompts(self, seed: int) -> list[PromptBatch]: ...

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Per-row evaluation quantities of a greedy rollout, each ``[B]`` (averaged later)."""
        ...

    def describe(self) -> str: ...

    def validate(self) -> list[str]: ...


@runtime_checkable
class OwnsPolicy(Protocol):
    """A task that builds its own default model."""

    def build_policy(self, model_cfg: object) -> Policy: ...


@runtime_checkable
class GroupSized(Protocol):
    """A task whose evaluation metrics depend on the run's group size K (unique_path's
    pass@K and predicted mixed-group rate); the loop tells it K once, when the run starts."""

    def use_group_size(self, group_size: int) -> None: ...


@runtime_checkable
class WatchesPolicy(Protocol):
    """A task that reads the policy being trained (attached once, when the run starts)."""

    def attach_policy(self, policy: Policy) -> None: ...


Pair = tuple[list[int], list[int]]
"""A supervised example: (prompt ids, completion ids)."""

MaskedPair = tuple[list[int], list[int], list[int]]
"""A supervised example whose completion is partly context: (prompt ids, completion ids, loss
mask per completion token: 1 on the tokens the model learns to write, 0 on those it only reads,
such as an environment's observations inside an episode)."""


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: a prompt, the preferred completion and the other (ids, each completion
    ending with the stop token)."""

    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


@runtime_checkable
class SupervisedPairs(Protocol):
    """A task that generates correct (prompt, completion) pairs (`rlscope sft`); an
    interactive task's are `MaskedPair` episodes (the policy's segments in the loss only)."""

    def sft_pairs(self, generator: torch.Generator, n: int
                  ) -> Sequence[Pair] | Sequence[MaskedPair]: ...


@runtime_checkable
class PreferencePairs(Protocol):
    """A task that generates preference comparisons: the training pairs of `rlscope rm` and a
    probe outside their distribution."""

    def preference_pairs(self, generator: torch.Generator, n: int) -> list[PreferencePair]: ...

    def repeat_probe_pairs(self, generator: torch.Generator, n: int
                           ) -> list[PreferencePair]: ...


@runtime_checkable
class TrainingChecks(Protocol):
    """A task with problems that stop RL training only (not the supervised jobs)."""

    def validate_training(self) -> list[str]: ...


@runtime_checkable
class Tokenized(Protocol):
    """A task over text with a tokenizer (`rlscope sft --data` reads text pairs with it)."""

    tokenizer: ByteTokenizer


@runtime_checkable
class Interactive(Protocol):
    """A multi-turn task: its rows are episodes against ``environment_factory``'s environments
    under ``episode_budget`` (the loop samples them with
    `rlscope.sampling.episodes.generate_episodes`; prompts carry ``env_seeds_B``)."""

    @property
    def environment_factory(self) -> EnvironmentFactory: ...

    @property
    def episode_budget(self) -> EpisodeBudget: ...

    @property
    def episode_pool(self) -> EpisodePool | None:
        """Worker processes its environments step in (``--env_processes``), or None."""
        ...


@runtime_checkable
class TrainsCompanion(Protocol):
    """A task that owns a second model (twenty_questions' model answerer): built by the task,
    put on the run's device when the run starts, trained (or only measured) by the task after
    each policy update, its state checkpointed with the run's so that a resume is exact."""

    def start_companion(self, device: torch.device, seed: int) -> None:
        """Move the companion to ``device``; seed its own streams from the run's ``seed``."""
        ...

    def companion_step(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """After the policy's update on ``batch``: the companion's update (when it trains) and
        its metrics."""
        ...

    def companion_state(self) -> dict[str, Any]:
        """What a checkpoint must hold to restore the companion exactly (``{}``: nothing)."""
        ...

    def load_companion_state(self, state: dict[str, Any]) -> None:
        """Restore `companion_state`'s ``state`` (after `start_companion`)."""
        ...


EPISODE_OPTIONS = ("max_turns", "max_turn_tokens", "max_episode_tokens", "turn_discount",
                   "env_processes")
"""The `TaskConfig` fields only interactive tasks read."""


def unused_option_errors(cfg: TaskConfig, task_name: str, names: tuple[str, ...],
                         why: str = "") -> list[str]:
    """One error per option among ``names`` that ``cfg`` sets away from its default: the task
    ``task_name`` does not read it (``why``, when given, says why)."""
    default = TaskConfig()
    return [f"task.{name} does not apply to {task_name}{why}; leave it at "
            f"{getattr(default, name)}"
            for name in names if getattr(cfg, name) != getattr(default, name)]


def env_option_errors(cfg: TaskConfig, task_name: str, prefix: str | None) -> list[str]:
    """One error per environment option (`EnvConfig`) that ``cfg`` sets away from its default
    and task ``task_name`` does not read: every one for a task that is not an environment
    (``prefix`` None), else those not named ``prefix…``."""
    default = EnvConfig()
    changed = [f.name for f in fields(EnvConfig)
               if getattr(cfg.env, f.name) != getattr(default, f.name)]
    why = "it is not a multi-turn environment" if prefix is None else \
        f"it reads only the {prefix}* options"
    return [f"task.{name} does not apply to {task_name} ({why}); leave it at "
            f"{getattr(default, name)}"
            for name in changed if prefix is None or not name.startswith(prefix)]


def refuse_transformer_options(model_cfg: object, task_name: str, what: str) -> ModelConfig:
    """For a task that builds its own model (`OwnsPolicy`): ``model_cfg`` as a `ModelConfig`,
    or ValueError naming every transformer option set away from its default (they do not
    apply; only model.dtype does); ``what`` names the task's model in the message."""
    from rlscope.policy import ModelConfig

    if not isinstance(model_cfg, ModelConfig):
        raise TypeError(f"expected a ModelConfig, got {type(model_cfg).__name__}")
    default = ModelConfig()
    changed = [f"model.{name}={getattr(model_cfg, name)!r}"
               for name in ("arch", "path", "d_model", "n_heads", "n_layers", "embed_init")
               if getattr(model_cfg, name) != getattr(default, name)]
    if changed:
        raise ValueError(f"{task_name} trains its own {what}; {', '.join(changed)} does not "
                         "apply (only model.dtype does)")
    return model_cfg


def make_policy_for(task: Task, model_cfg: object) -> Policy:
    """The task's default policy: the task's own ``build_policy(model_cfg)`` where it defines
    one (digits_bandit's MLP), else the configured sequence model over the task's vocabulary
    and its prompt + completion length."""
    from rlscope.policy import ModelConfig, build_policy

    if isinstance(task, OwnsPolicy):
        return task.build_policy(model_cfg)
    assert isinstance(model_cfg, ModelConfig)
    return build_policy(model_cfg, task.vocab_size, task.prompt_len + task.completion_len)
