"""The built-in tiny causal transformer of the sandbox (TASKS.md, "Default sequence model").

Decoder-only, pre-norm, token embedding scaled by sqrt(d_model) plus a learned position
embedding, feed-forward width 4·d_model with ReLU, no dropout, a final LayerNorm and a bias-free
output head. Defaults: d_model 64, 2 heads, 2 layers. TASKS.md names no activation; ReLU costs
a tenth of GELU's time on CPU (docs/performance.md). `TinyConfig.embed_init` picks the reference
sandbox's PyTorch-default initialisation (the default) or the balanced embedding init.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rlscope.policy.base import autocast_outputs, position_ids_from_mask


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the tiny transformer."""

    vocab_size: int = 3
    """Number of token ids (input and output share one vocabulary)."""
    max_len: int = 64
    """Largest sequence length (prompt + completion) the position table covers."""
    d_model: int = 64
    """Residual width."""
    n_heads: int = 2
    """Attention heads (d_model must be divisible by it)."""
    n_layers: int = 2
    """Transformer blocks."""
    embed_init: str = "reference"
    """Initialisation: reference (PyTorch's defaults, as `nn.TransformerEncoderLayer`) or
    balanced (token std d^-1/2, position std 1); see `ModelConfig.embed_init`."""


EMBED_INITS = ("reference", "balanced")


class KVCache:
    """Pre-allocated keys and values for incremental decoding.

    Layout: ``k[layer]`` and ``v[layer]`` are ``[B, H, max_len, head_dim]``; positions
    ``0 .. length-1`` are filled. ``key_valid_BT[:, :length]`` marks real (non-padding) keys and
    ``next_pos_B`` is the position id the next token of each row gets. ``padded`` is False when
    every key is real, which lets attention use the fused causal path with no mask.

    A ``static`` cache serves `TinyTransformer.decode_step_static`, whose shapes never depend on
    a Python int (so a CUDA graph can capture it): attention covers all ``max_len`` positions
    under the additive ``key_bias_BT`` (0 on a real key, −inf where there is none yet), and the
    next write goes to the device index ``pos``. Its keys and values start at zero, because a
    masked key still meets a zero weight and ``0 · NaN`` of uninitialised memory would be NaN.
    """

    def __init__(self, n_layers: int, batch_size: int, n_heads: int, max_len: int,
                 head_dim: int, device: torch.device, dtype: torch.dtype,
                 static: bool = False) -> None:
        shape = (batch_size, n_heads, max_len, head_dim)
        alloc = torch.zeros if static else torch.empty
        self.k = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.key_valid_BT = torch.ones(batch_size, max_len, dtype=torch.bool, device=device)
        self.next_pos_B = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.key_bias_BT = torch.zeros(batch_size, max_len if static else 0, device=device,
                                       dtype=dtype)
        self.length = 0
        self.max_len = max_len
        self.padded = False
        self.static = static


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, embed_init: str = "reference") -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        if embed_init == "reference":
            # `qkv` and `proj` stand for nn.MultiheadAttention's in_proj and out_proj, which
            # initialise differently from a plain Linear: in_proj_weight xavier-uniform over
            # the whole [3·d, d] matrix, zero in_proj_bias and out_proj.bias (out_proj.weight
            # keeps the Linear default). The feed-forward Linears and LayerNorms are the
            # encoder layer's own. Same distributions; the draws come in another order.
            nn.init.xavier_uniform_(self.qkv.weight)
            nn.init.zeros_(self.qkv.bias)
            nn.init.zeros_(self.proj.bias)

    def _qkv(self, x_BTD: torch.Tensor, lin: Callable[[nn.Linear, torch.Tensor], torch.Tensor]
             ) -> torch.Tensor:
        """Queries, keys and values stacked as ``[3, B, H, T, head_dim]``."""
        B, T, D = x_BTD.shape
        H = self.n_heads
        return lin(self.qkv, self.ln1(x_BTD)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)

    def _finish(self, x_BTD: torch.Tensor, y_BHTK: torch.Tensor,
                lin: Callable[[nn.Linear, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Attention output projection and the feed-forward, both residual."""
        B, T, D = x_BTD.shape
        x_BTD = x_BTD + lin(self.proj, y_BHTK.transpose(1, 2).reshape(B, T, D))
        return x_BTD + lin(self.out, F.relu(lin(self.fc, self.ln2(x_BTD))))

    def forward(self, x_BTD: torch.Tensor, layer: int, attn_mask: torch.Tensor | None,
                cache: KVCache | None, static: bool = False) -> torch.Tensor:
        T = x_BTD.shape[1]
        lin = _linear if static else _call
        q, k, v = self._qkv(x_BTD, lin)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               is_causal=attn_mask is None)
        elif static:
            assert attn_mask is not None
            index = cache.pos.view(1)
            cache.k[layer].index_copy_(2, index, k)
            cache.v[layer].index_copy_(2, index, v)
            y = _attend_one(q, cache.k[layer], cache.v[layer], attn_mask)
        else:
            start = cache.length
            cache.k[layer][:, :, start:start + T] = k
            cache.v[layer][:, :, start:start + T] = v
            k_all = cache.k[layer][:, :, :start + T]
            v_all = cache.v[layer][:, :, :start + T]
            if attn_mask is None and T == 1:
                y = F.scaled_dot_product_attention(q, k_all, v_all)
            else:
                y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=attn_mask,
                                                   is_causal=attn_mask is None)
        return self._finish(x_BTD, y, lin)

    def forward_shared_prefix(self, x_GPD: torch.Tensor, x_BCD: torch.Tensor,
                              mask_CL: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One block over G prompts shared by B = G·K continuations (rows of a group
        contiguous): prompts attend causally among themselves; continuation position i attends
        to its group's whole prompt and to continuation positions ≤ i (``mask_CL``)."""
        K = x_BCD.shape[0] // x_GPD.shape[0]
        qp, kp, vp = self._qkv(x_GPD, _call)
        qc, kc, vc = self._qkv(x_BCD, _call)
        y_prompt = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
        k_all = torch.cat([kp.repeat_interleave(K, 0), kc], 2)
        v_all = torch.cat([vp.repeat_interleave(K, 0), vc], 2)
        y_cont = F.scaled_dot_product_attention(qc, k_all, v_all, attn_mask=mask_CL)
        return self._finish(x_GPD, y_prompt, _call), self._finish(x_BCD, y_cont, _call)


class TinyTransformer(nn.Module):
    """The sandbox policy; implements the `Policy` protocol (see `rlscope.policy.base`)."""

    autocast_dtype: torch.dtype | None = None
    """Mixed precision of the forward calls (`rlscope.policy.base.autocast_outputs`)."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} must be divisible by n_heads={cfg.n_heads}")
        if cfg.embed_init not in EMBED_INITS:
            raise ValueError(f"embed_init={cfg.embed_init!r}: use {' or '.join(EMBED_INITS)}")
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.hidden_size = cfg.d_model
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_heads, cfg.embed_init)
                                    for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.scale = math.sqrt(cfg.d_model)
        if cfg.embed_init == "balanced":
            # Token vectors start with std d^-1/2 so that, scaled by sqrt(d), they have unit
            # size like the position vectors (Vaswani et al.): neither signal drowns the other.
            nn.init.normal_(self.tok.weight, std=cfg.d_model ** -0.5)
            nn.init.normal_(self.pos.weight, std=1.0)
        # reference: nn.Embedding's N(0, 1) for both tables (the token signal, scaled by
        # sqrt(d), is sqrt(d) times the position signal), as in the reference sandbox.

    def _embed(self, tokens_BT: torch.Tensor, pos_BT: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens_BT) * self.scale + self.pos(pos_BT)

    def _run(self, x_BTD: torch.Tensor, attn_mask: torch.Tensor | None,
             cache: KVCache | None, static: bool = False) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x_BTD = block(x_BTD, i, attn_mask, cache, static)
        return self.ln_f(x_BTD)

    @autocast_outputs
    def forward(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Full causal forward. Returns ``(logits_BTV, hidden_BTD)``.

        Pass ``attention_mask_BT=None`` when no row is padded: it selects the fused causal path.
        """
        T = tokens_BT.shape[1]
        if T > self.cfg.max_len:
            raise ValueError(f"sequence of {T} tokens exceeds max_len={self.cfg.max_len}")
        if attention_mask_BT is None:
            pos_BT = torch.arange(T, device=tokens_BT.device).expand_as(tokens_BT)
            mask = None
        else:
            pos_BT = position_ids_from_mask(attention_mask_BT)
            mask = _padded_causal_mask(attention_mask_BT.bool(), T)
        hidden_BTD = self._run(self._embed(tokens_BT, pos_BT), mask, None)
        return self.head(hidden_BTD), hidden_BTD

    @autocast_outputs
    def forward_shared_prefix(self, prompt_GP: torch.Tensor, continuation_BC: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` of ``[prompt_g, continuation_b]`` for B = G·K rows whose group g = b // K
        shares one unpadded prompt, computing each prompt once instead of K times.

        Returns ``(logits_BTV, hidden_BTD)`` at the positions that predict the continuation
        and the token after it: the prompt's last position, then every continuation position
        (T = C + 1). Equal to slicing `forward`'s output at ``P - 1 ..``, up to rounding; the
        learner's grouped rollouts spend about half their tokens on repeated prompts.
        """
        (G, P), (B, C) = prompt_GP.shape, continuation_BC.shape
        if B % G:
            raise ValueError(f"{B} continuations do not split into {G} equal groups")
        if P + C > self.cfg.max_len:
            raise ValueError(f"sequence of {P + C} tokens exceeds max_len={self.cfg.max_len}")
        device = prompt_GP.device
        x_GPD = self._embed(prompt_GP, torch.arange(P, device=device).expand(G, P))
        x_BCD = self._embed(continuation_BC, torch.arange(P, P + C, device=device).expand(B, C))
        mask_CL = torch.ones(C, P + C, dtype=torch.bool, device=device)
        mask_CL[:, P:] = torch.ones(C, C, dtype=torch.bool, device=device).tril()
        for block in self.blocks:
            assert isinstance(block, Block)
            x_GPD, x_BCD = block.forward_shared_prefix(x_GPD, x_BCD, mask_CL)
        last_BD = self.ln_f(x_GPD[:, -1]).repeat_interleave(B // G, 0)
        hidden_BTD = torch.cat([last_BD[:, None], self.ln_f(x_BCD)], 1)
        return self.head(hidden_BTD), hidden_BTD

    def init_cache(self, batch_size: int, max_len: int, static: bool = False) -> KVCache:
        """An empty cache; ``static`` makes one for `decode_step_static` (see `KVCache`)."""
        if max_len > self.cfg.max_len:
            raise ValueError(f"cache of {max_len} positions exceeds max_len={self.cfg.max_len}")
        p = self.head.weight
        return KVCache(self.cfg.n_layers, batch_size, self.cfg.n_heads, max_len,
                       self.cfg.d_model // self.cfg.n_heads, p.device, p.dtype, static)

    @autocast_outputs
    def prefill(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None,
                cache: KVCache) -> torch.Tensor:
        """Run the prompt into an empty cache; returns the last position's ``logits_BV``."""
        B, T = tokens_BT.shape
        if cache.length:
            raise ValueError(f"prefill needs an empty cache; it holds {cache.length} positions")
        if T > cache.max_len:
            raise ValueError(f"prompt of {T} tokens exceeds the cache's max_len={cache.max_len}")
        if B != cache.next_pos_B.shape[0]:
            raise ValueError(f"tokens_BT has {B} rows but the cache has "
                             f"{cache.next_pos_B.shape[0]}")
        if attention_mask_BT is None:
            pos_BT = torch.arange(T, device=tokens_BT.device).expand(B, T)
            mask = None
            cache.next_pos_B.fill_(T)
        else:
            valid_BT = attention_mask_BT.bool()
            pos_BT = position_ids_from_mask(valid_BT)
            mask = _padded_causal_mask(valid_BT, T)
            cache.key_valid_BT[:, :T] = valid_BT
            cache.padded = True
            cache.next_pos_B.copy_(valid_BT.sum(-1))
        if cache.static:
            # static decoding attends over every position: only real prompt keys count so far
            cache.key_bias_BT.fill_(float("-inf"))
            if attention_mask_BT is None:
                cache.key_bias_BT[:, :T] = 0.0
            else:
                cache.key_bias_BT[:, :T].masked_fill_(attention_mask_BT.bool(), 0.0)
            cache.pos.fill_(T)
        hidden_BTD = self._run(self._embed(tokens_BT, pos_BT), mask, cache)
        cache.length = T
        return self.head(hidden_BTD[:, -1])

    @autocast_outputs
    def decode_step(self, tokens_B: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append one token per row; returns the next-token ``logits_BV``."""
        if cache.length >= cache.max_len:
            raise ValueError(f"KV cache full (max_len={cache.max_len})")
        pos_B1 = cache.next_pos_B.unsqueeze(1)
        mask = None
        if cache.padded:
            mask = cache.key_valid_BT[:, None, None, :cache.length + 1]
        hidden_B1D = self._run(self._embed(tokens_B.unsqueeze(1), pos_B1), mask, cache)
        cache.length += 1
        cache.next_pos_B += 1
        return self.head(hidden_B1D[:, 0])

    @autocast_outputs
    def decode_step_static(self, tokens_B: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """`decode_step` on a static cache: same logits, no host-side state or sync.

        Writes at ``cache.pos`` and attends over all ``max_len`` positions under
        ``key_bias_BT``, so a CUDA graph can capture it and replay it at every position. The
        caller keeps ``cache.pos < max_len`` (nothing here reads the device to check it).
        """
        if not cache.static:
            raise ValueError("decode_step_static needs a cache from init_cache(static=True)")
        cache.key_bias_BT.index_fill_(1, cache.pos.view(1), 0.0)
        bias_B11L = cache.key_bias_BT[:, None, None, :]
        x_B1D = self._embed(tokens_B.unsqueeze(1), cache.next_pos_B.unsqueeze(1))
        hidden_B1D = self._run(x_B1D, bias_B11L, cache, static=True)
        cache.pos += 1
        cache.next_pos_B += 1
        return _linear(self.head, hidden_B1D[:, 0])


def _call(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` as a product and then the bias. For the few rows of a decode step cuBLASLt's
    fused-bias kernel on the transposed weight takes a split-K path ~3x slower (H200)."""
    y = x @ layer.weight.t()
    return y if layer.bias is None else y + layer.bias


def _attend_one(q_BH1K: torch.Tensor, k_BHLK: torch.Tensor, v_BHLK: torch.Tensor,
                bias_B11L: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√K + bias)·v for one query per row: four plain kernels, ~2.5x faster at
    decode sizes than the fused attention kernel SDPA picks (H200)."""
    scores_BH1L = torch.add(bias_B11L, q_BH1K @ k_BHLK.transpose(-1, -2),
                            alpha=q_BH1K.shape[-1] ** -0.5)
    return scores_BH1L.softmax(-1) @ v_BHLK


def _padded_causal_mask(valid_BT: torch.Tensor, T: int) -> torch.Tensor:
    """Boolean ``[B, 1, T, T]`` mask: causal, real keys only; a padding query sees itself."""
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=valid_BT.device).tril()
    eye_TT = torch.eye(T, dtype=torch.bool, device=valid_BT.device)
    return (causal_TT & valid_BT[:, None, :] | eye_TT)[:, None]
