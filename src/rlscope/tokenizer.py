"""A byte-level tokenizer: UTF-8 bytes 0..255 are token ids 0..255, optional special tokens
take the ids after them.

Any text round-trips (``decode(encode(s)) == s``) with no vocabulary file and no download,
which is what the real-model tasks need to run the tiny transformer, or a small Hugging Face
architecture built from a config, without pretrained weights (TASKS.md, "Real-model tasks").
Special tokens are never produced by `encode` (it reads plain text only); `decode` writes
them by name and turns byte sequences that are not valid UTF-8 into U+FFFD.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

N_BYTES = 256


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then ``specials`` as ids 256, 257, ... in order."""

    def __init__(self, specials: Sequence[str] = ()) -> None:
        if len(set(specials)) != len(specials):
            raise ValueError(f"special tokens must be distinct, got {list(specials)}")
        if any(not s for s in specials):
            raise ValueError("a special token needs a non-empty name")
        self.specials: tuple[str, ...] = tuple(specials)
        self._special_ids = {s: N_BYTES + i for i, s in enumerate(self.specials)}

    @property
    def vocab_size(self) -> int:
        """256 byte ids plus the special tokens."""
        return N_BYTES + len(self.specials)

    def special_id(self, name: str) -> int:
        """The id of special token ``name``."""
        if name not in self._special_ids:
            raise ValueError(f"unknown special token {name!r}; this tokenizer has "
                             f"{list(self.specials) or 'none'}")
        return self._special_ids[name]

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids (special-token names are read as plain text)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: byte runs decoded as UTF-8 (invalid bytes → U+FFFD), special ids
        written as their names."""
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < N_BYTES:
                run.append(i)
                continue
            if not N_BYTES <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside 0..{self.vocab_size - 1}")
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
            parts.append(self.specials[i - N_BYTES])
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)
