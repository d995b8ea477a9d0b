"""``code_unit_tests``: write the body of a Python function from its specification; the reward
is the fraction of hidden unit tests it passes, run in `rlscope.sandbox` (TASKS.md,
"Real-model tasks").

Data. `rlscope/data/code_specs.json` ships 22 small specifications. Each has a signature and a
docstring (the prompt), a reference body (tests use it to show that a right answer scores 1;
`sft_pairs` turns the training specs' references into warm-start pairs) and 3–6 hidden tests
``function(*args) == expected``. Specs marked ``heldout`` (5 of
them) are never training prompts; evaluation reads only them.

Prompt and completion. The prompt is ``def <signature>:`` and a line holding the docstring in
triple quotes, in byte ids (`rlscope.tokenizer.ByteTokenizer` with one special token, END,
id 256, the stop token). The completion is the function **body**, continuing the prompt; it
ends at the first END token, and the body ends before the first non-empty line that is not
indented (so top-level code a model appends after the function, ``print(...)`` or a second
``def``, is dropped, as HumanEval's stop sequences do). The program run is prompt + body.

Reward. Passed / total hidden tests of the program (`rlscope.sandbox.run_tests`), scored for a
batch by at most ``code_workers`` (`CodeConfig.workers`) sandboxes at a time. Anything the
completion does — empty, binary, a syntax error, a hang, an escape attempt — is a reward of 0,
never an exception. The sandbox is the isolated one (bubblewrap, docs/sandbox.md); where it is
unavailable `validate` refuses the task with the install hint unless ``unsafe_sandbox``
(``--unsafe_sandbox``) selects the weak one. The exact expected reward is not exposed (it would
need the reward of every possible program).

Interface. Registered as ``--task code_unit_tests``. Its options are the flat `TaskConfig`
fields ``code_completion_len``, ``code_workers``, ``code_cpu_seconds``, ``code_wall_seconds``,
``code_per_test_seconds`` and ``unsafe_sandbox``, turned into a `CodeConfig`
(`CodeConfig.from_task_config`); a `CodeConfig` passed to the constructor overrides them
(tests, other generators). The END token is the task's stop token (in force unless
``--stop_token_ids`` is given). Prompts are left-padded with NUL to the longest spec prompt
(117 bytes), with an attention mask, so every batch has the same width; the tiny transformer
then needs 117 + ``code_completion_len`` positions.

Held-out set. Unlike the generated tasks, the prompts are a fixed finite set: the held-out
specs are the same for every seed; only which of them fill the ``eval_batches ×
eval_batch_size`` rows (drawn with replacement from a generator seeded with ``seed +
EVAL_SEED_OFFSET``) depends on the seed. Prompts carry no targets (no reference is shown to the
learner; ``has_labels`` False) and reward noise does not apply.
`score_programs` and `extract_body` are the standalone reward interface for any generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.sandbox import SandboxLimits, SandboxResult, isolation_problem, run_many
from rlscope.sandbox.isolated import INSTALL_HINT
from rlscope.sandbox.specs import END, CodeSpec, extract_body, load_specs
from rlscope.tasks.base import EVAL_OPTIONS, Scores, TaskConfig, TaskTraits, unused_option_errors
from rlscope.tasks.text import TEXT_OPTIONS, fixed_left_padded
from rlscope.tokenizer import ByteTokenizer

EVAL_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class CodeConfig:
    """Options of ``code_unit_tests`` beyond `TaskConfig`."""

    completion_len: int = 256
    """Most bytes generated for a body (END included)."""
    workers: int = 2
    """Sandboxes run at a time when a batch is scored (each takes up to one CPU core)."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    """Per-program sandbox limits (`rlscope.sandbox.SandboxLimits`)."""
    unsafe: bool = False
    """Use the weak subprocess sandbox instead of the isolated one (``--unsafe_sandbox``)."""

    @classmethod
    def from_task_config(cls, cfg: TaskConfig) -> CodeConfig:
        """The options given as `TaskConfig` fields (``--code_*`` on the command line); the
        other sandbox limits keep their defaults."""
        return cls(completion_len=cfg.code_completion_len, workers=cfg.code_workers,
                   unsafe=cfg.unsafe_sandbox,
                   limits=SandboxLimits(cpu_seconds=cfg.code_cpu_seconds,
                                        wall_seconds=cfg.code_wall_seconds,
                                        per_test_seconds=cfg.code_per_test_seconds))


def score_programs(specs: Sequence[CodeSpec], completions: Sequence[str],
                   cfg: CodeConfig | None = None) -> list[SandboxResult]:
    """Sandbox results of ``spec.prompt + extract_body(completion)`` against each spec's
    hidden tests, pairwise; at most ``cfg.workers`` sandboxes at a time. Never raises for
    anything in ``completions``."""
    if len(specs) != len(completions):
        raise ValueError(f"{len(specs)} specs but {len(completions)} completions")
    cfg = cfg or CodeConfig()
    jobs = [(s.prompt + extract_body(c), s.function, s.tests)
            for s, c in zip(specs, completions, strict=True)]
    return run_many(jobs, cfg.limits, cfg.workers, unsafe=cfg.unsafe)


class CodeUnitTestsTask:
    """Complete a function body from its specification; reward = fraction of hidden unit
    tests passed in the sandbox."""

    name = "code_unit_tests"
    family = "sequence"
    options: tuple[str, ...] = ("code_completion_len", "code_workers", "code_cpu_seconds",
                                "code_wall_seconds", "code_per_test_seconds", "unsafe_sandbox",
                                *EVAL_OPTIONS)
    has_labels = False
    _foreign = (*TEXT_OPTIONS, "difficulty", "format_reward", "length_limit", "band_min_words",
                "band_max_words", "reward_noise")

    def __init__(self, cfg: TaskConfig, code_cfg: CodeConfig | None = None,
                 specs: Sequence[CodeSpec] | None = None) -> None:
        """``code_cfg``: default `CodeConfig.from_task_config(cfg)`; ``specs``: default the
        shipped ones (tests may pass their own)."""
        self.cfg = cfg
        self.code_cfg = code_cfg or CodeConfig.from_task_config(cfg)
        self.tokenizer = ByteTokenizer([END])
        self.end_id = self.tokenizer.special_id(END)
        self.vocab_size = self.tokenizer.vocab_size
        self.completion_len = self.code_cfg.completion_len
        self.specs = tuple(load_specs() if specs is None else specs)
        self.train_specs = tuple(s for s in self.specs if not s.heldout)
        self.eval_specs = tuple(s for s in self.specs if s.heldout)
        self._by_prompt = {tuple(self.tokenizer.encode(s.prompt)): s for s in self.specs}
        self.prompt_len = max(len(p) for p in self._by_prompt)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The END token ends a completion (used unless --stop_token_ids is given)."""
        return (self.end_id,)

    @property
    def traits(self) -> TaskTraits:
        """The END token stops a completion; rewards (fractions of tests) are not 0/1."""
        return TaskTraits(stop_token_ids=self.stop_token_ids)

    def validate(self) -> list[str]:
        errors = unused_option_errors(self.cfg, self.name, self._foreign)
        if not self.train_specs or not self.eval_specs:
            errors.append("code_unit_tests needs training and held-out specs")
        if self.cfg.eval_batches < 1 or self.cfg.eval_batch_size < 1:
            errors.append("task.eval_batches and task.eval_batch_size must be >= 1")
        if self.code_cfg.completion_len < 1 or self.code_cfg.workers < 1:
            errors.append("code completion_len and workers must be >= 1")
        if not self.code_cfg.unsafe and (problem := isolation_problem()):
            errors.append(f"code_unit_tests refuses to run generated code without the "
                          f"isolated sandbox ({problem}): {INSTALL_HINT}")
        return errors + self.code_cfg.limits.validate()

    def describe(self) -> str:
        return (f"{self.name}: write a Python function body from its specification "
                f"({len(self.train_specs)} training / {len(self.eval_specs)} held-out specs); "
                f"reward = fraction of hidden unit tests passed in a sandbox"
                + (" (WEAK: --unsafe_sandbox)" if self.code_cfg.unsafe else ""))

    def _prompts(self, specs: Sequence[CodeSpec]) -> PromptBatch:
        return fixed_left_padded([self.tokenizer.encode(s.prompt) for s in specs],
                                 self.prompt_len)

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        """``n`` training specs, uniformly with replacement."""
        index = torch.randint(0, len(self.train_specs), (n,), generator=generator)
        return self._prompts([self.train_specs[int(i)] for i in index])

    def sft_pairs(self, generator: torch.Generator, n: int) -> list[tuple[list[int], list[int]]]:
        """``n`` warm-start pairs ``(prompt ids, reference body + END)`` of training specs,
        uniformly with replacement (for `rlscope sft`; held-out references are never shown)."""
        index = torch.randint(0, len(self.train_specs), (n,), generator=generator)
        return [(self.tokenizer.encode(spec.prompt),
                 [*self.tokenizer.encode(spec.reference), self.end_id])
                for spec in (self.train_specs[int(i)] for i in index)]

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        """``eval_batches`` batches of held-out specs, drawn with replacement from a generator
        seeded with ``seed + EVAL_SEED_OFFSET``."""
        g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
        out = []
        for _ in range(self.cfg.eval_batches):
            index = torch.randint(0, len(self.eval_specs), (self.cfg.eval_batch_size,),
                                  generator=g)
            out.append(self._prompts([self.eval_specs[int(i)] for i in index]))
        return out

    def spec_of(self, prompt_P: torch.Tensor, mask_P: torch.Tensor | None) -> CodeSpec:
        """The spec whose prompt is the row ``prompt_P`` (padding removed)."""
        ids = prompt_P if mask_P is None else prompt_P[mask_P.bool()]
        key = tuple(int(i) for i in ids)
        if key not in self._by_prompt:
            raise ValueError("code_unit_tests: a prompt row is not one of the task's specs")
        return self._by_prompt[key]

    def completions(self, batch: RolloutBatch) -> list[str]:
        """Decoded completion text of each row (tokens after a stop are not counted)."""
        out = []
        for tokens_T, mask_T in zip(batch.completion_tokens_BT, batch.completion_mask_BT,
                                    strict=True):
            ids = [int(i) for i in tokens_T[mask_T.bool()]
                   if 0 <= int(i) < self.vocab_size]
            out.append(self.tokenizer.decode(ids))
        return out

    def results(self, batch: RolloutBatch) -> list[SandboxResult]:
        """Sandbox results of every row."""
        mask = batch.prompt_mask_BP
        specs = [self.spec_of(batch.prompt_tokens_BP[b], None if mask is None else mask[b])
                 for b in range(batch.batch_size)]
        return score_programs(specs, self.completions(batch), self.code_cfg)

    def score(self, batch: RolloutBatch) -> Scores:
        """``[B]`` fraction of hidden tests passed."""
        rewards = [r.reward for r in self.results(batch)]
        return Scores(rewards_B=torch.tensor(rewards, dtype=torch.float32,
                                             device=batch.completion_tokens_BT.device))

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """Not exposed."""
        return None

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Per row: ``test_error`` = 1 − fraction passed; ``solved`` = all tests passed;
        ``sandbox_ok`` = the program ran to its result (no timeout, crash, limit or block)."""
        results = self.results(batch)
        device = batch.completion_tokens_BT.device

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return {"test_error": 1.0 - column([r.reward for r in results]),
                "solved": column([float(r.status == "ok" and r.passed == r.total)
                                  for r in results]),
                "sandbox_ok": column([float(r.status == "ok") for r in results])}
