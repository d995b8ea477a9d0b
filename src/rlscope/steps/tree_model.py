"""The RLM tree step's model side (COMPANIONS.md §4, "Models"): the chat codecs that turn a
conversation into prompt token ids and generated ids back into text, and `RecordingGenerator`,
the ``generate(conversations, max_new_tokens) -> texts`` callable the tree driver calls, which
samples with `rlscope.sampling.generate` and keeps every generation's token ids for the
learner.

- `ByteChat`: the byte tokenizer (`rlscope.tokenizer.ByteTokenizer`) plus the chat specials
  ``<|system|> <|user|> <|assistant|> <|end|>``; a message is ``<|role|>`` + its UTF-8 bytes +
  ``<|end|>``; the prompt ends with ``<|assistant|>``; generation stops at ``<|end|>``.
- `TemplateChat`: a local Hugging Face directory's tokenizer and chat template
  (``enable_thinking`` goes to the template; templates that do not read it ignore it).

The learner trains on the token ids the sampler drew, never on re-encoded text: a byte-level
model can emit bytes that are not UTF-8, whose decoded text does not encode back to them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rlscope.batch import PromptBatch
from rlscope.policy.base import Policy
from rlscope.sampling import SamplingConfig, generate
from rlscope.tokenizer import ByteTokenizer

Message = dict[str, str]
"""One chat message: ``{"role": "system" | "user" | "assistant", "content": text}``."""
CHAT_SPECIALS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
"""The byte codec's special tokens, ids 256..259 in this order."""


class ChatCodec(Protocol):
    """Conversations to prompt ids, generated ids to text."""

    vocab_size: int
    """Token ids the model must cover."""
    stop_ids: tuple[int, ...]
    """Ids that end a generation (kept in the trained segment)."""

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The conversation followed by the assistant's generation prompt."""
        ...

    def conversation_ids(self, messages: Sequence[Message]) -> list[int]:
        """The conversation alone (a finished transcript, for supervised training)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of generated ids (stop ids dropped)."""
        ...

    def save(self, directory: Path) -> None:
        """Write what reloads this codec into ``directory``."""
        ...


class ByteChat:
    """`ByteTokenizer` with `CHAT_SPECIALS` (module docstring)."""

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer(CHAT_SPECIALS)
        self.vocab_size = self.tokenizer.vocab_size
        self.end_id = self.tokenizer.special_id("<|end|>")
        self.stop_ids: tuple[int, ...] = (self.end_id,)

    def conversation_ids(self, messages: Sequence[Message]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            role = message["role"]
            if f"<|{role}|>" not in CHAT_SPECIALS:
                raise ValueError(f"unknown chat role {role!r}: use system, user or assistant")
            ids += [self.tokenizer.special_id(f"<|{role}|>"),
                    *self.tokenizer.encode(message["content"]), self.end_id]
        return ids

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return [*self.conversation_ids(messages), self.tokenizer.special_id("<|assistant|>")]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(i for i in ids if i not in self.stop_ids)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tokenizer.json").write_text(json.dumps(
            {"type": "rlscope.ByteTokenizer", "specials": list(CHAT_SPECIALS),
             "stop": "<|end|>"}, indent=2))


class TemplateChat:
    """A Hugging Face tokenizer and its chat template, from a local directory."""

    def __init__(self, path: str, enable_thinking: bool) -> None:
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"--path {path}: the tokenizer has no chat template")
        self.enable_thinking = enable_thinking
        self.vocab_size = len(self.tokenizer)
        stops = {self.tokenizer.eos_token_id}
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            token_id = self.tokenizer.convert_tokens_to_ids(name)
            if isinstance(token_id, int) and token_id != self.tokenizer.unk_token_id:
                stops.add(token_id)
        self.stop_ids = tuple(sorted(i for i in stops if i is not None))

    def _template(self, messages: Sequence[Message], generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=generation_prompt, tokenize=True,
            enable_thinking=self.enable_thinking)
        if not isinstance(ids, list):  # a BatchEncoding in some versions
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return self._template(messages, True)

    def conversation_ids(self, messages: Sequence[Message]) -> list[int]:
        return self._template(messages, False)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([i for i in ids if i not in self.stop_ids],
                                         skip_special_tokens=True))

    def save(self, directory: Path) -> None:
        self.tokenizer.save_pretrained(str(directory))


def transcript_ids(codec: ChatCodec, messages: Sequence[Message], train: Sequence[bool]
                   ) -> tuple[list[int], list[bool]]:
    """A finished conversation's ids and the mask of the ids a policy generates in it: each
    message with ``train`` True (an assistant turn) from the end of its generation prompt
    through its stop id. ValueError when the codec's rendering of a prefix is not a prefix of
    the whole (a chat template that rewrites earlier turns)."""
    if len(train) != len(messages):
        raise ValueError(f"{len(train)} mask entries for {len(messages)} messages")
    ids = codec.conversation_ids(messages)
    mask = [False] * len(ids)
    for i, learn in enumerate(train):
        if not learn:
            continue
        if messages[i]["role"] != "assistant":
            raise ValueError(f"message {i} is a {messages[i]['role']} message: only assistant "
                             "turns are trained")
        start = len(codec.prompt_ids(messages[:i]))
        through = codec.conversation_ids(messages[:i + 1])
        if ids[:len(through)] != through or start > len(through):
            raise ValueError("the chat format renders an earlier turn differently once later "
                             "turns follow; cannot align the assistant turns")
        mask[start:len(through)] = [True] * (len(through) - start)
    return ids, mask


@dataclass(frozen=True)
class Generation:
    """One sampled turn: the prompt and generated ids, the text, whether a stop id ended it."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    text: str
    stopped: bool


def conversation_key(messages: Sequence[Message], text: str) -> str:
    """The key a generation is recorded under: its conversation prefix and its text."""
    return json.dumps([[m["role"], m["content"]] for m in messages] + [text])


class RecordingGenerator:
    """``generate(conversations, max_new_tokens) -> texts`` for the tree driver: one batched
    sampling call (temperature 1, top-p 1, top-k 0, or greedy), each row's generation recorded under
    `conversation_key` so the learner finds the ids of every segment of the tree.

    ``seeds`` draws each row's sampling seed (its state is part of the run's state).
    """

    def __init__(self, policy: Policy, codec: ChatCodec, greedy: bool, seeds: torch.Generator,
                 device: torch.device) -> None:
        self.policy, self.codec, self.device, self.seeds = policy, codec, device, seeds
        self.sampling = SamplingConfig(temperature=0.0 if greedy else 1.0,
                                       stop_token_ids=codec.stop_ids, backend="eager")
        self.records: dict[str, list[Generation]] = {}

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Prompt tokens of a conversation (the driver's context limit reads it)."""
        return len(self.codec.prompt_ids(messages))

    def __call__(self, conversations: Sequence[Sequence[Message]],
                 max_new_tokens: int) -> list[str]:
        if not conversations:
            return []
        prompts_ids = [self.codec.prompt_ids(c) for c in conversations]
        prompts = PromptBatch.left_padded(
            [torch.tensor(ids, dtype=torch.long) for ids in prompts_ids]).to(self.device)
        row_seeds_B = torch.randint(0, 2**62, (len(prompts_ids),), generator=self.seeds)
        was_training = self.policy.training  # type: ignore[attr-defined]
        self.policy.eval()  # type: ignore[attr-defined]
        try:
            out = generate(self.policy, prompts, self.sampling, row_seeds_B.to(self.device),
                           max_new_tokens)
        finally:
            self.policy.train(was_training)  # type: ignore[attr-defined]
        texts = []
        for row, (messages, ids) in enumerate(zip(conversations, prompts_ids, strict=True)):
            keep_T = out.completion_mask_BT[row] > 0
            completion = tuple(int(i) for i in out.completion_tokens_BT[row][keep_T].tolist())
            text = self.codec.decode(completion)
            self.records.setdefault(conversation_key(messages, text), []).append(Generation(
                tuple(ids), completion, text, bool(out.finished_by_stop_B[row])))
            texts.append(text)
        return texts

    def take(self, messages: Sequence[Message], text: str) -> Generation:
        """The recorded generation of ``text`` after ``messages`` (each is taken once)."""
        found = self.records.get(conversation_key(messages, text))
        if not found:
            raise KeyError("no recorded generation for this segment: the tree driver must "
                           "call this generator for every segment it returns")
        return found.pop(0)

    def clear(self) -> None:
        """Forget every recorded generation (after a tree's segments are taken)."""
        self.records.clear()
