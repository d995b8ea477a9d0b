"""twenty_questions' model answerer (issue 20, the multi-agent case).

- **The answerer's task**, ``twenty_questions_answerer`` (`AnswererTask`): one line per prompt.
  The prompt is `answerer_prompt` (``object: <name>\\nquestion: <question>\\n``) over the
  shipped table's questions (`answerer_sft_pairs`: every object × every attribute phrasing, a
  guess of every object and the unanswerable questions); the completion is the answer line;
  reward 1 when it equals the oracle's (``yes``, ``no`` or ``I can't answer that``), else 0.
  ``rlscope sft --task twenty_questions_answerer`` warm-starts the answerer on those pairs
  (half of each batch drawn from the ``yes`` items, `YES_SHARE`); its evaluation metric
  ``accuracy`` is the greedy agreement with the oracle on uniform draws of the table.
- **The model answerer** (`ModelAnswerer`, built by `load_answerer` from an sft output or a run
  directory): greedy, one line, the questions asked at one decoding position answered in one
  batched decode (`BatchAnswerer`); the environment then cuts the answer at its newline and to
  `MAX_ANSWER_BYTES`. A question longer than `QUESTION_BYTES` bytes is cut to them in the
  answerer's prompt (its context is fixed when it is trained).
- **Training it** (`answerer_update`, ``--twenty_questions_train_answerer``): REINFORCE with a
  per-question mean baseline on the *faithful-answer reward*: for each question the policy
  asked in the batch, the answerer samples ``--twenty_questions_answerer_samples`` answers at
  temperature 1; an answer earns 1 when it equals the table's truth (the oracle's answer), else
  0. A cooperative answerer should be truthful: the questioner's episode return would pay it
  for whatever answers end games, true or not (the two models could drift to a private code
  the table does not support, and each would chase a moving partner); the faithful reward's
  optimum is the oracle, the answerer the questioner's warm start was trained against.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.envs.text import NEWLINE, encode, read_line
from rlscope.envs.twenty_questions import (
    MAX_ANSWER_BYTES,
    UNANSWERABLE,
    OracleAnswerer,
    Table,
    answerer_prompt,
    article,
    clean_answer,
    load_table,
    secret_index,
)
from rlscope.files import safe_load
from rlscope.policy.base import Policy
from rlscope.sampling.draw import SamplingConfig
from rlscope.sampling.sampler import generate
from rlscope.tasks.base import (
    EPISODE_OPTIONS,
    EVAL_OPTIONS,
    Scores,
    TaskConfig,
    TaskTraits,
    env_option_errors,
    unused_option_errors,
)
from rlscope.tasks.text import (
    PAD_ID,
    TEXT_OPTIONS,
    completion_ids,
    fixed_left_padded,
    prompt_texts,
    stop_padded,
    text_traits,
)
from rlscope.tokenizer import ByteTokenizer

TASK_NAME = "twenty_questions_answerer"
"""The answerer's task (what ``--twenty_questions_answerer_path`` must have been trained on)."""
QUESTION_BYTES = 64
"""Longest question (bytes, before its newline) the answerer reads; longer ones are cut."""
EVAL_SEED_OFFSET = 7_000_019
"""The held-out sets of the answerer's task come from ``seed + EVAL_SEED_OFFSET``."""
TRAIN_SEED_OFFSET = 9_000_011
"""The trained answerer's sampling stream is seeded with the run's ``seed + TRAIN_SEED_OFFSET``."""
YES_SHARE = 0.5
"""Share of the answerer's SFT pairs drawn from the items answered ``yes`` (`AnswererTask`)."""
MAX_TRAIN_QUESTIONS = 256
"""Most questions of one batch the answerer trains on (a random subset beyond it)."""


def answerer_prompt_len(table: Table | None = None) -> int:
    """The answerer's prompt width: the longest object name and a `QUESTION_BYTES` question."""
    table = table or load_table()
    longest = max(table.names, key=lambda n: len(n.encode("utf-8")))
    return len(encode(answerer_prompt(longest, "x" * QUESTION_BYTES)))


def answerer_prompt_ids(secret: str, question: str) -> list[int]:
    """The answerer's prompt ids for ``question`` (text, its newline excluded), cut to
    `QUESTION_BYTES` bytes."""
    cut = question.strip().encode("utf-8")[:QUESTION_BYTES].decode("utf-8", errors="ignore")
    return list(encode(answerer_prompt(secret, cut)))


def parse_prompt(text: str) -> tuple[str, str]:
    """``(secret, question)`` of an answerer prompt's text (`answerer_prompt`)."""
    head, _, rest = text.partition("\n")
    return head.removeprefix("object: "), rest.removeprefix("question: ").rstrip("\n")


def table_questions(table: Table) -> list[str]:
    """Every question of the answerer's data: the attribute phrasings, a guess of each object,
    the unanswerable ones (`answerer_sft_pairs`' order)."""
    questions = [f"{p}?" for phrasings in table.phrasings for p in phrasings]
    questions += [f"is it {article(n)} {n}?" for n in table.names]
    return questions + list(UNANSWERABLE)


class AnswererTask:
    """Answer a yes/no question about a named object like the table's oracle (the
    twenty_questions answerer's warm start)."""

    name = TASK_NAME
    family = "sequence"
    has_labels = False
    options: tuple[str, ...] = EVAL_OPTIONS

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.table = load_table()
        self.oracle = OracleAnswerer(self.table)
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.prompt_len = answerer_prompt_len(self.table)
        self.completion_len = MAX_ANSWER_BYTES
        self.items = [(secret, q) for secret in self.table.names
                      for q in table_questions(self.table)]
        """Every (object, question) of the data."""
        self.yes_items = [(s, q) for s, q in self.items
                          if self.oracle.answer_text(s, q) == "yes\n"]
        """The items answered ``yes`` (8% of the table; 87% are ``no``)."""

    @property
    def traits(self) -> TaskTraits:
        """The newline ends an answer; rewards are 0/1."""
        return text_traits(binary_rewards=True)

    def validate(self) -> list[str]:
        c = self.cfg
        errors = unused_option_errors(c, self.name, (
            *TEXT_OPTIONS, *EPISODE_OPTIONS, "difficulty", "format_reward", "length_limit"))
        errors += env_option_errors(c, self.name, None)
        if c.eval_batches < 1 or c.eval_batch_size < 1:
            errors.append("task.eval_batches and task.eval_batch_size must be >= 1")
        return errors

    def describe(self) -> str:
        return (f"{self.name}: answer one of {len(self.items)} (object, question) pairs of the "
                "twenty_questions table like its oracle; reward 1 for the oracle's answer")

    def _draw(self, generator: torch.Generator, n: int) -> list[tuple[str, str]]:
        index = torch.randint(0, len(self.items), (n,), generator=generator)
        return [self.items[i] for i in index.tolist()]

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        """``n`` (object, question) prompts drawn uniformly from the table's, with the
        oracle's answers as ``targets_BT``."""
        items = self._draw(generator, n)
        prompts = fixed_left_padded([answerer_prompt_ids(s, q) for s, q in items],
                                    self.prompt_len)
        answers = [list(encode(self.oracle.answer_text(s, q))) for s, q in items]
        return dataclasses.replace(prompts,
                                   targets_BT=stop_padded(answers, self.completion_len))

    def sft_pairs(self, generator: torch.Generator, n: int) -> list[tuple[list[int], list[int]]]:
        """``n`` pairs (prompt ids, the oracle's answer ids): each from the ``yes`` items with
        probability `YES_SHARE`, else uniformly from the whole table. Only 8% of the table
        is answered ``yes``; drawn uniformly, the tiny model learns to answer ``no`` to
        everything (after 1,500 steps: 3% of the ``yes`` items right, 91% overall)."""
        pairs = []
        for _ in range(n):
            pool = self.yes_items if float(torch.rand((), generator=generator)) < YES_SHARE \
                else self.items
            s, q = pool[int(torch.randint(0, len(pool), (), generator=generator))]
            pairs.append((answerer_prompt_ids(s, q), list(encode(self.oracle.answer_text(s, q)))))
        return pairs

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
        return [self.sample_prompts(g, self.cfg.eval_batch_size)
                for _ in range(self.cfg.eval_batches)]

    def correct(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B]`` 1.0 where the row's answer line (cut as the environment cuts it) is the
        oracle's."""
        right = []
        for text, ids in zip(prompt_texts(batch, self.tokenizer), completion_ids(batch),
                             strict=True):
            secret, question = parse_prompt(text)
            truth = self.oracle.answer_text(secret, question) if secret in self.table.names \
                else ""
            right.append(float(bytes(clean_answer(tuple(ids))) == truth.encode("utf-8")))
        return torch.tensor(right, dtype=torch.float32, device=batch.completion_tokens_BT.device)

    def score(self, batch: RolloutBatch) -> Scores:
        """1 for the oracle's answer, else 0."""
        return Scores(rewards_B=self.correct(batch))

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        return None

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """``accuracy`` (the oracle's answer) and ``test_error`` = 1 − accuracy."""
        accuracy_B = self.correct(batch)
        return {"accuracy": accuracy_B, "test_error": 1.0 - accuracy_B}


def _device(policy: Policy) -> torch.device:
    return next(iter(policy.parameters())).device


def answer_prompts(secrets: list[str], questions: list[str], width: int) -> PromptBatch:
    """The answerer's prompts for ``questions`` (texts) about ``secrets``, left-padded to
    ``width``."""
    return fixed_left_padded([answerer_prompt_ids(s, q)
                              for s, q in zip(secrets, questions, strict=True)], width)


class ModelAnswerer:
    """An rlscope policy as twenty_questions' answerer: greedy, one line, batched
    (`rlscope.envs.twenty_questions.BatchAnswerer`)."""

    def __init__(self, policy: Policy, prompt_len: int | None = None) -> None:
        self.policy = policy
        self.prompt_len = prompt_len or answerer_prompt_len()

    def answer_many(self, secrets: list[str], questions: list[tuple[int, ...]]
                    ) -> list[tuple[int, ...]]:
        """The greedy answer line (ids through the newline, or `MAX_ANSWER_BYTES` ids) to
        each question (the policy's ids) about the object named in ``secrets``: one batched
        decode."""
        if not questions:
            return []
        texts = [read_line(q)[0] for q in questions]
        device = _device(self.policy)
        prompts = answer_prompts(secrets, texts, self.prompt_len).to(device)
        was_training = bool(getattr(self.policy, "training", False))
        if isinstance(self.policy, torch.nn.Module):
            self.policy.eval()
        rollout = generate(self.policy, prompts,
                           SamplingConfig(temperature=0.0, stop_token_ids=(NEWLINE,),
                                          decode_graphs=False),
                           torch.zeros(len(texts), dtype=torch.long, device=device),
                           MAX_ANSWER_BYTES, pad_token_id=PAD_ID)
        if was_training and isinstance(self.policy, torch.nn.Module):
            self.policy.train()
        return [tuple(ids) for ids in completion_ids(rollout)]

    def answer(self, secret: str, question: tuple[int, ...]) -> tuple[int, ...]:
        """`answer_many` of one question."""
        return self.answer_many([secret], [question])[0]


def _payload_model(path: Path, what: str) -> tuple[Path, dict[str, Any], str]:
    """The weights file of ``path``, its model config and the task it was trained on."""
    from rlscope.files import LATEST, SFT_FILE

    if not path.exists():
        raise ValueError(f"{what} {path}: no such file or directory")
    folder = path if path.is_dir() else path.parent.parent  # run_dir/checkpoints/step_N.pt
    if path.is_dir():
        if (path / SFT_FILE).is_file():
            weights = path / SFT_FILE
        elif (path / "checkpoints" / LATEST).is_file():
            weights = path / "checkpoints" / (path / "checkpoints" / LATEST).read_text().strip()
        else:
            raise ValueError(f"{what} {path}: not an rlscope run directory (it holds neither "
                             f"{SFT_FILE} nor checkpoints/{LATEST}); give the output directory "
                             f"of rlscope sft --task {TASK_NAME}")
    else:
        weights = path
    payload = safe_load(weights, what)
    if "model" in payload:  # an sft output records its model and task
        return weights, payload, str(payload.get("task", ""))
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"{what} {path}: no model configuration (neither in the weights nor a "
                         "config.json of its run directory)")
    stored = json.loads(config.read_text(encoding="utf-8"))["config"]
    return weights, {**payload, "model": stored["model"]}, str(stored.get("task", ""))


def load_answerer(path: str, device: torch.device | str = "cpu",
                  what: str = "--twenty_questions_answerer_path") -> ModelAnswerer:
    """The model answerer whose weights ``path`` holds (an `rlscope sft` output directory or
    its sft.pt, a run directory or one of its checkpoint files), on ``device``. ValueError,
    naming ``what``, for a path that does not exist, is not a run directory, or was trained on
    another task or vocabulary."""
    from rlscope.policy import ModelConfig, build_policy

    weights, payload, task = _payload_model(Path(path), what)
    if task != TASK_NAME:
        raise ValueError(f"{what} {path}: trained on task {task!r}, whose vocabulary and "
                         f"prompt format are not the answerer's; train it with rlscope sft "
                         f"--task {TASK_NAME}")
    fields: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                              for k, v in payload["model"].items()
                              if k in ModelConfig.__dataclass_fields__}
    model_cfg = dataclasses.replace(ModelConfig(**fields), lora_rank=0,
                                    gradient_checkpointing=False)
    prompt_len = answerer_prompt_len()
    policy = build_policy(model_cfg, ByteTokenizer().vocab_size, prompt_len + MAX_ANSWER_BYTES)
    own, theirs = policy.state_dict(), payload["policy"]
    mismatched = sorted(k for k, v in own.items()
                        if k not in theirs or tuple(theirs[k].shape) != tuple(v.shape))
    if mismatched or set(theirs) - set(own):
        raise ValueError(f"{what} {weights}: its weights do not fit the answerer's byte "
                         f"vocabulary ({ByteTokenizer().vocab_size}) and context "
                         f"({prompt_len + MAX_ANSWER_BYTES}) under its model {payload['model']} "
                         f"(mismatched {mismatched[:4]})")
    policy.load_state_dict(theirs)
    policy.to(device)
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    return ModelAnswerer(policy, prompt_len)


@dataclass(frozen=True)
class AskedQuestion:
    """One question the answerer answered in an episode."""

    secret: str
    """The hidden object's name."""
    question: str
    """The question's text (its newline excluded)."""
    answer: bytes
    """The answer the environment passed on (its newline included)."""


def asked_questions(batch: RolloutBatch, table: Table) -> list[AskedQuestion]:
    """The questions the answerer answered in ``batch``'s episodes, in row and turn order: the
    policy turns that were questions (ended by a newline and ``?``, not ``I give up``)
    followed by a complete answer line (a solved guess has none; an answer cut by the episode
    budget is left out)."""
    if batch.env_mask_BT is None or batch.turn_BT is None or batch.env_seeds_B is None:
        return []
    tokens = batch.completion_tokens_BT.tolist()
    policy = batch.completion_mask_BT.tolist()
    env = batch.env_mask_BT.tolist()
    turn = batch.turn_BT.tolist()
    asked = []
    for i, seed in enumerate(batch.env_seeds_B.tolist()):
        secret = table.names[secret_index(int(seed), table)]
        turns: dict[int, tuple[list[int], list[int]]] = {}
        for t, k in enumerate(turn[i]):
            if k < 0:
                continue
            mine, theirs = turns.setdefault(k, ([], []))
            if policy[i][t]:
                mine.append(tokens[i][t])
            elif env[i][t]:
                theirs.append(tokens[i][t])
        for k in sorted(turns):
            mine, theirs = turns[k]
            text, terminated = read_line(mine)
            if terminated and text.rstrip().endswith("?") and theirs and theirs[-1] == NEWLINE \
                    and " ".join(text.lower().removesuffix("?").split()) != "i give up":
                asked.append(AskedQuestion(secret, text, bytes(theirs)))
    return asked


@dataclass
class AnswererTraining:
    """The trained answerer's optimizer and sampling stream
    (``--twenty_questions_train_answerer``)."""

    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    samples: int
    """Answers sampled per question."""

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def answerer_accuracy(asked: list[AskedQuestion], oracle: OracleAnswerer) -> float:
    """The fraction of ``asked`` whose answer is the oracle's."""
    right = sum(q.answer == oracle.answer_text(q.secret, q.question).encode("utf-8")
                for q in asked)
    return right / max(1, len(asked))


def answerer_update(answerer: ModelAnswerer, training: AnswererTraining,
                    asked: list[AskedQuestion], oracle: OracleAnswerer
                    ) -> dict[str, torch.Tensor]:
    """One REINFORCE step of the answerer on the faithful-answer reward (module docstring):
    ``samples`` answers per question of ``asked`` (at most `MAX_TRAIN_QUESTIONS`, a random
    subset beyond), reward 1 for the oracle's answer, advantage = reward − the question's mean,
    loss = −mean over answers of advantage × log π(answer). Returns ``answerer/loss`` and
    ``answerer/reward_mean``."""
    policy, g, G = answerer.policy, training.generator, training.samples
    device = _device(policy)
    if len(asked) > MAX_TRAIN_QUESTIONS:
        keep = torch.randperm(len(asked), generator=g)[:MAX_TRAIN_QUESTIONS].tolist()
        asked = [asked[i] for i in sorted(keep)]
    secrets = [q.secret for q in asked for _ in range(G)]
    questions = [q.question for q in asked for _ in range(G)]
    prompts = answer_prompts(secrets, questions, answerer.prompt_len).to(device)
    seeds_B = torch.randint(0, 2**62, (len(secrets),), generator=g).to(device)
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    rollout = generate(policy, prompts, SamplingConfig(temperature=1.0, stop_token_ids=(NEWLINE,),
                                                       decode_graphs=False),
                       seeds_B, MAX_ANSWER_BYTES, pad_token_id=PAD_ID)
    truths = [oracle.answer_text(s, q).encode("utf-8") for s, q in zip(secrets, questions,
                                                                       strict=True)]
    reward_B = torch.tensor([float(bytes(clean_answer(tuple(ids))) == truth)
                             for ids, truth in zip(completion_ids(rollout), truths, strict=True)],
                            device=device)
    adv_B = reward_B - reward_B.view(-1, G).mean(-1).repeat_interleave(G)
    P = prompts.tokens_BP.shape[1]
    tokens_BL = torch.cat([prompts.tokens_BP, rollout.completion_tokens_BT], 1)
    assert prompts.attention_mask_BP is not None
    attention_BL = torch.cat([prompts.attention_mask_BP,
                              torch.ones_like(rollout.completion_tokens_BT)], 1)
    if isinstance(policy, torch.nn.Module):
        policy.train()
    logits_BLV = policy.forward(tokens_BL, attention_BL)[0]
    logp_BTV = logits_BLV[:, P - 1:-1].float().log_softmax(-1)
    logp_BT = logp_BTV.gather(-1, rollout.completion_tokens_BT[..., None])[..., 0]
    logp_B = (logp_BT * rollout.completion_mask_BT).sum(-1)
    loss = -(adv_B * logp_B).mean()
    training.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    training.optimizer.step()
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    return {"answerer/loss": loss.detach(), "answerer/reward_mean": reward_B.mean()}
