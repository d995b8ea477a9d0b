"""The server's engine: base models, training clients, sampler snapshots and checkpoints.

- **Models.** A base-model name resolves through the alias table of ``--models`` (or a
  directory written by ``--write_tokenizer``, or a local Hugging Face model directory) to a
  spec: ``tiny-llama`` / ``tiny-qwen2`` (built from a config with a fixed seed, byte-level
  tokenizer) or a model path. Every model is an `rlscope.policy.hf.HFPolicy`.
- **Training clients.** ``create_model`` builds the base, injects LoRA through PEFT with the
  requested rank on the requested groups (attention q/k/v/o, MLP gate/up/down, the unembedding)
  — rank 0 trains every weight — and an AdamW optimizer whose hyper-parameters each
  ``optim_step`` sets. The model id is ``{session_id}:train:{model_seq_id}`` and is also the
  training-run id of its checkpoints.
- **Snapshots.** ``save_weights_for_sampler`` clones the trainable tensors at that ``seq_id``;
  sampling with a snapshot loads them into the policy for the batch and restores the live
  weights after, so a snapshot never changes (the engine's single worker thread runs one job
  at a time, which makes the swap safe).
- **Checkpoints.** ``tinker://<run>/weights/<name>`` is ``ROOT/<run>/checkpoints/weights/
  <name>/`` (``:`` in the run id becomes ``_``): ``meta.json``, ``trainable.pt``, the
  optimizer state for ``weights``, and the adapter in PEFT format under ``adapter/``.
- **Run directories.** Each training client writes ``ROOT/<run>/metrics.jsonl`` (one record
  per ``optim_step``, in the `rlscope.metrics.schema` names), ``config.json`` and
  ``status.json``, so ``rlscope doctor ROOT/<run>`` reads it.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlscope.metrics.sinks import JsonlWriter
from rlscope.policy.hf import HFPolicy, load_hf_model, tiny_hf_model
from rlscope.sampling.sampler import SamplingConfig
from rlscope.serve.config import ServeConfig
from rlscope.serve.losses import check_loss_request, tinker_loss
from rlscope.serve.sampling import SampledRow, SampleRow, prompt_logprobs, sample_rows
from rlscope.serve.tokenizer_dir import (
    VOCAB_SIZE,
    TextCodec,
    byte_codec,
    hf_codec,
    marker_spec,
    write_tokenizer_dir,
)
from rlscope.serve.wire import WireForwardBackward, encode_forward_backward_output

log = logging.getLogger("rlscope.serve")

TINY_SPECS = {"tiny-llama": "llama", "tiny-qwen2": "qwen2"}
LORA_GROUPS = {
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "unembed": ("lm_head",),
}
MAX_EPHEMERAL_SNAPSHOTS = 64
"""Ephemeral sampler snapshots kept per training client (older ones are dropped)."""


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
        groups = [g for g, on in (("attn", self.train_attn), ("mlp", self.train_mlp),
                                  ("unembed", self.train_unembed)) if on]
        return [name for g in groups for name in LORA_GROUPS[g]]


@dataclass
class Weights:
    """An immutable sampler snapshot: the policy it runs on and the trainable tensors to load
    (None: the policy's own weights, for base models and snapshots loaded from disk)."""

    policy: HFPolicy
    params: dict[str, torch.Tensor] | None
    base_model: str
    codec: TextCodec
    model_path: str | None = None
    owner: TrainingModel | None = None


@dataclass
class _Accum:
    """What a training client saw since its last optim_step (turned into one metrics row)."""

    loss_sum: float = 0.0
    learn_tokens: int = 0
    learn_s: float = 0.0
    fwdbwd_calls: int = 0
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


@dataclass
class TrainingModel:
    """One training client: its policy, optimizer and run directory."""

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
    created: float = field(default_factory=time.time)
    last_request: float = field(default_factory=time.time)
    last_step_wall: float = field(default_factory=time.perf_counter)
    last_checkpoint: dict[str, Any] | None = None
    last_sampler_checkpoint: dict[str, Any] | None = None
    ephemeral: list[str] = field(default_factory=list)
    acc: _Accum = field(default_factory=_Accum)

    def trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.policy.named_parameters() if p.requires_grad]


def run_key(run_id: str) -> str:
    """The directory name of a training run id (``:`` and ``/`` are not path-safe)."""
    return run_id.replace(":", "_").replace("/", "_")


def parse_tinker_path(path: str) -> tuple[str, str, str]:
    """``tinker://<run>/<weights|sampler_weights>/<name>`` → (run, kind, name)."""
    if not path.startswith("tinker://"):
        raise UserError(f"checkpoint path {path!r} must start with tinker://")
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or not parts[2]:
        raise UserError(f"checkpoint path {path!r} must read "
                        "tinker://<run>/weights|sampler_weights/<name>")
    return parts[0], parts[1], parts[2]


def _checkpoint_name(name: str) -> str:
    if not name or "/" in name or name.startswith(".") or "\\" in name:
        raise UserError(f"checkpoint name {name!r} must be non-empty with no '/' or leading '.'")
    return name


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


class Engine:
    """Every model operation of the server. Mutating calls run on one worker thread, in the
    order the app dispatches them; the lookups the app answers directly take ``lock``."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.root = Path(cfg.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available()
                                   else "cpu" if cfg.device == "auto" else cfg.device)
        self.aliases: dict[str, str] = dict(e.split("=", 1) for e in cfg.models)
        self.lock = threading.RLock()
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, Weights] = {}
        self.named_samplers: dict[str, Weights] = {}
        self.base_policies: dict[str, tuple[HFPolicy, TextCodec]] = {}
        self._sampler_counter = 0
        self._rng = np.random.default_rng(cfg.seed)
        if cfg.write_tokenizer:
            write_tokenizer_dir(cfg.write_tokenizer)

    # ------------------------------------------------------------------ models

    def resolve(self, base_model: str) -> str:
        """The spec of a base-model name; raises UserError for an unknown one."""
        if base_model in self.aliases:
            return self.aliases[base_model]
        spec = marker_spec(base_model)
        if spec is not None:
            return spec
        if Path(base_model, "config.json").is_file():
            return base_model
        raise UserError(f"unknown base_model {base_model!r}; this server knows "
                        f"{sorted(self.aliases)} (add NAME=SPEC to --models), directories "
                        "written by --write_tokenizer, and local Hugging Face model dirs")

    def capabilities(self) -> list[dict[str, Any]]:
        return [{"model_name": name, "trainable": True, "sampleable": True}
                for name in self.aliases]

    def _build(self, spec: str, lora: LoraSettings | None) -> tuple[HFPolicy, TextCodec]:
        c = self.cfg
        if spec in TINY_SPECS:
            model = tiny_hf_model(TINY_SPECS[spec], VOCAB_SIZE, seed=c.seed,
                                  hidden_size=c.tiny_d_model, num_layers=c.tiny_layers,
                                  num_heads=c.tiny_heads, max_len=c.tiny_max_len)
            codec = byte_codec()
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
            config = LoraConfig(r=lora.rank, lora_alpha=self.cfg.lora_alpha,
                                lora_dropout=0.0, target_modules=targets)
            if lora.seed is None:
                model = get_peft_model(model, config)
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(lora.seed)
                    model = get_peft_model(model, config)
        policy = HFPolicy(model).to(self.device)
        policy.eval()
        return policy, codec

    def _new_training_model(self, model_id: str, base_model: str, lora: LoraSettings,
                            user_metadata: dict[str, str]) -> TrainingModel:
        spec = self.resolve(base_model)
        policy, codec = self._build(spec, lora)
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                      weight_decay=0.0)
        run_dir = self.root / run_key(model_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        model = TrainingModel(
            model_id=model_id, base_model=base_model, spec=spec, policy=policy, codec=codec,
            lora=lora, optimizer=optimizer, run_dir=run_dir, user_metadata=user_metadata,
            metrics_log=JsonlWriter(run_dir / "metrics.jsonl", append=False))
        (run_dir / "config.json").write_text(json.dumps({
            "source": "rlscope serve", "model_id": model_id, "base_model": base_model,
            "spec": spec, "lora_rank": lora.rank, "lora_alpha": self.cfg.lora_alpha,
            "lora_targets": lora.targets() if lora.rank > 0 else "all weights",
            "trainable_params": sum(p.numel() for p in params),
            "device": str(self.device), "user_metadata": user_metadata,
        }, indent=2) + "\n")
        self._write_status(model, "running")
        with self.lock:
            self.models[model_id] = model
        self._write_run_json(model)
        return model

    def model(self, model_id: str) -> TrainingModel:
        with self.lock:
            model = self.models.get(model_id)
        if model is None:
            raise UserError(f"unknown model_id {model_id!r}")
        model.last_request = time.time()
        return model

    def create_model(self, session_id: str, model_seq_id: int, base_model: str,
                     lora_config: dict[str, Any], user_metadata: dict[str, str] | None
                     ) -> dict[str, Any]:
        model_id = f"{session_id}:train:{model_seq_id}"
        rank = int(lora_config.get("rank", 32))
        if rank < 0:
            raise UserError(f"lora rank must be >= 0, got {rank}")
        lora = LoraSettings(rank=rank, train_attn=bool(lora_config.get("train_attn", True)),
                            train_mlp=bool(lora_config.get("train_mlp", True)),
                            train_unembed=bool(lora_config.get("train_unembed", True)),
                            seed=lora_config.get("seed"))
        self._new_training_model(model_id, base_model, lora, user_metadata or {})
        log.info("created %s on %s (LoRA rank %d)", model_id, base_model, rank)
        return {"model_id": model_id, "type": "create_model"}

    def get_info(self, model_id: str) -> dict[str, Any]:
        model = self.model(model_id)
        arch = type(model.policy.unwrap()).__name__
        return {
            "type": "get_info", "model_id": model_id,
            "model_data": {"arch": arch, "model_name": model.base_model,
                           "tokenizer_id": model.base_model},
            "optimizer_config": {"type": "adamw"},
            "is_lora": model.lora.rank > 0,
            "lora_rank": model.lora.rank if model.lora.rank > 0 else None,
            "model_name": model.base_model,
        }

    # ------------------------------------------------------------------ training

    def forward_backward(self, req: WireForwardBackward) -> bytes:
        """Run a ``forward_backward`` (or, with ``forward_only``, a ``forward``) request;
        returns the protobuf ``ForwardBackwardOutput``."""
        model = self.model(req.model_id)
        if not req.data:
            raise UserError("forward_backward needs at least one datum")
        names = set.intersection(*(set(d.inputs) for d in req.data))
        try:
            config = check_loss_request(req.loss_fn, req.loss_fn_config, names)
        except ValueError as e:
            raise UserError(str(e)) from e
        vocab = model.policy.vocab_size
        for i, d in enumerate(req.data):
            n = len(d.tokens)
            if n == 0:
                raise UserError(f"datum {i} has an empty model_input")
            for name, arr in d.inputs.items():
                if arr.size != n:
                    raise UserError(f"datum {i}: loss_fn_inputs[{name!r}] has {arr.size} "
                                    f"entries but model_input has {n} tokens (they must match:"
                                    " position i predicts target_tokens[i])")
            if min(d.tokens) < 0 or max(d.tokens) >= vocab:
                raise UserError(f"datum {i}: model_input token ids must lie in 0..{vocab - 1}")
            targets = d.inputs["target_tokens"]
            if targets.min() < 0 or targets.max() >= vocab:
                raise UserError(f"datum {i}: target_tokens must lie in 0..{vocab - 1}")
        t0 = time.perf_counter()
        logprobs: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(req.data)
        loss_total = 0.0
        for batch in self._microbatches(req):
            loss_total += self._run_microbatch(model, req, batch, config, logprobs)
        if not req.forward_only:
            self._account_fwdbwd(model, req, logprobs, loss_total, time.perf_counter() - t0)
        outputs = [{"logprobs": lp} for lp in logprobs]
        return encode_forward_backward_output(outputs, {"loss:sum": loss_total})

    def _microbatches(self, req: WireForwardBackward) -> list[list[int]]:
        budget = self.cfg.max_tokens_per_microbatch
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i, d in enumerate(req.data):
            longest_if = max(longest, len(d.tokens))
            if current and longest_if * (len(current) + 1) > budget:
                batches.append(current)
                current, longest_if = [], len(d.tokens)
            current.append(i)
            longest = longest_if
        if current:
            batches.append(current)
        return batches

    def _run_microbatch(self, model: TrainingModel, req: WireForwardBackward,
                        batch: list[int], config: dict[str, float],
                        logprobs: list[np.ndarray]) -> float:
        data = [req.data[i] for i in batch]
        lengths = [len(d.tokens) for d in data]
        T = max(lengths)
        tokens_BT = torch.zeros(len(data), T, dtype=torch.long)
        targets_BT = torch.zeros(len(data), T, dtype=torch.long)
        mask_BT = torch.zeros(len(data), T, dtype=torch.long)
        for b, d in enumerate(data):
            tokens_BT[b, :lengths[b]] = torch.tensor(d.tokens)
            targets_BT[b, :lengths[b]] = torch.from_numpy(d.inputs["target_tokens"].copy())
            mask_BT[b, :lengths[b]] = 1
        dev = self.device
        tokens_BT, targets_BT, mask_BT = tokens_BT.to(dev), targets_BT.to(dev), mask_BT.to(dev)
        valid_BT = mask_BT.bool()
        padded = not bool(valid_BT.all())
        inputs_N: dict[str, torch.Tensor] = {name: torch.from_numpy(np.concatenate(
            [d.inputs[name].astype(np.float32) for d in data])).to(dev)
            for name in ("weights", "logprobs", "advantages") if name in data[0].inputs}
        with torch.set_grad_enabled(not req.forward_only):
            logits_BTV = model.policy(tokens_BT, mask_BT if padded else None)[0]
            logp_BT = logits_BTV.log_softmax(-1).gather(-1, targets_BT[..., None])[..., 0]
            logp_N = logp_BT[valid_BT]  # row-major: datum by datum, matching inputs_N
            loss, _ = tinker_loss(req.loss_fn, logp_N, inputs_N, config)
            if not req.forward_only:
                loss.backward()
        logp_cpu = logp_N.detach().float().cpu().numpy()
        offsets = np.cumsum([0, *lengths])
        for k, i in enumerate(batch):
            logprobs[i] = logp_cpu[offsets[k]:offsets[k + 1]].astype(np.float32)
        return float(loss.detach())

    def _account_fwdbwd(self, model: TrainingModel, req: WireForwardBackward,
                        logprobs: list[np.ndarray], loss_total: float, seconds: float) -> None:
        acc = model.acc
        acc.loss_sum += loss_total
        acc.learn_tokens += sum(len(d.tokens) for d in req.data)
        acc.learn_s += seconds
        acc.fwdbwd_calls += 1
        if "logprobs" not in req.data[0].inputs:
            return
        for d, lp in zip(req.data, logprobs, strict=True):
            sampler = d.inputs["logprobs"].astype(np.float64)
            scored = sampler != 0  # the cookbook fills prompt positions with 0
            if not scored.any():
                continue
            diff = lp.astype(np.float64)[scored] - sampler[scored]
            ratio = np.exp(diff)
            acc.diff_sum += float(np.abs(diff).sum())
            acc.diff_max = max(acc.diff_max, float(np.abs(diff).max()))
            acc.k1_sum += float(-diff.sum())
            acc.ratio_sum += float(ratio.sum())
            acc.outside += int(((ratio < 0.9) | (ratio > 1.1)).sum())
            acc.scored += int(scored.sum())

    def optim_step(self, model_id: str, adam: dict[str, Any]) -> dict[str, Any]:
        """One AdamW step with the client's hyper-parameters, then zero the gradients."""
        model = self.model(model_id)
        lr = float(adam.get("learning_rate", 1e-4))
        beta1, beta2 = float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95))
        eps = float(adam.get("eps", 1e-12))
        wd = float(adam.get("weight_decay", 0.0))
        clip = float(adam.get("grad_clip_norm", 0.0))
        if lr < 0 or not 0 <= beta1 < 1 or not 0 <= beta2 < 1 or eps < 0 or wd < 0 or clip < 0:
            raise UserError(f"invalid adam_params {adam}")
        t0 = time.perf_counter()
        params = [p for _, p in model.trainable()]
        grads = [p.grad for p in params if p.grad is not None]
        grad_norm = float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if clip > 0 and grads:
            torch.nn.utils.clip_grad_norm_(params, clip)
        clipped = min(grad_norm, clip) if clip > 0 else grad_norm
        for group in model.optimizer.param_groups:
            group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
        model.optimizer.step()
        model.optimizer.zero_grad(set_to_none=True)
        learn_s = time.perf_counter() - t0
        self._log_step(model, grad_norm, clipped, clip, lr, learn_s)
        return {"metrics": {"rlscope/grad_norm": grad_norm,
                            "rlscope/grad_norm_clipped": clipped, "rlscope/lr": lr}}

    def _log_step(self, model: TrainingModel, grad_norm: float, clipped: float, clip: float,
                  lr: float, step_learn_s: float) -> None:
        acc = model.acc
        now = time.perf_counter()
        model.step += 1
        learn_s = acc.learn_s + step_learn_s
        record: dict[str, float | int] = {
            "step": model.step,
            "loss/total": acc.loss_sum,
            "optim/grad_norm": grad_norm,
            "optim/grad_norm_clipped": clipped,
            "optim/clip_active": float(clip > 0 and grad_norm > clip),
            "optim/lr": lr,
            "time/learn": learn_s,
            "time/step": now - model.last_step_wall,
        }
        if learn_s > 0 and acc.learn_tokens:
            record["throughput/learn_tokens_per_s"] = acc.learn_tokens / learn_s
        if acc.scored:
            record |= {
                "sampler/logp_diff_mean": acc.diff_sum / acc.scored,
                "sampler/logp_diff_max": acc.diff_max,
                "sampler/frac_outside_band": acc.outside / acc.scored,
                "policy/kl_behaviour_k1": acc.k1_sum / acc.scored,
                "policy/ratio_mean": acc.ratio_sum / acc.scored,
            }
        if acc.sequences:
            record |= {
                "time/sample": acc.sample_s,
                "length/mean": acc.sampled_tokens / acc.sequences,
                "length/clip_ratio": acc.length_capped / acc.sequences,
            }
            if acc.sample_s > 0:
                record["throughput/sample_tokens_per_s"] = acc.sampled_tokens / acc.sample_s
        model.metrics_log.write(record)
        model.acc = _Accum()
        model.last_step_wall = now
        self._write_status(model, "running")

    def _write_status(self, model: TrainingModel, status: str) -> None:
        (model.run_dir / "status.json").write_text(json.dumps(
            {"status": status, "steps": model.step, "model_id": model.model_id}) + "\n")

    # ------------------------------------------------------------------ snapshots, sampling

    def _snapshot(self, model: TrainingModel) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in model.trainable()}

    def _new_sampler_id(self, prefix: str) -> str:
        with self.lock:
            self._sampler_counter += 1
            return f"{prefix}:sample:{self._sampler_counter}"

    def save_weights_for_sampler(self, model_id: str, name: str | None) -> dict[str, Any]:
        model = self.model(model_id)
        weights = Weights(policy=model.policy, params=self._snapshot(model),
                          base_model=model.base_model, codec=model.codec, owner=model)
        if name is None:
            sampler_id = self._new_sampler_id(model_id)
            with self.lock:
                self.samplers[sampler_id] = weights
                model.ephemeral.append(sampler_id)
                while len(model.ephemeral) > MAX_EPHEMERAL_SNAPSHOTS:
                    self.samplers.pop(model.ephemeral.pop(0), None)
            return {"type": "save_weights_for_sampler", "path": None,
                    "sampling_session_id": sampler_id}
        path = f"tinker://{model_id}/sampler_weights/{_checkpoint_name(name)}"
        weights.model_path = path
        self._save_checkpoint(model, "sampler_weights", name, optimizer=False)
        with self.lock:
            self.named_samplers[path] = weights
        model.last_sampler_checkpoint = self._checkpoint_record(path, "sampler")
        self._write_run_json(model)
        return {"type": "save_weights_for_sampler", "path": path}

    def create_sampling_session(self, model_path: str | None, base_model: str | None
                                ) -> dict[str, Any]:
        """A sampler over saved weights (``model_path``) or a base model (answered directly)."""
        if model_path:
            weights = self._weights_for_path(model_path)
            prefix = parse_tinker_path(model_path)[0]
        elif base_model:
            policy, codec = self._base_policy(base_model)
            weights = Weights(policy=policy, params=None, base_model=base_model, codec=codec)
            prefix = "base"
        else:
            raise UserError("create_sampling_session needs model_path or base_model")
        sampler_id = self._new_sampler_id(prefix)
        with self.lock:
            self.samplers[sampler_id] = weights
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def get_sampler(self, sampler_id: str) -> dict[str, Any]:
        weights = self.sampler(sampler_id)
        return {"sampler_id": sampler_id, "base_model": weights.base_model,
                "model_path": weights.model_path}

    def sampler(self, sampler_id: str) -> Weights:
        with self.lock:
            weights = self.samplers.get(sampler_id)
        if weights is None:
            raise UserError(f"unknown or expired sampling_session_id {sampler_id!r}")
        return weights

    def _base_policy(self, base_model: str) -> tuple[HFPolicy, TextCodec]:
        spec = self.resolve(base_model)
        with self.lock:
            if spec not in self.base_policies:
                policy, codec = self._build(spec, None)
                policy.requires_grad_(False)
                self.base_policies[spec] = (policy, codec)
            return self.base_policies[spec]

    def _weights_for_path(self, path: str) -> Weights:
        with self.lock:
            if path in self.named_samplers:
                return self.named_samplers[path]
        run, kind, name = parse_tinker_path(path)
        ckpt = self.root / run_key(run) / "checkpoints" / kind / name
        meta = self._read_meta(ckpt, path)
        policy, codec = self._build(self.resolve(meta["base_model"]),
                                    LoraSettings(**meta["lora"]))
        self._load_trainable(policy, ckpt)
        policy.requires_grad_(False)
        weights = Weights(policy=policy, params=None, base_model=meta["base_model"],
                          codec=codec, model_path=path)
        with self.lock:
            self.named_samplers[path] = weights
        return weights

    def sample_batch(self, weights: Weights, requests: list[dict[str, Any]]
                     ) -> list[tuple[list[SampledRow], list[float] | None]]:
        """Sample every request (same weights and sampling parameters) in one decode batch.

        Each request is the validated dict built by `parse_sample_request`; returns, per
        request, its sampled rows and its prompt log-probs (None unless asked for).
        """
        first = requests[0]
        cfg = SamplingConfig(temperature=first["temperature"], top_k=first["top_k"],
                             top_p=first["top_p"])
        rows: list[SampleRow] = []
        for req in requests:
            seeds = self._row_seeds(req["seed"], req["num_samples"])
            rows += [SampleRow(prompt=req["prompt"], max_tokens=req["max_tokens"],
                               stop_ids=req["stop_ids"], stop_strings=req["stop_strings"],
                               seed=s) for s in seeds]
        t0 = time.perf_counter()
        with self._loaded(weights):
            sampled = sample_rows(weights.policy, rows, cfg, weights.codec)
            prompt_lps = [prompt_logprobs(weights.policy, r["prompt"], r["prompt_logprobs_last_n"])
                          if r["prompt_logprobs"] else None for r in requests]
        seconds = time.perf_counter() - t0
        if weights.owner is not None:
            acc = weights.owner.acc
            acc.sample_s += seconds
            acc.sampled_tokens += sum(len(s.tokens) for s in sampled)
            acc.sequences += len(sampled)
            acc.length_capped += sum(s.stop_reason == "length" for s in sampled)
        out = []
        start = 0
        for req, lps in zip(requests, prompt_lps, strict=True):
            out.append((sampled[start:start + req["num_samples"]], lps))
            start += req["num_samples"]
        return out

    def _row_seeds(self, seed: int | None, n: int) -> list[int]:
        if seed is None:
            return [int(s) for s in self._rng.integers(0, 2**62, size=n)]
        return [(int(seed) * 1_000_003 + i) % 2**62 for i in range(n)]

    class _Swap:
        def __init__(self, weights: Weights) -> None:
            self.weights = weights
            self.saved: dict[str, torch.Tensor] = {}

        def __enter__(self) -> None:
            params = self.weights.params
            if params is None:
                return
            with torch.no_grad():
                for n, p in self.weights.policy.named_parameters():
                    if n in params:
                        self.saved[n] = p.detach().clone()
                        p.copy_(params[n])

        def __exit__(self, *exc: object) -> None:
            if not self.saved:
                return
            with torch.no_grad():
                for n, p in self.weights.policy.named_parameters():
                    if n in self.saved:
                        p.copy_(self.saved[n])

    def _loaded(self, weights: Weights) -> Engine._Swap:
        return Engine._Swap(weights)

    # ------------------------------------------------------------------ checkpoints

    def _ckpt_dir(self, model: TrainingModel, kind: str, name: str) -> Path:
        return model.run_dir / "checkpoints" / kind / _checkpoint_name(name)

    def _save_checkpoint(self, model: TrainingModel, kind: str, name: str,
                         optimizer: bool) -> Path:
        out = self._ckpt_dir(model, kind, name)
        out.mkdir(parents=True, exist_ok=True)
        torch.save({n: p.detach().cpu() for n, p in model.trainable()}, out / "trainable.pt")
        if optimizer:
            torch.save(model.optimizer.state_dict(), out / "optimizer.pt")
        if model.lora.rank > 0:
            # PEFT format; LoRA on lm_head must not drag the full head into the adapter
            model.policy.unwrap().save_pretrained(  # type: ignore[operator]
                str(out / "adapter"), save_embedding_layers=False)
        lora = {"rank": model.lora.rank, "train_attn": model.lora.train_attn,
                "train_mlp": model.lora.train_mlp, "train_unembed": model.lora.train_unembed,
                "seed": model.lora.seed}
        (out / "meta.json").write_text(json.dumps({
            "base_model": model.base_model, "spec": model.spec, "lora": lora,
            "run_id": model.model_id, "kind": kind, "name": name, "step": model.step,
            "optimizer": optimizer, "time": _iso(time.time())}, indent=2) + "\n")
        return out

    def _read_meta(self, ckpt: Path, path: str) -> dict[str, Any]:
        if not (ckpt / "meta.json").is_file():
            raise UserError(f"no checkpoint at {path} (looked in {ckpt})")
        meta: dict[str, Any] = json.loads((ckpt / "meta.json").read_text())
        return meta

    def _load_trainable(self, policy: HFPolicy, ckpt: Path) -> None:
        state = torch.load(ckpt / "trainable.pt", map_location=self.device)
        params = dict(policy.named_parameters())
        missing = [n for n in state if n not in params]
        if missing:
            raise UserError(f"checkpoint {ckpt} does not fit this model: {missing[:3]} ...")
        with torch.no_grad():
            for n, t in state.items():
                params[n].copy_(t)

    def _checkpoint_record(self, path: str, kind: str) -> dict[str, Any]:
        _, seg, name = parse_tinker_path(path)
        return {"checkpoint_id": f"{seg}/{name}", "checkpoint_type": kind,
                "time": _iso(time.time()), "tinker_path": path}

    def save_weights(self, model_id: str, name: str) -> dict[str, Any]:
        model = self.model(model_id)
        self._save_checkpoint(model, "weights", name, optimizer=True)
        path = f"tinker://{model_id}/weights/{name}"
        model.last_checkpoint = self._checkpoint_record(path, "training")
        self._write_run_json(model)
        return {"type": "save_weights", "path": path}

    def load_weights(self, path: str, optimizer: bool, model_id: str | None = None,
                     session_id: str | None = None, model_seq_id: int | None = None,
                     user_metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """Load a checkpoint into a new training client (``session_id`` + ``model_seq_id``,
        the create-from-checkpoint path) or into an existing one (``model_id``)."""
        run, kind, name = parse_tinker_path(path)
        ckpt = self.root / run_key(run) / "checkpoints" / kind / name
        meta = self._read_meta(ckpt, path)
        if optimizer and not (ckpt / "optimizer.pt").is_file():
            raise UserError(f"{path} holds no optimizer state (sampler weights?); load it with "
                            "optimizer=False")
        if model_id is None:
            if session_id is None or model_seq_id is None:
                raise UserError("load_weights needs model_id, or session_id and model_seq_id")
            model_id = f"{session_id}:train:{model_seq_id}"
            metadata = user_metadata if user_metadata is not None else \
                self._run_json(run).get("user_metadata") or {}
            model = self._new_training_model(model_id, meta["base_model"],
                                             LoraSettings(**meta["lora"]), metadata)
        else:
            model = self.model(model_id)
        self._load_trainable(model.policy, ckpt)
        if optimizer:
            model.optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt",
                                                       map_location=self.device))
        model.optimizer.zero_grad(set_to_none=True)
        log.info("loaded %s into %s (optimizer: %s)", path, model_id, optimizer)
        return {"type": "load_weights", "path": path, "model_id": model_id}

    # ------------------------------------------------------------------ training runs

    def _write_run_json(self, model: TrainingModel) -> None:
        record = {
            "training_run_id": model.model_id, "base_model": model.base_model,
            "model_owner": "local", "is_lora": model.lora.rank > 0, "corrupted": False,
            "lora_rank": model.lora.rank if model.lora.rank > 0 else None,
            "last_request_time": _iso(model.last_request),
            "last_checkpoint": model.last_checkpoint,
            "last_sampler_checkpoint": model.last_sampler_checkpoint,
            "user_metadata": model.user_metadata or None,
        }
        (model.run_dir / "run.json").write_text(json.dumps(record, indent=2) + "\n")

    def _run_json(self, run_id: str) -> dict[str, Any]:
        path = self.root / run_key(run_id) / "run.json"
        if not path.is_file():
            raise UserError(f"unknown training run {run_id!r}")
        record: dict[str, Any] = json.loads(path.read_text())
        return record

    def training_run(self, run_id: str) -> dict[str, Any]:
        with self.lock:
            model = self.models.get(run_id)
        if model is not None:
            self._write_run_json(model)
        return self._run_json(run_id)

    def training_runs(self) -> list[dict[str, Any]]:
        runs = []
        for path in sorted(self.root.glob("*/run.json")):
            try:
                runs.append(json.loads(path.read_text()))
            except json.JSONDecodeError:
                continue
        return runs

    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        run = self.root / run_key(self._run_json(run_id)["training_run_id"])
        out = []
        for kind, ctype in (("weights", "training"), ("sampler_weights", "sampler")):
            for meta_path in sorted((run / "checkpoints" / kind).glob("*/meta.json")):
                meta = json.loads(meta_path.read_text())
                out.append({"checkpoint_id": f"{kind}/{meta['name']}",
                            "checkpoint_type": ctype, "time": meta["time"],
                            "tinker_path": f"tinker://{run_id}/{kind}/{meta['name']}"})
        return out

    def close(self) -> None:
        """Flush every run directory (status ``finished``)."""
        with self.lock:
            models = list(self.models.values())
        for model in models:
            model.metrics_log.close()
            self._write_status(model, "finished")
            self._write_run_json(model)


def parse_sample_request(body: dict[str, Any], codec_eos: int | None, vocab: int,
                         max_len: int | None, prompt: list[int]) -> dict[str, Any]:
    """Validate an ``asample`` body into the dict `Engine.sample_batch` reads; raises
    UserError on bad or unsupported input."""
    params = body.get("sampling_params") or {}
    num_samples = int(body.get("num_samples", 1))
    if num_samples < 1:
        raise UserError(f"num_samples must be >= 1, got {num_samples}")
    if not prompt:
        raise UserError("the prompt is empty")
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise UserError(f"prompt token ids must lie in 0..{vocab - 1}")
    max_tokens = params.get("max_tokens")
    if max_tokens is None:
        max_tokens = (max_len or 2048) - len(prompt)
    max_tokens = int(max_tokens)
    if max_tokens < 0:
        raise UserError(f"max_tokens must be >= 0, got {max_tokens}")
    if max_len is not None and len(prompt) + max_tokens > max_len:
        raise UserError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds "
                        f"the model's {max_len} positions")
    stop = params.get("stop")
    stop_ids: set[int] = set()
    stop_strings: list[str] = []
    if stop is None:
        if codec_eos is not None:
            stop_ids.add(int(codec_eos))
    elif isinstance(stop, str):
        stop_strings.append(stop)
    elif isinstance(stop, list):
        for s in stop:
            if isinstance(s, bool) or not isinstance(s, (int, str)):
                raise UserError(f"stop entries must be token ids or strings, got {s!r}")
            if isinstance(s, str):
                if not s:
                    raise UserError("an empty stop string would stop at once")
                stop_strings.append(s)
            else:
                stop_ids.add(int(s))
    else:
        raise UserError(f"stop must be null, a string or a list, got {stop!r}")
    temperature = float(params.get("temperature", 1.0))
    top_k = int(params.get("top_k", -1))
    top_p = float(params.get("top_p", 1.0))
    if temperature < 0 or not 0 < top_p <= 1 or top_k == 0 or top_k < -1:
        raise UserError(f"invalid sampling params: temperature={temperature} (>= 0), "
                        f"top_k={top_k} (-1 = off, or >= 1), top_p={top_p} (in (0, 1])")
    for key in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        if int(body.get(key) or 0) > 0:
            raise UserError(f"{key} > 0 is not supported by rlscope serve")
    if body.get("target_prompt_logprobs") is not None:
        raise UserError("target_prompt_logprobs is not supported by rlscope serve")
    seed = params.get("seed")
    last_n = body.get("prompt_logprobs_last_n")
    return {
        "prompt": prompt, "num_samples": num_samples, "max_tokens": max_tokens,
        "stop_ids": frozenset(stop_ids), "stop_strings": tuple(stop_strings),
        "temperature": temperature, "top_k": 0 if top_k == -1 else top_k, "top_p": top_p,
        "seed": None if seed is None else int(seed),
        "prompt_logprobs": bool(body.get("prompt_logprobs", False)),
        "prompt_logprobs_last_n": None if last_n is None else int(last_n),
    }


def nan_to_none(values: list[float] | None) -> list[float | None] | None:
    """Prompt log-probs with NaN as None (what the SDK shows for unscored positions)."""
    if values is None:
        return None
    return [None if math.isnan(v) else v for v in values]
