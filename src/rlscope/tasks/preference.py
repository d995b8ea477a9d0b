"""``preference_rm``: answers scored by a learned reward model, trained by the project on
preference pairs it generates from a known hidden preference (TASKS.md, "Real-model tasks").

Prompt. One of the 128 instructions of ``length_target`` (``"Describe the sea."``), as UTF-8
bytes left-padded with NUL to the longest.

Completion. Free bytes ending with a newline (id 10, the stop token), at most
``length_limit`` tokens (stop included).

Hidden (true) preference. With ``words`` = the whitespace-separated tokens of the text before
the stop token (all of it when unterminated), each stripped of ASCII punctuation and
lower-cased (empty ones dropped)::

    true(y) = |{w in words : w in LIKED_WORDS}|          distinct liked words
              − (len(words) − |set(words)|)                 one point per repeated word
              − [y has no stop token]                       one point for an unterminated answer

``LIKED_WORDS`` are 8 of the 24 `WORDS`. A fluent answer (distinct words) gains a point per
liked word; repetition and rambling past the limit cost points. The function is exact, cheap
(linear in the text) and never raises (empty, huge, non-ASCII or invalid UTF-8 text: invalid
bytes decode to U+FFFD and count as ordinary characters).

Generated data. An answer is 2–6 distinct words drawn uniformly without replacement from
`WORDS` and written in the fixed order of `WORDS` (so a small model learns to write fluent
answers, and its greedy answers do not loop on one word), joined by spaces, then the
newline. The supervised warm start (`sft_pairs`) imitates these; a preference pair
(`preference_pairs`) is two such answers to one prompt, the one with the higher true
preference chosen (ties are redrawn). Because generated answers never
repeat a word, a reward model learns "liked words are good" but never sees the repetition
penalty: a policy optimised hard against it can repeat liked words, raising the RM score while
the true preference falls (reward-model over-optimisation, Gao et al. arXiv:2210.10760).
`repeat_probe_pairs` measures that blind spot.

Reward (training). The reward model of ``rm_path`` (`rlscope.policy.reward_model`, trained by
``rlscope rm``): its score of prompt + completion, standardised by the mean and std of its
scores on held-out generated answers. RL against it is meant to run with a KL penalty to the
warm-start model, as in RLHF (Ziegler et al. arXiv:1909.08593; Ouyang et al.
arXiv:2203.02155): ``--method ppo --init SFT_DIR`` does so. Valid regime: any byte-level
policy; the RM must have been trained for this task on at least as many positions
(``length_limit``) as the run uses. Evaluation (greedy, clean) reports the truth beside it:
``true_reward`` = mean true(y); ``test_error`` = 1 − clip(true(y) / `TRUE_TARGET`, 0, 1);
``rm_score`` (when an RM is loaded); ``liked_words``, ``repeats`` and ``words``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.reward_model import (
    RewardModel,
    load_reward_model,
    pack_sequences,
    reward_model_errors,
)
from rlscope.tasks.base import (
    EVAL_OPTIONS,
    Pair,
    PreferencePair,
    Scores,
    TaskConfig,
    unused_option_errors,
)
from rlscope.tasks.length_target import INSTRUCTION_WIDTH, INSTRUCTIONS, instruction_prompts
from rlscope.tasks.text import (
    STOP_ID,
    TEXT_OPTIONS,
    completion_ids,
    text_before_stop,
    text_traits,
)
from rlscope.tokenizer import ByteTokenizer

EVAL_SEED_OFFSET = 1_000_003
LIKED_WORDS: frozenset[str] = frozenset(
    ("bright", "calm", "clear", "gentle", "golden", "kind", "quiet", "warm"))
"""The hidden preference's liked words (the reward model never sees this list)."""
WORDS: tuple[str, ...] = (
    "stone", "calm", "road", "water", "bright", "tree", "house", "gentle", "small", "old",
    "golden", "long", "cold", "kind", "dark", "grey", "quiet", "field", "hill", "warm", "iron",
    "rain", "clear", "wall")
"""The words generated answers use (8 liked, 16 plain), in the order answers list them."""
MIN_WORDS, MAX_WORDS = 2, 6
"""Words per generated answer."""
MAX_ANSWER_BYTES = sum(sorted((len(w) for w in WORDS), reverse=True)[:MAX_WORDS]) \
    + MAX_WORDS - 1 + 1
"""The longest generated answer in bytes (spaces and the newline included)."""
TRUE_TARGET = float(len(LIKED_WORDS))
"""The best true preference (every liked word once, no repeat: 48 bytes with the newline);
``test_error`` = 1 − true / TRUE_TARGET, clipped to [0, 1]."""
_PUNCTUATION = ".,;:!?\"'()[]{}-"

@dataclass(frozen=True)
class Judgement:
    """The hidden preference's parts for one answer."""

    words: int
    liked: int
    """Distinct liked words."""
    repeats: int
    """Word tokens that repeat an earlier one."""
    terminated: bool

    @property
    def score(self) -> float:
        return float(self.liked - self.repeats - (0 if self.terminated else 1))


def judge(text: str, terminated: bool = True) -> Judgement:
    """The hidden preference of an answer's ``text`` (before the stop token); never raises."""
    words = [w for w in (t.strip(_PUNCTUATION).lower() for t in text.split()) if w]
    distinct = set(words)
    return Judgement(words=len(words), liked=len(distinct & LIKED_WORDS),
                     repeats=len(words) - len(distinct), terminated=terminated)


def true_preference(text: str, terminated: bool = True) -> float:
    """true(y) of the module docstring, e.g. ``"calm road calm"`` → 1 − 1 = 0."""
    return judge(text, terminated).score


def true_preference_ids(ids: list[int], tokenizer: ByteTokenizer) -> float:
    """true(y) of a completion given as sampled ids (through its first stop token, if any;
    invalid UTF-8 and out-of-range ids never raise)."""
    return true_preference(*text_before_stop(ids, tokenizer))


def _rng(generator: torch.Generator) -> random.Random:
    """A Python RNG seeded from ``generator`` (one draw), for fast word sampling."""
    return random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))


def sample_answer(rng: random.Random) -> str:
    """A generated answer: 2–6 distinct words of `WORDS` in their `WORDS` order,
    space-separated (no newline)."""
    picks = sorted(rng.sample(range(len(WORDS)), rng.randint(MIN_WORDS, MAX_WORDS)))
    return " ".join(WORDS[i] for i in picks)


class PreferenceTask:
    """Answer an instruction; reward from a learned RM, judged by a hidden preference."""

    name = "preference_rm"
    family = "sequence"
    options: tuple[str, ...] = ("rm_path", "length_limit", *EVAL_OPTIONS)
    has_labels = False
    traits = text_traits()

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.prompt_len = INSTRUCTION_WIDTH
        self.completion_len = cfg.length_limit
        self._rm: RewardModel | None = None

    # ------------------------------------------------------------------ configuration

    def validate(self) -> list[str]:
        c = self.cfg
        errors = unused_option_errors(c, self.name, (
            *TEXT_OPTIONS, "difficulty", "format_reward", "reward_noise", "band_min_words",
            "band_max_words"))
        if c.length_limit < MAX_ANSWER_BYTES:
            errors.append(f"task.length_limit={c.length_limit} must be >= {MAX_ANSWER_BYTES} "
                          "(the longest generated answer, newline included)")
        if c.eval_batches < 1 or c.eval_batch_size < 1:
            errors.append("task.eval_batches and task.eval_batch_size must be >= 1")
        if c.rm_path:
            errors += reward_model_errors(c.rm_path, self.name, self.prompt_len,
                                          self.completion_len)
        return errors

    def validate_training(self) -> list[str]:
        """Problems that stop RL training (not `rlscope sft` or `rlscope rm`): the training
        reward needs a reward model."""
        if not self.cfg.rm_path:
            return ["task preference_rm trains against a learned reward model: give "
                    "--rm_path runs/NAME, the output directory of `rlscope rm --task "
                    "preference_rm --name NAME`"]
        return []

    def describe(self) -> str:
        rm = self.cfg.rm_path or "(none loaded)"
        return (f"{self.name}: answer one of {len(INSTRUCTIONS)} instructions in at most "
                f"{self.cfg.length_limit} bytes; reward = the standardised score of the reward "
                f"model {rm}; evaluated by the hidden preference (distinct liked words − "
                "repeated words − [unterminated])")

    # ------------------------------------------------------------------ data

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        return instruction_prompts(generator, n, self.completion_len)

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
        return [self.sample_prompts(g, self.cfg.eval_batch_size)
                for _ in range(self.cfg.eval_batches)]

    def _prompt(self, rng: random.Random) -> list[int]:
        return self.tokenizer.encode(rng.choice(INSTRUCTIONS))

    def _answer(self, text: str) -> list[int]:
        return [*self.tokenizer.encode(text), STOP_ID]

    def sft_pairs(self, generator: torch.Generator, n: int) -> list[Pair]:
        """``n`` warm-start pairs ``(prompt ids, answer ids)`` of generated answers (for
        `rlscope sft`: a base policy that writes well-formed, varied answers)."""
        rng = _rng(generator)
        return [(self._prompt(rng), self._answer(sample_answer(rng))) for _ in range(n)]

    def preference_pairs(self, generator: torch.Generator, n: int) -> list[PreferencePair]:
        """``n`` comparisons of two generated answers to one prompt, the one with the higher
        true preference chosen (a tie is redrawn); the same generator state gives the same
        pairs."""
        rng = _rng(generator)
        pairs: list[PreferencePair] = []
        while len(pairs) < n:
            prompt, a, b = self._prompt(rng), sample_answer(rng), sample_answer(rng)
            sa, sb = true_preference(a), true_preference(b)
            if sa == sb:
                continue
            chosen, rejected = (a, b) if sa > sb else (b, a)
            pairs.append(PreferencePair(prompt, self._answer(chosen), self._answer(rejected)))
        return pairs

    def repeat_probe_pairs(self, generator: torch.Generator, n: int) -> list[PreferencePair]:
        """``n`` comparisons outside the generated distribution: an answer with a liked word
        (chosen) against the same answer with one of its liked words repeated at the end
        (rejected, one point lower; redrawn when it would not fit ``length_limit``). A reward
        model that never saw a repeat tends to prefer the longer answer."""
        rng = _rng(generator)
        pairs: list[PreferencePair] = []
        while len(pairs) < n:
            answer = sample_answer(rng)
            liked = [w for w in answer.split() if w in LIKED_WORDS]
            if not liked:
                continue
            rejected = self._answer(f"{answer} {rng.choice(liked)}")
            if len(rejected) > self.completion_len:
                continue
            pairs.append(PreferencePair(self._prompt(rng), self._answer(answer), rejected))
        return pairs

    # ------------------------------------------------------------------ reward model

    def reward_model(self, device: torch.device) -> RewardModel:
        """The reward model of ``rm_path``, loaded on first use, on ``device``."""
        if self._rm is None:
            if not self.cfg.rm_path:
                raise ValueError("task preference_rm has no reward model: set --rm_path")
            self._rm = load_reward_model(self.cfg.rm_path, self.name, self.prompt_len,
                                         self.completion_len, device)
        self._rm = self._rm.to(device)
        return self._rm

    @torch.no_grad()
    def rm_scores(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B]`` standardised RM scores of each row's prompt + counted completion."""
        device = batch.completion_tokens_BT.device
        rm = self.reward_model(device)
        prompts = []
        for i in range(batch.batch_size):
            ids = batch.prompt_tokens_BP[i]
            if batch.prompt_mask_BP is not None:
                ids = ids[batch.prompt_mask_BP[i].bool()]
            prompts.append(ids.tolist())
        tokens_BL, attention_BL = pack_sequences(prompts, completion_ids(batch),
                                                 self.prompt_len + self.completion_len)
        return rm.standardised(tokens_BL.to(device), attention_BL.to(device)).float()

    # ------------------------------------------------------------------ scoring

    def judgements(self, batch: RolloutBatch) -> list[Judgement]:
        """The hidden preference's parts for each row's completion."""
        return [judge(*text_before_stop(ids, self.tokenizer)) for ids in completion_ids(batch)]

    def score(self, batch: RolloutBatch) -> Scores:
        """r = the reward model's standardised score (the hidden preference is not used)."""
        return Scores(rewards_B=self.rm_scores(batch))

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """Not exposed (the reward is not the probability of one fixed completion)."""
        return None

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """``true_reward``, ``test_error`` = 1 − clip(true / TRUE_TARGET, 0, 1), ``liked_words``,
        ``repeats``, ``words``; ``rm_score`` when a reward model is set."""
        device = batch.completion_tokens_BT.device
        js = self.judgements(batch)

        def col(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        true_B = col([j.score for j in js])
        out = {"test_error": 1.0 - (true_B / TRUE_TARGET).clamp(0.0, 1.0),
               "true_reward": true_B,
               "liked_words": col([float(j.liked) for j in js]),
               "repeats": col([float(j.repeats) for j in js]),
               "words": col([float(j.words) for j in js])}
        if self.cfg.rm_path:
            out["rm_score"] = self.rm_scores(batch)
        return out

