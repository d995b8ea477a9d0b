"""The tiny models' byte-level tokenizer, as rlscope uses it and as a Hugging Face directory.

Ids 0..255 are the UTF-8 bytes (as in `rlscope.tokenizer.ByteTokenizer`), 256 is ``<|bos|>``
and 257 is ``<|eos|>``. `write_tokenizer_dir` writes the same tokenizer as ``tokenizer.json``
and ``tokenizer_config.json`` (a byte-level BPE with no merges, so every byte is one token),
loadable by ``transformers.AutoTokenizer.from_pretrained(dir)`` and therefore by the cookbook's
``get_tokenizer(dir)``. A marker file ``rlscope_model.json`` tells the server which model spec
the directory stands for when a client passes the directory as ``base_model``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from rlscope.tokenizer import ByteTokenizer

BOS, EOS = "<|bos|>", "<|eos|>"
SPECIALS = (BOS, EOS)
VOCAB_SIZE = 256 + len(SPECIALS)
MARKER = "rlscope_model.json"


class TextCodec:
    """What the sampler needs from a tokenizer: ``decode`` (for string stops) and the EOS id."""

    def __init__(self, decode_fn: Callable[[list[int]], str], eos_token_id: int | None) -> None:
        self._decode = decode_fn
        self.eos_token_id = eos_token_id

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._decode(list(ids)))


def byte_codec() -> TextCodec:
    """The tiny models' codec."""
    tok = ByteTokenizer(SPECIALS)
    return TextCodec(tok.decode, tok.special_id(EOS))


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


def write_tokenizer_dir(path: str | Path, spec: str = "tiny-llama") -> Path:
    """Write the byte-level tokenizer (and the model marker naming ``spec``) to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)
    fast.save_pretrained(str(out))
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
