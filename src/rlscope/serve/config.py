"""Options of ``rlscope serve`` (a frozen dataclass parsed by tyro; ``--help`` lists them)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
API_KEY_ENV = "RLSCOPE_SERVE_API_KEY"


HUB_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
"""A hub model id ``org/name`` (what gets a cache entry; other alias names are skipped)."""

TOKENIZER_REMAPS: dict[str, tuple[str, ...]] = {
    "meta-llama/Llama-3": ("thinkingmachineslabinc/meta-llama-3-instruct-tokenizer",),
}
"""Repositories the cookbook's ``get_tokenizer`` reads instead of the model's own (it loads the
Llama 3 tokenizer from an ungated copy): an alias whose name starts with a key also gets cache
entries under these ids."""


def hub_cache_ids(alias: str) -> list[str]:
    """The repository ids an alias name gets cache entries under: itself if it is an
    ``org/name`` id, plus the ids the cookbook reads its tokenizer from (`TOKENIZER_REMAPS`)."""
    if not HUB_REPO_ID.fullmatch(alias):
        return []
    ids = [alias]
    for prefix, remapped in TOKENIZER_REMAPS.items():
        if alias.startswith(prefix):
            ids += [r for r in remapped if r not in ids]
    return ids


@dataclass(frozen=True)
class ServeConfig:
    """Serve rlscope policies over the Tinker wire protocol (SDK 0.38.0).

    Point the SDK at it with ``tinker.ServiceClient(base_url="http://HOST:PORT")`` and any
    ``TINKER_API_KEY`` starting with ``tml-``; see docs/tinker.md.
    """

    host: str = "127.0.0.1"
    """Address to bind. Loopback by default. Binding any other address requires
    ``--api_key`` (or ``$RLSCOPE_SERVE_API_KEY``): the server refuses to start without one."""
    api_key: str = ""
    """Key every request must carry in the ``X-API-Key`` header (the SDK sends its
    ``api_key`` / ``$TINKER_API_KEY`` there), compared in constant time; wrong or missing → 401.
    Must start with ``tml-`` (the SDK refuses other keys) and be at least 16 characters.
    Empty: ``$RLSCOPE_SERVE_API_KEY``, else no key (allowed on loopback only)."""
    port: int = 8000
    """TCP port to listen on."""
    models: tuple[str, ...] = ("tiny=tiny-llama",)
    """Base models the server accepts, each ``NAME=SPEC``. SPEC is ``tiny-llama`` or
    ``tiny-qwen2`` (a small randomly initialised architecture with the byte-level tokenizer,
    no download), ``tiny-qwen2-chat`` (the same with ChatML special tokens, for the cookbook's
    Qwen chat renderers) or a local Hugging Face model directory. NAME is what clients pass as
    ``base_model``; several names may share a SPEC, e.g. ``meta-llama/Llama-3.2-1B=tiny-llama``
    (an alias so names the cookbook knows resolve to a local model). A ``base_model`` that is a
    directory written by ``--write_tokenizer`` or holding a Hugging Face model is accepted too."""
    root: str = "serve_runs"
    """Directory for run directories (metrics, one per training client) and checkpoints
    (``tinker://<run>/weights|sampler_weights/<name>`` map to
    ``ROOT/<run>/checkpoints/...``)."""
    write_tokenizer: str = ""
    """If set, write the tiny models' byte-level tokenizer (tokenizer.json,
    tokenizer_config.json, loadable by transformers.AutoTokenizer) to this directory at start;
    pass the directory as ``model_name`` to cookbook recipes. It resolves to ``tiny-llama``."""
    write_hf_cache: str = ""
    """If set, write a Hugging Face hub cache to this directory at start: for every
    ``--models`` alias whose NAME is a hub id (``org/name``), the served model's tokenizer files
    and ``config.json`` under ``DIR/hub/models--org--name/`` (plus the ungated Llama 3
    tokenizer copy the cookbook reads for ``meta-llama/Llama-3*`` names). Run clients with
    ``HF_HOME=DIR HF_HUB_OFFLINE=1`` and an unmodified ``AutoTokenizer.from_pretrained("org/name")``
    (the cookbook's ``get_tokenizer``) finds them offline."""
    device: str = "auto"
    """Torch device: auto (cuda when available, else cpu), cpu, cuda, cuda:1, ..."""
    seed: int = 0
    """Seed of the tiny models' initial weights (the same seed gives the same base model, so
    checkpoints stay loadable across restarts) and of unseeded sampling."""
    lora_alpha: int = 32
    """LoRA scaling α for every adapter (the update is (α / r)·B·A)."""
    tiny_d_model: int = 64
    """Hidden width of the tiny models."""
    tiny_layers: int = 2
    """Transformer blocks of the tiny models."""
    tiny_heads: int = 4
    """Attention heads of the tiny models."""
    tiny_max_len: int = 2048
    """Largest sequence (prompt + completion) the tiny models accept."""
    max_sample_rows: int = 256
    """Most sequences the sampler decodes together; concurrent sample requests with the same
    weights and sampling parameters are merged up to this many rows."""
    max_tokens_per_microbatch: int = 8192
    """forward_backward splits its datums into micro-batches of about this many padded tokens
    (the losses are sums, so the gradient is the same)."""
    long_poll_s: float = 25.0
    """How long retrieve_future holds a poll before answering 408 (the SDK's poll timeout is
    45 s; keep this well below)."""
    seq_gap_timeout_s: float = 60.0
    """A training request waits at most this long for a missing earlier seq_id of its model
    before the gap is skipped (with a warning)."""
    fwdbwd_max_chunk_len: int = 0
    """Datums per forward_backward chunk the SDK is told to send (0 = the SDK's default, 1024);
    chunks are posted concurrently, first chunk last, and reassembled here by seq_id."""
    max_body_bytes: int = 32 * 2**20
    """Largest request body accepted, as sent (compressed); larger → 413."""
    max_decompressed_bytes: int = 128 * 2**20
    """Largest body after ``Content-Encoding: zstd`` / ``gzip`` decompression (streamed,
    stopped at this size); larger → 413."""
    max_num_samples: int = 1024
    """Largest ``num_samples`` of one sample request; larger → 400."""
    max_sample_tokens: int = 4096
    """Largest ``max_tokens`` of one sample request; larger → 400."""
    max_topk_logprobs: int = 64
    """Largest ``topk_prompt_logprobs`` of one sample request (the top-k next tokens and
    their log-probs at each prompt position, for distillation); larger → 400."""
    max_batch_tokens: int = 2_000_000
    """Most tokens one request may carry: the datums of a ``forward_backward`` (summed), or
    ``num_samples`` × (prompt + ``max_tokens``) of a sample request; more → 400."""
    sample_chunk_rows: int = 64
    """Sample requests are split into chunks of at most this many sequences; the worker takes
    chunks (and training jobs) round-robin across clients, so one huge request cannot starve
    the others."""
    future_ttl_s: float = 3600.0
    """A finished result nobody retrieved is dropped after this many seconds."""
    retrieved_ttl_s: float = 60.0
    """A retrieved result stays this long (for the SDK's retries of a lost response), then is
    dropped."""
    max_futures: int = 10000
    """Most results held at once; beyond it the oldest finished ones are dropped, and when all
    are pending new requests get 429 (the SDK backs off and retries)."""
    shutdown_timeout_s: float = 10.0
    """On SIGTERM/SIGINT: queued requests fail at once with a ``server`` error, the running one
    may finish, and the process exits within about this many seconds."""
    log_level: str = "info"
    """Server log level: debug, info, warning or error."""

    def validate(self) -> list[str]:
        errors = []
        if not 0 <= self.port <= 65535:
            errors.append(f"port={self.port} must lie in 0..65535")
        if not self.models:
            errors.append("models must name at least one NAME=SPEC")
        for entry in self.models:
            if "=" not in entry or not entry.split("=", 1)[0] or not entry.split("=", 1)[1]:
                errors.append(f"models entry {entry!r} must read NAME=SPEC")
        if self.lora_alpha <= 0:
            errors.append(f"lora_alpha={self.lora_alpha} must be > 0")
        if self.long_poll_s <= 0 or self.long_poll_s > 40:
            errors.append(f"long_poll_s={self.long_poll_s} must lie in (0, 40]: the SDK gives "
                          "each poll 45 s")
        if self.max_sample_rows < 1 or self.max_tokens_per_microbatch < 1:
            errors.append("max_sample_rows and max_tokens_per_microbatch must be >= 1")
        if self.fwdbwd_max_chunk_len < 0:
            errors.append("fwdbwd_max_chunk_len must be >= 0 (0 = the SDK default)")
        if self.tiny_d_model % self.tiny_heads:
            errors.append("tiny_d_model must be divisible by tiny_heads")
        key = self.resolved_api_key()
        if key and (not key.startswith("tml-") or len(key) < 16):
            errors.append(f"api_key (--api_key or ${API_KEY_ENV}) must start with 'tml-' "
                          "(the tinker SDK refuses other keys) and be at least 16 characters")
        if not self.is_loopback and not self.resolved_api_key():
            errors.append(f"host={self.host} is not a loopback address: set --api_key (or "
                          f"${API_KEY_ENV}) so only clients with the key can use the server")
        for name in ("max_body_bytes", "max_decompressed_bytes", "max_num_samples",
                     "max_sample_tokens", "max_batch_tokens", "sample_chunk_rows",
                     "max_topk_logprobs",
                     "max_futures"):
            if getattr(self, name) < 1:
                errors.append(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("future_ttl_s", "retrieved_ttl_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                errors.append(f"{name}={value} must be a finite number > 0")
        if self.write_hf_cache:
            names = [e.split("=", 1)[0] for e in self.models]
            if not any(hub_cache_ids(n) for n in names):
                errors.append(f"write_hf_cache: no --models NAME is a hub id (org/name), so "
                              f"there is nothing to cache; got {names}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            errors.append(f"log_level={self.log_level!r}: use debug, info, warning or error")
        return errors

    def resolved_api_key(self) -> str:
        """``api_key``, else ``$RLSCOPE_SERVE_API_KEY``, else empty (no key)."""
        return self.api_key or os.environ.get(API_KEY_ENV, "")

    @property
    def is_loopback(self) -> bool:
        """Whether ``host`` is a loopback address."""
        return self.host in LOOPBACK_HOSTS or self.host.startswith("127.")
