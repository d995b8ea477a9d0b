"""What the engine holds: training clients, sampler snapshots, and how models are built.

- `build_policy` turns a model spec into an `rlscope.policy.hf.HFPolicy`: ``tiny-llama`` /
  ``tiny-qwen2`` (built from a config with the server's seed, so the same base every time,
  with the byte-level tokenizer) or a local Hugging Face directory; LoRA goes in through PEFT
  with the requested rank on the requested groups (attention q/k/v/o, MLP gate/up/down, the
  unembedding ``lm_head``); rank 0 trains every weight.
- `Weights` is an immutable sampler snapshot; `TrainingModel` one training client;
  `StepStats` what a client did since its last ``optim_step``, turned into one row of its run
  directory's ``metrics.jsonl`` (names of `rlscope.metrics.schema`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlscope.metrics.sinks import JsonlWriter
from rlscope.policy.hf import HFPolicy, load_hf_model, tiny_hf_model
from rlscope.serve.config import ServeConfig
from rlscope.serve.tokenizer_dir import TINY_TOKENS, TextCodec, byte_codec, hf_codec

TINY_SPECS = {"tiny-llama": "llama", "tiny-qwen2": "qwen2", "tiny-qwen2-chat": "qwen2"}
LORA_GROUPS = {
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "unembed": ("lm_head",),
}
RATIO_BAND = (0.9, 1.1)
"""Importance ratios outside this band count in ``sampler/frac_outside_band``."""


class UserError(ValueError):
    """Bad input from the client: reported with category ``user``."""


@dataclass(frozen=True)
class LoraSettings:
    """The adapter a training client asked for (rank 0 = full fine-tuning)."""

    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None

    def targets(self) -> list[str]:
        """Module-name suffixes that get adapters."""
        groups = [g for g, on in (("attn", self.train_attn), ("mlp", self.train_mlp),
                                  ("unembed", self.train_unembed)) if on]
        return [name for g in groups for name in LORA_GROUPS[g]]

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "train_attn": self.train_attn, "train_mlp": self.train_mlp,
                "train_unembed": self.train_unembed, "seed": self.seed}


_BUILD_LOCK = threading.Lock()
"""Serialises model construction, so the forked global RNG is restored by the same thread
that saved it (builds run on the worker and on the app's thread pool at the same time)."""


def _init_base(model: torch.nn.Module, gen: torch.Generator, std: float) -> None:
    """Re-initialise every parameter of a randomly initialised model from ``gen`` (as
    transformers' ``_init_weights`` does: normal(0, std) matrices and embeddings, zero
    biases, unit norm weights), in parameter-name order, so the weights depend on the seed
    only, never on the global RNG or on what other threads draw."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".bias"):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)


def _init_lora(model: torch.nn.Module, gen: torch.Generator) -> None:
    """PEFT's default adapter init from ``gen``: A kaiming-uniform (a = √5), B zero."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".lora_A." in name:
                torch.nn.init.kaiming_uniform_(p, a=math.sqrt(5), generator=gen)
            elif ".lora_B." in name:
                p.zero_()


def build_policy(cfg: ServeConfig, device: torch.device, spec: str,
                 lora: LoraSettings | None) -> tuple[HFPolicy, TextCodec]:
    """The policy of ``spec`` (with LoRA adapters when ``lora.rank > 0``) and its codec.

    Deterministic and thread-safe: a tiny model's weights come from a private
    ``torch.Generator`` seeded with ``--seed`` and the adapter's from one seeded with the
    LoRA seed (``--seed`` when the client gives none), so the same spec always gives the same
    base (a checkpoint, which stores only the trainable tensors, restores bit-identically)
    whatever other builds run concurrently; torch's global RNG is left as it was.
    """
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        if spec in TINY_SPECS:
            model = tiny_hf_model(TINY_SPECS[spec], TINY_TOKENS[spec].vocab_size, seed=None,
                                  hidden_size=cfg.tiny_d_model, num_layers=cfg.tiny_layers,
                                  num_heads=cfg.tiny_heads, max_len=cfg.tiny_max_len)
            _init_base(model, torch.Generator().manual_seed(cfg.seed),
                       float(getattr(model.config, "initializer_range", 0.02)))
            codec = byte_codec(spec)
        else:
            model = load_hf_model(spec)
            codec = hf_codec(spec)
        if lora is not None and lora.rank > 0:
            from peft import LoraConfig, get_peft_model

            present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
            targets = [t for t in lora.targets() if t in present]
            if not targets:
                raise UserError("LoRA needs at least one of train_attn, train_mlp, "
                                "train_unembed on a module this model has")
            config = LoraConfig(r=lora.rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                target_modules=targets)
            model = get_peft_model(model, config)
            seed = cfg.seed if lora.seed is None else lora.seed
            _init_lora(model, torch.Generator().manual_seed(seed))
    policy = HFPolicy(model).to(device)
    policy.eval()  # no dropout anywhere: sampler and learner compute the same numbers
    return policy, codec


@dataclass
class StepStats:
    """What a training client did since its last ``optim_step``."""

    loss_sum: float = 0.0
    learn_tokens: int = 0
    learn_s: float = 0.0
    diff_sum: float = 0.0
    diff_max: float = 0.0
    k1_sum: float = 0.0
    ratio_sum: float = 0.0
    outside: int = 0
    scored: int = 0
    sample_s: float = 0.0
    sampled_tokens: int = 0
    sequences: int = 0
    length_capped: int = 0

    def add_forward_backward(self, sampler_logprobs: Sequence[np.ndarray | None],
                             learner_logprobs: Sequence[np.ndarray], n_tokens: int,
                             loss: float, seconds: float) -> None:
        """One ``forward_backward``: its loss and, per datum with sampler log-probs, the
        sampler/learner mismatch on the scored tokens (sampler log-prob ≠ 0; the cookbook
        fills prompt positions with 0)."""
        self.loss_sum += loss
        self.learn_tokens += n_tokens
        self.learn_s += seconds
        for sampler, learner in zip(sampler_logprobs, learner_logprobs, strict=True):
            if sampler is None:
                continue
            scored = sampler != 0
            if not scored.any():
                continue
            diff = learner.astype(np.float64)[scored] - sampler.astype(np.float64)[scored]
            ratio = np.exp(diff)
            self.diff_sum += float(np.abs(diff).sum())
            self.diff_max = max(self.diff_max, float(np.abs(diff).max()))
            self.k1_sum += float(-diff.sum())
            self.ratio_sum += float(ratio.sum())
            self.outside += int(((ratio < RATIO_BAND[0]) | (ratio > RATIO_BAND[1])).sum())
            self.scored += int(scored.sum())

    def add_samples(self, lengths: Sequence[int], capped: int, seconds: float) -> None:
        """Sequences sampled from one of this client's snapshots (``capped``: how many ended
        at max_tokens)."""
        self.sample_s += seconds
        self.sampled_tokens += sum(lengths)
        self.sequences += len(lengths)
        self.length_capped += capped

    def row(self, step: int, grad_norm: float, clip: float, lr: float, optim_s: float,
            step_s: float) -> dict[str, float | int]:
        """The ``metrics.jsonl`` row of the ``optim_step`` that closes this period."""
        learn_s = self.learn_s + optim_s
        row: dict[str, float | int] = {
            "step": step,
            "loss/total": self.loss_sum,
            "optim/grad_norm": grad_norm,
            "optim/grad_norm_clipped": min(grad_norm, clip) if clip > 0 else grad_norm,
            "optim/clip_active": float(clip > 0 and grad_norm > clip),
            "optim/lr": lr,
            "time/learn": learn_s,
            "time/step": step_s,
        }
        if learn_s > 0 and self.learn_tokens:
            row["throughput/learn_tokens_per_s"] = self.learn_tokens / learn_s
        if self.scored:
            row |= {
                "sampler/logp_diff_mean": self.diff_sum / self.scored,
                "sampler/logp_diff_max": self.diff_max,
                "sampler/frac_outside_band": self.outside / self.scored,
                "policy/kl_behaviour_k1": self.k1_sum / self.scored,
                "policy/ratio_mean": self.ratio_sum / self.scored,
            }
        if self.sequences:
            row |= {"time/sample": self.sample_s,
                    "length/mean": self.sampled_tokens / self.sequences,
                    "length/clip_ratio": self.length_capped / self.sequences}
            if self.sample_s > 0:
                row["throughput/sample_tokens_per_s"] = self.sampled_tokens / self.sample_s
        return row


@dataclass
class TrainingModel:
    """One training client: its policy, optimizer, run directory and bookkeeping."""

    model_id: str
    base_model: str
    spec: str
    policy: HFPolicy
    codec: TextCodec
    lora: LoraSettings
    optimizer: torch.optim.AdamW
    run_dir: Path
    user_metadata: dict[str, str]
    metrics_log: JsonlWriter
    step: int = 0
    last_request: float = field(default_factory=time.time)
    last_step_wall: float = field(default_factory=time.perf_counter)
    last_checkpoint: dict[str, Any] | None = None
    last_sampler_checkpoint: dict[str, Any] | None = None
    ephemeral: list[str] = field(default_factory=list)
    stats: StepStats = field(default_factory=StepStats)
    finished: bool = False
    """Its session finished: ``status.json`` says so from then on."""

    def trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.policy.named_parameters() if p.requires_grad]


@dataclass
class Weights:
    """An immutable sampler snapshot: the policy it runs on and the trainable tensors to load
    into it for sampling (None: the policy's own weights, for base models and snapshots loaded
    from disk). ``owner`` is the training client whose snapshot it is."""

    policy: HFPolicy
    params: dict[str, torch.Tensor] | None
    base_model: str
    codec: TextCodec
    model_path: str | None = None
    owner: TrainingModel | None = None


class LoadedWeights:
    """Context manager: ``weights.params`` loaded into its policy, the live values restored on
    exit (safe because one worker thread runs every model operation)."""

    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.saved: dict[str, torch.Tensor] = {}

    def __enter__(self) -> HFPolicy:
        params = self.weights.params
        if params is not None:
            with torch.no_grad():
                for n, p in self.weights.policy.named_parameters():
                    if n in params:
                        self.saved[n] = p.detach().clone()
                        p.copy_(params[n])
        return self.weights.policy

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for n, p in self.weights.policy.named_parameters():
                if n in self.saved:
                    p.copy_(self.saved[n])
        self.saved = {}
