"""The tiny models' byte-level tokenizer, as rlscope uses it and as a Hugging Face directory.

Ids 0..255 are the UTF-8 bytes (as in `rlscope.tokenizer.ByteTokenizer`), 256 is ``<|bos|>``
and 257 is ``<|eos|>``. The ``tiny-qwen2-chat`` model's tokenizer has the ChatML special tokens
instead (`CHAT_SPECIALS`: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<think>``,
``</think>`` at 256..260, EOS ``<|im_end|>``), so the cookbook's Qwen chat renderers, which need
``<|im_end|>`` and ``</think>`` to be single tokens, work with it. `write_tokenizer_dir`
writes the same tokenizer as ``tokenizer.json`` and ``tokenizer_config.json`` (a byte-level BPE
with no merges, so every byte is one token), loadable by
``transformers.AutoTokenizer.from_pretrained(dir)`` and therefore by the cookbook's
``get_tokenizer(dir)``. A marker file ``rlscope_model.json`` tells the server which model spec
the directory stands for when a client passes the directory as ``base_model``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from rlscope.tokenizer import ByteTokenizer

BOS, EOS = "<|bos|>", "<|eos|>"
SPECIALS = (BOS, EOS)
VOCAB_SIZE = 256 + len(SPECIALS)
MARKER = "rlscope_model.json"
CHAT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
"""The ChatML special tokens of ``tiny-qwen2-chat`` (ids 256..260)."""


@dataclass(frozen=True)
class ByteTokens:
    """The special tokens of one tiny model's byte-level tokenizer."""

    specials: tuple[str, ...]
    bos: str | None
    eos: str

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.specials)


TINY_TOKENS: dict[str, ByteTokens] = {
    "tiny-llama": ByteTokens(SPECIALS, BOS, EOS),
    "tiny-qwen2": ByteTokens(SPECIALS, BOS, EOS),
    "tiny-qwen2-chat": ByteTokens(CHAT_SPECIALS, None, "<|im_end|>"),
}
"""The byte tokenizer of each tiny model spec."""


class TextCodec:
    """What the sampler needs from a tokenizer: ``decode`` (for string stops) and the EOS id."""

    def __init__(self, decode_fn: Callable[[list[int]], str], eos_token_id: int | None) -> None:
        self._decode = decode_fn
        self.eos_token_id = eos_token_id

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._decode(list(ids)))


def byte_codec(spec: str = "tiny-llama") -> TextCodec:
    """The codec of a tiny model spec."""
    tokens = TINY_TOKENS[spec]
    tok = ByteTokenizer(tokens.specials)
    return TextCodec(tok.decode, tok.special_id(tokens.eos))


def hf_codec(path: str) -> TextCodec:
    """The codec of a local Hugging Face tokenizer directory."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return TextCodec(lambda ids: str(tok.decode(ids, skip_special_tokens=False)),
                     tok.eos_token_id)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the ByteLevel alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def write_tokenizer_dir(path: str | Path, spec: str = "tiny-llama", marker: bool = True) -> Path:
    """Write the byte-level tokenizer of the tiny model ``spec`` to ``path``, with the model
    marker naming ``spec`` unless ``marker`` is False."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tokens = TINY_TOKENS[spec]
    tok.add_special_tokens(list(tokens.specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=tokens.bos,
                                   eos_token=tokens.eos)
    fast.save_pretrained(str(out))
    if marker:
        (out / MARKER).write_text(json.dumps({"spec": spec}) + "\n")
    return out


def marker_spec(path: str) -> str | None:
    """The model spec a directory written by `write_tokenizer_dir` stands for, else None."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        return None
    try:
        spec = json.loads(marker.read_text()).get("spec")
    except (json.JSONDecodeError, OSError):
        return None
    return spec if isinstance(spec, str) else None
