"""``lm_bandit``: next-byte prediction on English text as a contextual bandit (TASKS.md,
"Toy tasks").

The prompt is a window of ``context_len`` bytes (`rlscope.tokenizer.ByteTokenizer`, ids
0..255) of the corpus the package ships, `rlscope/data/corpus.txt` (generated English, public
domain by construction: `rlscope.data.make_corpus`); the completion is one token over the 256
byte ids; the reward is 1 if it is the byte that follows the window in the corpus.

Data. The corpus is cut once, at the first newline after 90% of its bytes: training windows
lie wholly in the first part, held-out windows wholly in the last 10%, so no byte is shared
(recurring phrases of the generated text can still occur in both parts, as in natural text).
Training windows are drawn uniformly with replacement by the run's generator; the held-out set
is ``eval_batches × eval_batch_size`` distinct windows drawn once per seed from a generator
seeded with ``seed + EVAL_SEED_OFFSET``, which the training stream never touches.

Policy. `build_policy` builds `rlscope.policy.build_policy(model_cfg, 256, context_len + 1)`:
the tiny transformer by default, or a small Hugging Face architecture (``arch`` llama / qwen2,
random init from a config); ``arch=hf`` loads a local model whose output vocabulary must be
the 256 byte ids. The hook also keeps the policy (to compute held-out perplexity) and a frozen
copy of it as first built, π_ref, the initial model (`attach_policy`).

Reward. r = [a = next byte]. With ``lm_kl_shaping`` β > 0 the training reward is
r − β(log π(a | x) − log π_ref(a | x)), log π(a | x) being the rollout's own raw log-prob
(``logp_raw_BT``: the behaviour policy at temperature 1) and log π_ref(a | x) a no-grad forward
of π_ref on the prompt. The exact expected reward π(next | x) is exposed while training
rewards are plain (hidden under reward noise and under shaping, where it is not E[r | x]).

Evaluation (greedy, clean): ``test_error`` = 1 − top-1 accuracy; ``nll`` = −log π(next | x)
and ``perplexity`` = exp(mean ``nll``), from a teacher-forced forward of the attached policy;
``test_error_t1/t2/t3`` = the error within each difficulty tercile (t1 easiest), terciles
fixed once per seed by the initial model's loss on that seed's held-out windows. The loop adds
``entropy``.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources

import torch
from torch import nn

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy import ModelConfig, build_policy
from rlscope.policy.base import Policy
from rlscope.tasks.base import (
    EVAL_OPTIONS,
    NOISE_OPTIONS,
    Scores,
    TaskConfig,
    TaskTraits,
    first_token_correct,
    unused_option_errors,
)
from rlscope.tasks.noise import exposes_expected_reward
from rlscope.tokenizer import ByteTokenizer

EVAL_SEED_OFFSET = 1_000_003
HELDOUT_FRACTION = 0.1
"""Share of the corpus (its end, cut at a newline) that only evaluation reads."""
TERCILES = ("t1", "t2", "t3")


@functools.lru_cache(maxsize=1)
def load_corpus() -> str:
    """The shipped corpus text (`rlscope/data/corpus.txt`, about 320 KB of UTF-8)."""
    return resources.files("rlscope.data").joinpath("corpus.txt").read_text(encoding="utf-8")


def split_ids(ids_N: torch.Tensor, heldout_fraction: float = HELDOUT_FRACTION,
              newline: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train_ids, heldout_ids)``: ``ids_N`` cut at the first ``newline`` at or after
    ``(1 − heldout_fraction)·N`` (at that index when there is none); the two parts are
    consecutive and share no position."""
    cut = int(len(ids_N) * (1.0 - heldout_fraction))
    after_N = (ids_N[cut:] == newline).nonzero()
    if len(after_N):
        cut += int(after_N[0]) + 1
    return ids_N[:cut], ids_N[cut:]


def windows(ids_N: torch.Tensor, starts_B: torch.Tensor, context_len: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens_BL, next_B)``: ``ids_N[s : s + L]`` and ``ids_N[s + L]`` for each start s."""
    index_BW = starts_B[:, None] + torch.arange(context_len + 1)
    window_BW = ids_N[index_BW]
    return window_BW[:, :context_len], window_BW[:, context_len]


class LMBanditTask:
    """Predict the next byte of English text in one action; reward 1 if it is right."""

    name = "lm_bandit"
    family = "bandit"

    @property
    def traits(self) -> TaskTraits:
        """0/1 rewards unless KL shaping makes them real-valued."""
        return TaskTraits(binary_rewards=self.cfg.lm_kl_shaping == 0)
    options: tuple[str, ...] = ("context_len", "lm_kl_shaping", *EVAL_OPTIONS, *NOISE_OPTIONS)
    """Reward-noise family (`rlscope.tasks.noise`): action 0 is the NUL byte."""
    has_labels = True
    completion_len = 1

    def __init__(self, cfg: TaskConfig, text: str | None = None) -> None:
        """``text``: the corpus (default: the shipped one; tests pass their own)."""
        self.cfg = cfg
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.prompt_len = cfg.context_len
        self.text = load_corpus() if text is None else text
        ids_N = torch.tensor(self.tokenizer.encode(self.text), dtype=torch.long)
        self.train_ids, self.heldout_ids = split_ids(ids_N)
        self.policy: nn.Module | None = None
        """The policy being trained, as attached by `build_policy` / `attach_policy`."""
        self.initial: nn.Module | None = None
        """π_ref: a frozen copy of the attached policy as it was when attached."""
        self._edges: dict[int, torch.Tensor] = {}
        self._eval_seed: int | None = None

    # ------------------------------------------------------------------ configuration

    def _n_starts(self, ids_N: torch.Tensor) -> int:
        """Windows of ``context_len + 1`` bytes that fit in ``ids_N``."""
        return max(len(ids_N) - self.cfg.context_len, 0)

    def validate(self) -> list[str]:
        c = self.cfg
        errors = unused_option_errors(c, self.name, ("vocab", "seq_len", "score_len",
                                                     "binary_reward"),
                                      " (its prompts are corpus windows of task.context_len "
                                      "bytes and its completion one byte)")
        if c.context_len < 1:
            errors.append(f"task.context_len={c.context_len} must be >= 1")
        elif self._n_starts(self.train_ids) < 1:
            errors.append(f"task.context_len={c.context_len} leaves no training window in "
                          f"{len(self.train_ids)} training bytes")
        n_eval = c.eval_batches * c.eval_batch_size
        if c.eval_batches < 1 or c.eval_batch_size < 1:
            errors.append("task.eval_batches and task.eval_batch_size must be >= 1")
        elif c.context_len >= 1 and n_eval > self._n_starts(self.heldout_ids):
            errors.append(f"task.eval_batches × task.eval_batch_size = {n_eval} distinct "
                          f"held-out windows, but the held-out text holds only "
                          f"{self._n_starts(self.heldout_ids)} of {c.context_len + 1} bytes")
        if c.lm_kl_shaping < 0:
            errors.append(f"task.lm_kl_shaping={c.lm_kl_shaping} must be >= 0")
        if c.lm_kl_shaping > 0 and c.reward_noise > 0:
            errors.append("task.lm_kl_shaping > 0 cannot be combined with task.reward_noise > 0 "
                          "(the noise reads correctness from a reward of exactly 1)")
        return errors

    def describe(self) -> str:
        shaping = (f"; reward shaped by −{self.cfg.lm_kl_shaping:g}·(log π − log π_ref)"
                   if self.cfg.lm_kl_shaping > 0 else "")
        return (f"{self.name}: predict the next byte after {self.cfg.context_len} bytes of "
                f"generated English ({len(self.train_ids)} training / {len(self.heldout_ids)} "
                f"held-out bytes); reward 1 if right{shaping}")

    # ------------------------------------------------------------------ policy

    def build_policy(self, model_cfg: object) -> Policy:
        """`rlscope.policy.build_policy` over the 256 byte ids and ``context_len + 1``
        positions, attached to the task (`attach_policy`)."""
        if not isinstance(model_cfg, ModelConfig):
            raise TypeError(f"expected a ModelConfig, got {type(model_cfg).__name__}")
        policy = build_policy(model_cfg, self.vocab_size, self.prompt_len + 1)
        if policy.vocab_size != self.vocab_size:
            raise ValueError(f"lm_bandit writes byte ids 0..{self.vocab_size - 1}; the model at "
                             f"{model_cfg.path!r} has an output vocabulary of "
                             f"{policy.vocab_size}")
        max_len = getattr(policy, "max_len", None)
        if max_len is not None and max_len < self.prompt_len + 1:
            raise ValueError(f"the model covers {max_len} positions; lm_bandit needs "
                             f"task.context_len + 1 = {self.prompt_len + 1}")
        self.attach_policy(policy)
        return policy

    def attach_policy(self, policy: Policy) -> None:
        """Use ``policy`` for held-out perplexity and take a frozen copy of it, as it is now,
        as π_ref, the initial model (KL shaping, difficulty terciles)."""
        if not isinstance(policy, nn.Module):
            raise TypeError(f"expected a torch module, got {type(policy).__name__}")
        self.policy = policy
        self.initial = copy.deepcopy(policy).requires_grad_(False).eval()
        self._edges.clear()

    @torch.no_grad()
    def _next_logp(self, model: nn.Module, tokens_BP: torch.Tensor,
                   mask_BP: torch.Tensor | None) -> torch.Tensor:
        """``[B, V]`` float log-probs of the next token after each prompt (temperature 1)."""
        device = next(model.parameters()).device
        mask = None if mask_BP is None else mask_BP.to(device)
        was_training = model.training
        model.eval()
        logits_BPV = model(tokens_BP.to(device), mask)[0]
        model.train(was_training)
        return logits_BPV[:, -1].float().log_softmax(-1).to(tokens_BP.device)

    def _initial_model(self) -> nn.Module:
        """π_ref, on the device the attached policy lives on now (the loop moves the policy
        after building it)."""
        if self.initial is None or self.policy is None:
            raise ValueError("lm_bandit has no initial model: build the policy with "
                             "make_policy_for(task, model_cfg) or call task.attach_policy(policy)")
        return self.initial.to(next(self.policy.parameters()).device)

    def initial_nll(self, tokens_BP: torch.Tensor, next_B: torch.Tensor,
                    mask_BP: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]``: −log π_ref(next | prompt), the initial model's loss on each window (on the
        device of ``tokens_BP``)."""
        logp_BV = self._next_logp(self._initial_model(), tokens_BP, mask_BP)
        return -logp_BV.gather(-1, next_B[:, None].to(logp_BV.device))[:, 0]

    # ------------------------------------------------------------------ prompts

    def _prompts(self, ids_N: torch.Tensor, starts_B: torch.Tensor) -> PromptBatch:
        tokens_BL, next_B = windows(ids_N, starts_B, self.cfg.context_len)
        return PromptBatch(tokens_BP=tokens_BL, targets_BT=next_B[:, None],
                           score_mask_BT=torch.ones(len(starts_B), 1))

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        """``n`` training windows, uniformly with replacement."""
        starts_B = torch.randint(0, self._n_starts(self.train_ids), (n,), generator=generator)
        return self._prompts(self.train_ids, starts_B)

    def eval_starts(self, seed: int) -> torch.Tensor:
        """``[eval_batches · eval_batch_size]`` distinct start offsets into `heldout_ids`."""
        g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
        n = self.cfg.eval_batches * self.cfg.eval_batch_size
        return torch.randperm(self._n_starts(self.heldout_ids), generator=g)[:n]

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        """The held-out windows of ``seed`` in ``eval_batches`` batches; later `eval_metrics`
        calls use this seed's difficulty terciles."""
        self._eval_seed = seed
        starts = self.eval_starts(seed).split(self.cfg.eval_batch_size)
        return [self._prompts(self.heldout_ids, s) for s in starts]

    def tercile_edges(self, seed: int) -> torch.Tensor:
        """``[2]``: the 1/3 and 2/3 quantiles of the initial model's loss over the held-out
        windows of ``seed``, computed once per seed and attached policy."""
        if seed not in self._edges:
            tokens_BL, next_B = windows(self.heldout_ids, self.eval_starts(seed),
                                        self.cfg.context_len)
            nll_B = self.initial_nll(tokens_BL, next_B).double()
            self._edges[seed] = torch.quantile(nll_B, torch.tensor([1 / 3, 2 / 3],
                                                                   dtype=torch.float64))
        return self._edges[seed]

    def terciles(self, tokens_BP: torch.Tensor, next_B: torch.Tensor, seed: int,
                 mask_BP: torch.Tensor | None = None) -> torch.Tensor:
        """``[B]`` long in {0, 1, 2}: each window's difficulty tercile (0 = lowest initial
        loss, up to and including the first edge)."""
        nll_B = self.initial_nll(tokens_BP, next_B, mask_BP).double()
        edges = self.tercile_edges(seed).to(nll_B.device)
        return (nll_B > edges[0]).long() + (nll_B > edges[1]).long()

    # ------------------------------------------------------------------ scoring

    def score(self, batch: RolloutBatch) -> Scores:
        """r = [a = next byte]; with β = ``lm_kl_shaping`` > 0,
        r − β(ℓ − ℓ_ref), ℓ = ``logp_raw_BT[:, 0]`` and ℓ_ref = log π_ref(a | x)."""
        correct_B = rewards_B = first_token_correct(batch, self.name)
        beta = self.cfg.lm_kl_shaping
        if beta > 0:
            action_B = batch.completion_tokens_BT[:, 0]
            logp_ref_B = -self.initial_nll(batch.prompt_tokens_BP, action_B, batch.prompt_mask_BP)
            shaping_B = beta * (batch.logp_raw_BT[:, 0].float() - logp_ref_B)
            rewards_B = (rewards_B - shaping_B) * batch.completion_mask_BT[:, 0]
        return Scores(rewards_B=rewards_B, token_rewards_BT=rewards_B[:, None],
                      unshaped_rewards_B=correct_B if beta > 0 else None)

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """π(next | x) = exp(log π(next | x)), ``[B]``, exact; None under reward noise or KL
        shaping."""
        if not exposes_expected_reward(self.cfg) or self.cfg.lm_kl_shaping > 0:
            return None
        return logp_targets_BT[:, 0].exp()

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Per row, ``[B]``: ``test_error`` = 1 − [greedy action = next byte]; ``nll`` =
        −log π(next | x) under the attached policy; ``perplexity`` = exp(mean ``nll`` of this
        batch) on every row; ``test_error_t{1,2,3}`` = the row's error times B / n_t on rows of
        tercile t (0 elsewhere), n_t the batch's rows in tercile t, so that each averages to the
        error within its tercile (0 for an empty one). The batch-level averages are exact when
        the batch is the whole evaluation set, as `rlscope.train` passes it."""
        if self.policy is None or self._eval_seed is None:
            raise ValueError("lm_bandit evaluates an attached policy on its held-out set: build "
                             "the policy with make_policy_for (or attach_policy) and call "
                             "eval_prompts(seed) first")
        assert batch.targets_BT is not None
        next_B = batch.targets_BT[:, 0]
        error_B = 1.0 - first_token_correct(batch, self.name)
        logp_BV = self._next_logp(self.policy, batch.prompt_tokens_BP, batch.prompt_mask_BP)
        nll_B = -logp_BV.gather(-1, next_B[:, None])[:, 0]
        out = {"test_error": error_B, "nll": nll_B,
               "perplexity": nll_B.mean().exp().expand_as(nll_B)}
        tercile_B = self.terciles(batch.prompt_tokens_BP, next_B, self._eval_seed,
                                  batch.prompt_mask_BP)
        B = len(error_B)
        for t, name in enumerate(TERCILES):
            in_t_B = (tercile_B == t).float()
            out[f"test_error_{name}"] = error_B * in_t_B * (B / in_t_B.sum().clamp_min(1.0))
        return out
