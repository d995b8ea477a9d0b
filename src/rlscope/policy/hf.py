"""Adapter that makes a Hugging Face ``transformers`` causal LM satisfy the `Policy` protocol.

`HFPolicy` wraps an already-built ``AutoModelForCausalLM`` (a Llama, Qwen2, ... model object,
optionally with PEFT/LoRA adapters injected later) and exposes the three calls of
`rlscope.policy.base.Policy`: a full ``forward``, ``init_cache`` and incremental
``prefill`` / ``decode_step``. It follows the package's padding convention: prompts are
**left**-padded, ``attention_mask_BT`` is 1 on real tokens, and position ids are
``cumsum(mask) - 1`` so that a padded row sees exactly the positions it would see alone.

`tiny_hf_model` builds a small randomly initialised Llama or Qwen2 model from a config (no
download) for tests and smoke runs.

Nothing else in the package imports this module at import time, so ``transformers`` stays an
optional dependency (the ``hf`` extra).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlscope.policy.base import autocast_outputs, position_ids_from_mask

__all__ = ["HFCache", "HFPolicy", "tiny_hf_model"]

TINY_ARCHS: tuple[str, ...] = ("llama", "qwen2")
"""Architectures `tiny_hf_model` can build."""


@dataclass
class HFCache:
    """Incremental-decoding state of one `HFPolicy` batch.

    ``kv`` is the model's own cache (a ``transformers.DynamicCache``), which grows by one position
    per `HFPolicy.decode_step`. ``mask_BL`` is a pre-allocated ``[B, max_len]`` attention mask whose
    first ``length`` columns are valid (1 on real tokens, 0 on left padding); columns past
    ``length`` are pre-filled with 1 because every generated token is attended to.
    ``next_pos_B`` is the position id the next token of each row gets. ``padded`` is False when
    the prompt had no padding, which lets the model skip building a padding mask.
    """

    kv: Any
    """The model's cache object (``transformers.DynamicCache``)."""
    mask_BL: torch.Tensor
    """``[B, max_len]`` long attention mask; only ``[:, :length]`` is meaningful."""
    next_pos_B: torch.Tensor
    """``[B]`` long: position id of the next token of each row."""
    max_len: int
    """Largest number of positions (prompt + generated tokens) this cache accepts."""
    length: int = 0
    """Positions filled so far (prompt length after prefill, +1 per decode step)."""
    padded: bool = False
    """Whether the prefill had an attention mask (some keys may be padding)."""
    batch_size: int = field(init=False)
    """Number of rows, taken from ``mask_BL``."""

    def __post_init__(self) -> None:
        self.batch_size = self.mask_BL.shape[0]

    @property
    def attention_mask_BT(self) -> torch.Tensor:
        """The running ``[B, length]`` attention mask over every position seen so far."""
        return self.mask_BL[:, : self.length]


class HFPolicy(nn.Module):
    """A ``transformers`` causal LM seen through the `Policy` protocol (see `rlscope.policy.base`).

    The wrapped model is registered as the submodule ``model`` (so ``parameters()``, ``train()``,
    ``to()`` and ``state_dict()`` reach it); `unwrap` returns it, e.g. for PEFT/LoRA. The adapter
    starts in the wrapped model's train/eval mode.

    Args:
        model: an already-built causal LM (``AutoModelForCausalLM.from_pretrained`` /
            ``from_config``). Its output head must read the last entry of ``hidden_states`` (true
            for Llama, Qwen2 and most decoder-only models: that entry is post-final-norm).
    """

    autocast_dtype: torch.dtype | None = None
    """Mixed precision of the forward calls (`rlscope.policy.base.autocast_outputs`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        config = getattr(model, "config", None)
        if config is None:
            raise ValueError(
                f"HFPolicy needs a transformers model with a .config; got {type(model).__name__}"
            )
        self.model = model
        self.train(model.training)  # mirror the wrapped model's train/eval mode
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        get_head = getattr(model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        head_weight = getattr(head, "weight", None)
        if head_weight is not None:
            self.vocab_size: int = int(head_weight.shape[0])
        elif getattr(text_config, "vocab_size", None) is not None:
            self.vocab_size = int(text_config.vocab_size)
        else:
            raise ValueError("cannot infer vocab_size: no output head and no config.vocab_size")
        hidden = getattr(text_config, "hidden_size", None)
        if hidden is None and head_weight is not None:
            hidden = head_weight.shape[1]
        if hidden is None:
            raise ValueError("cannot infer hidden_size: no config.hidden_size and no output head")
        self.hidden_size: int = int(hidden)
        max_pos = getattr(text_config, "max_position_embeddings", None)
        self.max_len: int | None = int(max_pos) if max_pos is not None else None
        """Largest sequence length the model config declares (None when it declares none)."""
        params = _forward_params(model)
        if "cache" in params:
            self._cache_kwarg = "cache"  # transformers >= 5.x (past_key_values is deprecated)
        elif "past_key_values" in params:
            self._cache_kwarg = "past_key_values"
        else:
            raise ValueError(
                f"{type(model).__name__}.forward accepts neither `cache` nor `past_key_values`"
            )
        if "logits_to_keep" in params:
            self._keep_kwarg: str | None = "logits_to_keep"
        elif "num_logits_to_keep" in params:
            self._keep_kwarg = "num_logits_to_keep"
        else:
            self._keep_kwarg = None

    def unwrap(self) -> nn.Module:
        """The underlying ``transformers`` model (the same object as ``self.model``)."""
        return self.model

    @property
    def has_adapters(self) -> bool:
        """Whether the model is a PEFT model (LoRA adapters injected)."""
        return hasattr(self.model, "peft_config")

    def adapters_disabled(self) -> Any:
        """A context manager inside which the model runs without its adapters (the base)."""
        return self.model.disable_adapter()  # type: ignore[operator]

    def save_adapter(self, path: str | Path) -> None:
        """Write the LoRA adapters in PEFT format (``adapter_config.json`` and
        ``adapter_model.safetensors``) to the directory ``path``; load them back with
        ``peft.PeftModel.from_pretrained(base, path)`` on a base built the same way. Raises
        ValueError when the model has no PEFT adapters."""
        if not self.has_adapters:
            raise ValueError("save_adapter needs a PEFT model (set --lora_rank > 0)")
        self.model.save_pretrained(str(path))  # type: ignore[operator]

    # ------------------------------------------------------------------ full forward

    @autocast_outputs
    def forward(
        self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Full causal forward. Returns ``(logits_BTV, hidden_BTD)``.

        Args:
            tokens_BT: ``[B, T]`` integer token ids (left-padded when ``attention_mask_BT`` is
                given).
            attention_mask_BT: ``[B, T]``, 1/True on real tokens, or None when no row is padded
                (positions are then ``0 .. T-1``).

        Returns:
            ``logits_BTV`` as float32 (float64 for a float64 model) and ``hidden_BTD``, the
            final hidden state the output head reads (post-final-norm for Llama/Qwen2), in the
            model's dtype.
        """
        self._check_tokens(tokens_BT, "tokens_BT")
        T = tokens_BT.shape[1]
        if self.max_len is not None and T > self.max_len:
            raise ValueError(
                f"sequence of {T} tokens exceeds max_position_embeddings={self.max_len}"
            )
        kwargs: dict[str, Any] = {}
        if attention_mask_BT is not None:
            self._check_mask(attention_mask_BT, tokens_BT)
            kwargs["attention_mask"] = attention_mask_BT.long()
            kwargs["position_ids"] = position_ids_from_mask(attention_mask_BT)
        out = self.model(
            input_ids=tokens_BT, output_hidden_states=True, use_cache=False, return_dict=True,
            **kwargs,
        )
        hidden_BTD = out.hidden_states[-1]
        # at least float32: a float64 model (the exactness tests) keeps float64 logits
        logits_BTV = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))
        return logits_BTV, hidden_BTD

    def compile_blocks(self) -> int:
        """``torch.compile`` every transformer block of the wrapped model in place, with dynamic
        shapes (one compilation serves every packed or padded layout; the masks and position
        tables are built outside, eagerly). Fuses each block's element-wise work (RMSNorm,
        rotary, SiLU·up, residuals), which dominates at small widths. Returns the number of
        blocks compiled (0 when no ``...layers`` ModuleList is found)."""
        blocks = [module for name, module in self.model.named_modules()
                  if isinstance(module, nn.ModuleList) and name.split(".")[-1] == "layers"]
        compiled = 0
        for layers in blocks[:1]:  # the decoder's own; a PEFT wrapper nests the same list
            for block in layers:
                block.compile(dynamic=True)
                compiled += 1
        return compiled

    # ------------------------------------------------------------------ packed learner

    def output_head(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``(W_VD, bias_V)`` of the plain linear output head that maps a final hidden state
        to the logits, or None when the logits are more than that (a LoRA-wrapped or custom
        head, logit scaling or soft-capping): then only `forward` computes them exactly."""
        head = self.model.get_output_embeddings()  # type: ignore[operator]
        config: Any = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        if type(head) is not nn.Linear or any(
                getattr(text_config, name, None) not in (None, 1.0)
                for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
            return None
        return head.weight, head.bias

    @autocast_outputs
    def final_hidden(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None,
                     position_ids_BT: torch.Tensor | None = None) -> torch.Tensor:
        """The final (post-norm) hidden states ``[B, T, D]`` the output head reads, without
        computing any logits.

        Either a left-padded batch (``attention_mask_BT`` as in `forward`), or with
        ``position_ids_BT`` and no mask a **packed** batch: several sequences concatenated
        along T, each with positions restarting at 0. transformers detects the restarts
        (``masking_utils.find_packed_sequence_indices``) and keeps attention inside each
        sequence: a block-diagonal causal mask for eager/SDPA, varlen kernels for
        flash_attention_2. A packed row therefore computes no padding token.
        """
        self._check_tokens(tokens_BT, "tokens_BT")
        kwargs: dict[str, Any] = {}
        if attention_mask_BT is not None:
            if position_ids_BT is not None:
                raise ValueError("final_hidden takes attention_mask_BT or position_ids_BT, "
                                 "not both")
            self._check_mask(attention_mask_BT, tokens_BT)
            kwargs["attention_mask"] = attention_mask_BT.long()
            kwargs["position_ids"] = position_ids_from_mask(attention_mask_BT)
        elif position_ids_BT is not None:
            if position_ids_BT.shape != tokens_BT.shape:
                raise ValueError(f"position_ids_BT shape {tuple(position_ids_BT.shape)} does "
                                 f"not match tokens_BT shape {tuple(tokens_BT.shape)}")
            kwargs["position_ids"] = position_ids_BT
        out = _decoder(self.model)(input_ids=tokens_BT, use_cache=False, return_dict=True,
                                   **kwargs)
        hidden_BTD: torch.Tensor = out.last_hidden_state
        return hidden_BTD

    # ------------------------------------------------------------------ incremental decoding

    def init_cache(self, batch_size: int, max_len: int) -> HFCache:
        """An empty cache for ``batch_size`` rows of at most ``max_len`` positions in total.

        The model's ``DynamicCache`` grows on demand; ``max_len`` bounds it and sizes the running
        attention mask.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if self.max_len is not None and max_len > self.max_len:
            raise ValueError(
                f"cache of {max_len} positions exceeds max_position_embeddings={self.max_len}"
            )
        device = _model_device(self.model)
        return HFCache(
            kv=_new_dynamic_cache(self.model.config),
            mask_BL=torch.ones(batch_size, max_len, dtype=torch.long, device=device),
            next_pos_B=torch.zeros(batch_size, dtype=torch.long, device=device),
            max_len=max_len,
        )

    @autocast_outputs
    def prefill(
        self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None, cache: HFCache
    ) -> torch.Tensor:
        """Run the (left-padded) prompt into an empty cache; returns the last ``logits_BV``.

        Args:
            tokens_BT: ``[B, T]`` prompt token ids, left-padded.
            attention_mask_BT: ``[B, T]``, 1/True on real tokens, or None when no row is padded.
            cache: a fresh cache from `init_cache` with the same batch size.

        Returns:
            ``[B, V]`` float32 logits of the next token after each prompt.
        """
        self._check_tokens(tokens_BT, "tokens_BT")
        B, T = tokens_BT.shape
        if cache.length != 0:
            raise ValueError(
                f"prefill needs an empty cache; this one holds {cache.length} positions"
            )
        if B != cache.batch_size:
            raise ValueError(
                f"tokens_BT has {B} rows but the cache was built for {cache.batch_size}"
            )
        if T > cache.max_len:
            raise ValueError(f"prompt of {T} tokens exceeds the cache's max_len={cache.max_len}")
        kwargs: dict[str, Any] = {}
        if attention_mask_BT is None:
            pos_BT = torch.arange(T, device=tokens_BT.device).expand(B, T)
            cache.next_pos_B.fill_(T)
        else:
            self._check_mask(attention_mask_BT, tokens_BT)
            mask_BT = attention_mask_BT.long()
            cache.mask_BL[:, :T].copy_(mask_BT)
            cache.padded = True
            pos_BT = position_ids_from_mask(mask_BT)
            cache.next_pos_B.copy_(mask_BT.sum(-1))
            kwargs["attention_mask"] = mask_BT
        if self._keep_kwarg is not None:
            kwargs[self._keep_kwarg] = 1
        kwargs[self._cache_kwarg] = cache.kv
        out = self.model(
            input_ids=tokens_BT, position_ids=pos_BT, use_cache=True, return_dict=True, **kwargs
        )
        cache.length = T
        return out.logits[:, -1].float()

    @autocast_outputs
    def decode_step(self, tokens_B: torch.Tensor, cache: HFCache) -> torch.Tensor:
        """Append one token per row; returns the next-token ``logits_BV`` (float32).

        This method itself never synchronises with the device (its checks read Python ints and
        shapes only). With ``attn_implementation="sdpa"`` and a padded batch, transformers' mask
        builder still calls ``padding_mask.all()``; ``"eager"`` avoids that.
        """
        if tokens_B.dim() != 1:
            raise ValueError(f"tokens_B must be 1-D [B], got shape {tuple(tokens_B.shape)}")
        if tokens_B.shape[0] != cache.batch_size:
            raise ValueError(
                f"tokens_B has {tokens_B.shape[0]} rows but the cache holds {cache.batch_size}"
            )
        if cache.length == 0:
            raise ValueError("decode_step needs a prefilled cache; call prefill first")
        if cache.length >= cache.max_len:
            raise ValueError(f"cache full (max_len={cache.max_len})")
        kwargs: dict[str, Any] = {self._cache_kwarg: cache.kv}
        if cache.padded:
            kwargs["attention_mask"] = cache.mask_BL[:, : cache.length + 1]
        out = self.model(
            input_ids=tokens_B.unsqueeze(1),
            position_ids=cache.next_pos_B.unsqueeze(1),
            use_cache=True,
            return_dict=True,
            **kwargs,
        )
        cache.length += 1
        cache.next_pos_B += 1
        return out.logits[:, -1].float()

    # ------------------------------------------------------------------ validation

    @staticmethod
    def _check_tokens(tokens_BT: torch.Tensor, name: str) -> None:
        if tokens_BT.dim() != 2:
            raise ValueError(f"{name} must be 2-D [B, T], got shape {tuple(tokens_BT.shape)}")
        if tokens_BT.dtype.is_floating_point or tokens_BT.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer token ids, got dtype {tokens_BT.dtype}")
        if tokens_BT.shape[1] == 0:
            raise ValueError(f"{name} must have at least one position")

    @staticmethod
    def _check_mask(attention_mask_BT: torch.Tensor, tokens_BT: torch.Tensor) -> None:
        if attention_mask_BT.shape != tokens_BT.shape:
            raise ValueError(
                f"attention_mask_BT shape {tuple(attention_mask_BT.shape)} does not match "
                f"tokens_BT shape {tuple(tokens_BT.shape)}"
            )
        if attention_mask_BT.dtype.is_floating_point:
            raise ValueError(
                f"attention_mask_BT must be bool or integer, got dtype {attention_mask_BT.dtype}"
            )


def tiny_hf_model(
    arch: str, vocab_size: int, seed: int | None = 0, *, attn_implementation: str = "eager",
    hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, max_len: int = 128,
    intermediate_size: int = 0, num_kv_heads: int = 0,
) -> nn.Module:
    """A small randomly initialised ``transformers`` causal LM (no download), fp32, eval mode.

    Default shape: hidden 64, 2 layers, 4 attention heads, half as many key/value heads (at
    least 1; ``num_kv_heads`` > 0 sets them), MLP width 2·hidden (``intermediate_size`` > 0
    sets it), 128 positions. With an int ``seed`` the global torch RNG is
    left untouched (initialisation runs under a forked RNG); ``seed=None`` draws from the
    global RNG, as the tiny transformer does.

    Args:
        arch: ``"llama"`` or ``"qwen2"``.
        vocab_size: number of token ids.
        seed: initialisation seed.
        attn_implementation: ``"eager"`` (default) or ``"sdpa"``; both make cached decoding agree
            with the full forward to ~1e-7 in fp32. Eager is the default because transformers'
            SDPA mask builder checks ``padding_mask.all()`` on every padded decode step (a host
            sync on GPU, to try SDPA's ``is_causal`` fast path); the eager mask never does.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {TINY_ARCHS}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or (
            max(num_heads // 2, 1) if num_heads % 2 == 0 else num_heads),
        intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if seed is None:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation=attn_implementation)
    return model.float().eval()


def load_hf_model(path: str) -> nn.Module:
    """A pretrained causal LM from a local directory (never the network), fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model.float().eval()


def _forward_params(model: nn.Module) -> set[str]:
    """Keyword names the model's forward accepts, looking through wrappers such as PEFT's."""
    seen: set[int] = set()
    current: Any = model
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        params = inspect.signature(current.forward).parameters
        names = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
        if "input_ids" in names:
            return names
        getter = getattr(current, "get_base_model", None)
        current = getter() if callable(getter) else None
    raise ValueError(f"cannot find a forward(input_ids=...) on {type(model).__name__}")


def _new_dynamic_cache(config: Any) -> Any:
    """An empty ``transformers.DynamicCache``, passing the config where the version takes it."""
    from transformers import DynamicCache

    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=config)
    return DynamicCache()


def _decoder(model: nn.Module) -> Any:
    """The decoder stack of a causal LM (its ``.model``: embeddings, blocks, final norm; no
    output head), looking through a PEFT wrapper (the LoRA layers live inside it)."""
    getter = getattr(model, "get_base_model", None)
    base = getter() if callable(getter) else model
    return base.get_decoder()  # type: ignore[operator]


def _model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter (CPU for a parameter-free module)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
