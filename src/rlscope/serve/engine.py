"""The server's engine: every model operation behind the Tinker endpoints.

- **Models.** A base-model name resolves through the alias table of ``--models`` (or a
  directory written by ``--write_tokenizer``, or a local Hugging Face model directory) to a
  spec, built by `rlscope.serve.state.build_policy`.
- **Training clients.** ``create_model`` builds the base with LoRA (PEFT) and an AdamW
  optimizer whose hyper-parameters each ``optim_step`` sets; the model id is
  ``{session_id}:train:{model_seq_id}``, which is also the training-run id of its checkpoints
  and the name of its run directory ``ROOT/<run>/`` (``metrics.jsonl``, ``config.json``,
  ``status.json``: ``rlscope doctor ROOT/<run>`` reads it).
- **Snapshots.** ``save_weights_for_sampler`` clones the trainable tensors when its ``seq_id``
  runs; sampling loads them for the batch and restores the live weights after, so a snapshot
  never changes.
- **Checkpoints.** `rlscope.serve.checkpoints`.

Model work (training, sampling, checkpoints) runs only on the app's single worker thread, in
the order it dispatches it. ``lock`` guards the registries (models, samplers) and is only ever
held briefly: the app's event loop takes it in request handlers, so it must never be held
across model work.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlscope.files import atomic_write_text
from rlscope.metrics.sinks import JsonlWriter
from rlscope.policy.hf import HFPolicy
from rlscope.sampling.sampler import SamplingConfig
from rlscope.serve import checkpoints, hf_export
from rlscope.serve.config import ServeConfig
from rlscope.serve.losses import check_loss_request, tinker_loss
from rlscope.serve.sampling import (
    PromptScores,
    SampledRow,
    SampleRow,
    prompt_scores,
    sample_rows,
)
from rlscope.serve.state import (
    TINY_SPECS,
    LoadedWeights,
    LoraSettings,
    TrainingModel,
    UserError,
    Weights,
    build_policy,
)
from rlscope.serve.tokenizer_dir import TextCodec, marker_spec, write_tokenizer_dir
from rlscope.serve.wire import WireDatum, WireForwardBackward, encode_forward_backward_output

log = logging.getLogger("rlscope.serve")

MAX_EPHEMERAL_SNAPSHOTS = 64
"""Ephemeral sampler snapshots kept per training client (older ones are dropped)."""


class Engine:
    """Models, training clients, sampler snapshots and checkpoints of one server."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.root = Path(cfg.root)
        self.root.mkdir(parents=True, exist_ok=True)
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(auto if cfg.device == "auto" else cfg.device)
        self.aliases: dict[str, str] = dict(e.split("=", 1) for e in cfg.models)
        self.lock = threading.RLock()
        self._build_lock = threading.Lock()
        self.models: dict[str, TrainingModel] = {}
        self._creating: set[str] = set()
        self.samplers: dict[str, Weights] = {}
        self.named_samplers: dict[str, Weights] = {}
        self.base_policies: dict[str, tuple[HFPolicy, TextCodec]] = {}
        self._sampler_counter = 0
        self._rng = np.random.default_rng(cfg.seed)
        if cfg.write_tokenizer:
            write_tokenizer_dir(cfg.write_tokenizer)
        self.hf_cache: dict[str, Path] = {}
        """Hub id → snapshot directory written by ``--write_hf_cache``."""
        if cfg.write_hf_cache:
            self.hf_cache = hf_export.write_hf_cache(cfg, self.aliases, cfg.write_hf_cache)

    # ------------------------------------------------------------------ models

    def resolve(self, base_model: str) -> str:
        """The spec of a base-model name; raises UserError for an unknown one."""
        if base_model in self.aliases:
            return self.aliases[base_model]
        if Path(base_model, "config.json").is_file():
            return base_model
        spec = marker_spec(base_model)
        if spec is not None:
            return spec
        raise UserError(f"unknown base_model {base_model!r}; this server knows "
                        f"{sorted(self.aliases)} (add NAME=SPEC to --models), directories "
                        "written by --write_tokenizer, and local Hugging Face model dirs")

    def warm_up(self) -> None:
        """Import the model libraries and build one tiny model with an adapter, so the first
        client's ``create_model`` does not pay ~10 s of imports on a slow CPU (run by the
        worker at start; builds are deterministic, so this changes no weights)."""
        t0 = time.perf_counter()
        import peft  # noqa: F401
        import transformers  # noqa: F401

        tiny = [spec for spec in self.aliases.values() if spec in TINY_SPECS]
        if tiny:
            build_policy(self.cfg, torch.device("cpu"), tiny[0], LoraSettings(rank=1))
        log.info("warmed up in %.1f s", time.perf_counter() - t0)

    def capabilities(self) -> list[dict[str, Any]]:
        return [{"model_name": name, "trainable": True, "sampleable": True}
                for name in self.aliases]

    def _new_training_model(self, model_id: str, base_model: str, lora: LoraSettings,
                            user_metadata: dict[str, str]) -> TrainingModel:
        """A new training client; refuses an id that exists (in memory or on disk), so one
        client can never empty another's metrics or overwrite its checkpoints."""
        spec = self.resolve(base_model)
        run_dir = self.root / checkpoints.run_key(model_id)
        with self.lock:
            if model_id in self.models or model_id in self._creating \
                    or (run_dir / "config.json").exists():
                raise UserError(f"model_id {model_id!r} already exists; a new training "
                                "client needs a new session or model_seq_id")
            self._creating.add(model_id)
        try:
            return self._build_training_model(model_id, base_model, spec, lora, user_metadata,
                                              run_dir)
        finally:
            with self.lock:
                self._creating.discard(model_id)

    def _build_training_model(self, model_id: str, base_model: str, spec: str,
                              lora: LoraSettings, user_metadata: dict[str, str],
                              run_dir: Path) -> TrainingModel:
        policy, codec = build_policy(self.cfg, self.device, spec, lora)
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                      weight_decay=0.0)
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
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
        checkpoints.write_run(model)
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
        seed = lora_config.get("seed")
        lora = LoraSettings(rank=rank, train_attn=bool(lora_config.get("train_attn", True)),
                            train_mlp=bool(lora_config.get("train_mlp", True)),
                            train_unembed=bool(lora_config.get("train_unembed", True)),
                            seed=None if seed is None else int(seed))
        self._new_training_model(model_id, base_model, lora, user_metadata or {})
        log.info("created %s on %s (LoRA rank %d)", model_id, base_model, rank)
        return {"model_id": model_id, "type": "create_model"}

    def get_info(self, model_id: str) -> dict[str, Any]:
        model = self.model(model_id)
        lora = model.lora.rank > 0
        return {
            "type": "get_info", "model_id": model_id,
            "model_data": {"arch": type(model.policy.unwrap()).__name__,
                           "model_name": model.base_model, "tokenizer_id": model.base_model},
            "optimizer_config": {"type": "adamw"}, "is_lora": lora,
            "lora_rank": model.lora.rank if lora else None, "model_name": model.base_model,
        }

    # ------------------------------------------------------------------ training

    def _check_data(self, req: WireForwardBackward, vocab: int) -> tuple[dict[str, float], int]:
        """The loss config with defaults, and K: 0 for per-token (``[N]``) inputs, else the
        width of ``cross_entropy``'s ``[N, K]`` ``target_tokens`` / ``weights`` (top-k
        distillation: −Σ w[n, k]·log p(target[n, k])), one K for every datum."""
        if not req.data:
            raise UserError("forward_backward needs at least one datum")
        names = set.intersection(*(set(d.inputs) for d in req.data))
        try:
            config = check_loss_request(req.loss_fn, req.loss_fn_config, names)
        except ValueError as e:
            raise UserError(str(e)) from e
        widths: set[int] = set()
        for i, d in enumerate(req.data):
            n = len(d.tokens)
            if n == 0:
                raise UserError(f"datum {i} has an empty model_input")
            k = 0
            for name, arr in d.inputs.items():
                shape = d.shapes.get(name, ())
                if len(shape) == 2 and name in ("target_tokens", "weights"):
                    if req.loss_fn != "cross_entropy":
                        raise UserError(f"datum {i}: loss_fn_inputs[{name!r}] is 2-D "
                                        f"{list(shape)}; only cross_entropy takes [N, K] "
                                        "targets and weights")
                    if shape[0] != n or not 1 <= shape[1] <= self.cfg.max_topk_logprobs:
                        raise UserError(f"datum {i}: loss_fn_inputs[{name!r}] has shape "
                                        f"{list(shape)}; [N, K] inputs need N = {n} (the "
                                        "model_input's tokens) and 1 <= K <= "
                                        f"{self.cfg.max_topk_logprobs} (--max_topk_logprobs)")
                    if k and shape[1] != k:
                        raise UserError(f"datum {i}: target_tokens and weights have different "
                                        "widths K")
                    k = shape[1]
                elif arr.size != n or len(shape) > 1:
                    raise UserError(f"datum {i}: loss_fn_inputs[{name!r}] has {arr.size} "
                                    f"entries but model_input has {n} tokens (they must match:"
                                    " position i predicts target_tokens[i])")
            if k and not all(len(d.shapes.get(name, ())) == 2 for name in
                             ("target_tokens", "weights") if name in d.inputs):
                raise UserError(f"datum {i}: [N, K] target_tokens and weights come together "
                                "(one is 2-D, the other is not)")
            widths.add(k)
            targets = d.inputs["target_tokens"]
            if min(d.tokens) < 0 or max(d.tokens) >= vocab or targets.min() < 0 \
                    or targets.max() >= vocab:
                raise UserError(f"datum {i}: token ids must lie in 0..{vocab - 1}")
        if len(widths) > 1:
            raise UserError("datums mix [N] and [N, K] targets (or several K); send one kind "
                            "per request")
        return config, widths.pop()

    def forward_backward(self, req: WireForwardBackward) -> bytes:
        """A ``forward_backward`` (or, with ``forward_only``, a ``forward``) request; returns
        the protobuf ``ForwardBackwardOutput`` (per-datum ``logprobs`` and ``loss:sum``)."""
        model = self.model(req.model_id)
        config, k = self._check_data(req, model.policy.vocab_size)
        t0 = time.perf_counter()
        logprobs: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(req.data)
        loss_total = 0.0
        for batch in _microbatches(req.data, self.cfg.max_tokens_per_microbatch):
            loss_total += self._run_microbatch(model, req, batch, config, logprobs, k)
        if not req.forward_only:
            model.stats.add_forward_backward(
                [None if k else d.inputs.get("logprobs") for d in req.data], logprobs,
                sum(len(d.tokens) for d in req.data), loss_total, time.perf_counter() - t0)
        return encode_forward_backward_output([{"logprobs": lp} for lp in logprobs],
                                              {"loss:sum": loss_total})

    def _run_microbatch(self, model: TrainingModel, req: WireForwardBackward,
                        batch: list[int], config: dict[str, float],
                        logprobs: list[np.ndarray], k: int = 0) -> float:
        """Right-padded teacher-forced forward of ``batch``'s datums, the loss summed over
        their target tokens, and (unless ``forward_only``) its backward. With ``k`` > 0 the
        targets (and weights) are ``[N, k]`` and so are the returned log-probs."""
        data = [req.data[i] for i in batch]
        lengths = [len(d.tokens) for d in data]
        width = max(k, 1)
        tokens_BT = torch.zeros(len(data), max(lengths), dtype=torch.long)
        targets_BTK = torch.zeros(len(data), max(lengths), width, dtype=torch.long)
        mask_BT = torch.zeros_like(tokens_BT)
        for b, d in enumerate(data):
            tokens_BT[b, :lengths[b]] = torch.tensor(d.tokens)
            targets_BTK[b, :lengths[b]] = torch.from_numpy(
                d.inputs["target_tokens"].copy()).reshape(lengths[b], width)
            mask_BT[b, :lengths[b]] = 1
        dev = self.device
        tokens_BT, targets_BTK, mask_BT = (tokens_BT.to(dev), targets_BTK.to(dev),
                                           mask_BT.to(dev))
        valid_BT = mask_BT.bool()
        inputs_N: dict[str, torch.Tensor] = {
            name: torch.from_numpy(np.concatenate([d.inputs[name].astype(np.float32)
                                                   for d in data])).to(dev)
            for name in ("weights", "logprobs", "advantages", "sequence_ratio_mask")
            if name in data[0].inputs}
        inputs_N["datum"] = torch.repeat_interleave(torch.arange(len(data)),
                                                    torch.tensor(lengths)).to(dev)
        with torch.set_grad_enabled(not req.forward_only):
            logits_BTV = model.policy(tokens_BT, None if bool(valid_BT.all()) else mask_BT)[0]
            logp_BTK = logits_BTV.log_softmax(-1).gather(-1, targets_BTK)
            # row-major: datum by datum, as inputs_N (with k, N·k values: row by row)
            logp_N = logp_BTK[valid_BT].reshape(-1)
            loss, _ = tinker_loss(req.loss_fn, logp_N, inputs_N, config)
            if not req.forward_only:
                loss.backward()
        logp_cpu = logp_N.detach().float().cpu().numpy().reshape(-1, width)
        offsets = np.cumsum([0, *lengths])
        for j, i in enumerate(batch):
            rows = logp_cpu[offsets[j]:offsets[j + 1]]
            logprobs[i] = rows if k else rows[:, 0]
        return float(loss.detach())

    def optim_step(self, model_id: str, adam: dict[str, Any]) -> dict[str, Any]:
        """One AdamW step with the client's hyper-parameters (``grad_clip_norm`` > 0 clips
        the global norm first), then zero the gradients."""
        model = self.model(model_id)
        lr = float(adam.get("learning_rate", 1e-4))
        beta1, beta2 = float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95))
        eps, wd = float(adam.get("eps", 1e-12)), float(adam.get("weight_decay", 0.0))
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
        for group in model.optimizer.param_groups:
            group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
        model.optimizer.step()
        model.optimizer.zero_grad(set_to_none=True)
        now = time.perf_counter()
        model.step += 1
        row = model.stats.row(model.step, grad_norm, clip, lr, now - t0,
                              now - model.last_step_wall)
        model.metrics_log.write(row)
        model.stats = type(model.stats)()
        model.last_step_wall = now
        self._write_status(model, "running")
        return {"metrics": {"rlscope/grad_norm": grad_norm,
                            "rlscope/grad_norm_clipped": row["optim/grad_norm_clipped"],
                            "rlscope/lr": lr}}

    def _write_status(self, model: TrainingModel, status: str) -> None:
        """Write ``status.json`` (atomically, one writer at a time: the worker and the
        ``finish`` handler's thread both write it); once finished it stays finished, so a step
        already queued when the session ends cannot set it back to running."""
        with self.lock:
            model.finished = model.finished or status == "finished"
            atomic_write_text(model.run_dir / "status.json", json.dumps(
                {"status": "finished" if model.finished else status, "steps": model.step,
                 "model_id": model.model_id}) + "\n")

    # ------------------------------------------------------------------ snapshots, sampling

    def _new_sampler_id(self, prefix: str) -> str:
        with self.lock:
            self._sampler_counter += 1
            return f"{prefix}:sample:{self._sampler_counter}"

    def save_weights_for_sampler(self, model_id: str, name: str | None) -> dict[str, Any]:
        """Ephemeral (``name`` None): a new sampling session on a snapshot of the weights as
        they are now; named: the same snapshot saved as ``sampler_weights/<name>``."""
        model = self.model(model_id)
        weights = Weights(policy=model.policy,
                          params={n: p.detach().clone() for n, p in model.trainable()},
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
        path = checkpoints.save(model, "sampler_weights", name)
        weights.model_path = path
        with self.lock:
            self.named_samplers[path] = weights
        model.last_sampler_checkpoint = checkpoints.record(path)
        checkpoints.write_run(model)
        return {"type": "save_weights_for_sampler", "path": path}

    def create_sampling_session(self, model_path: str | None, base_model: str | None
                                ) -> dict[str, Any]:
        """A sampler over saved weights (``model_path``) or over a base model."""
        if model_path:
            weights = self.weights_for_path(model_path)
            prefix = checkpoints.parse_tinker_path(model_path)[0]
        elif base_model:
            spec = self.resolve(base_model)
            with self._build_lock:  # not ``lock``: building a model takes a while
                if spec not in self.base_policies:
                    policy, codec = build_policy(self.cfg, self.device, spec, None)
                    self.base_policies[spec] = (policy.requires_grad_(False), codec)
                policy, codec = self.base_policies[spec]
            weights = Weights(policy=policy, params=None, base_model=base_model, codec=codec)
            prefix = "base"
        else:
            raise UserError("create_sampling_session needs model_path or base_model")
        sampler_id = self._new_sampler_id(prefix)
        with self.lock:
            self.samplers[sampler_id] = weights
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def sampler(self, sampler_id: str) -> Weights:
        with self.lock:
            weights = self.samplers.get(sampler_id)
        if weights is None:
            raise UserError(f"unknown or expired sampling_session_id {sampler_id!r}")
        return weights

    def get_sampler(self, sampler_id: str) -> dict[str, Any]:
        weights = self.sampler(sampler_id)
        return {"sampler_id": sampler_id, "base_model": weights.base_model,
                "model_path": weights.model_path}

    def weights_for_path(self, path: str) -> Weights:
        """The weights of a ``tinker://`` path: from memory, else loaded from disk."""
        with self.lock:
            if path in self.named_samplers:
                return self.named_samplers[path]
        ckpt = checkpoints.checkpoint_dir(self.root, path)
        meta = checkpoints.read_meta(ckpt, path)
        policy, codec = build_policy(self.cfg, self.device, self.resolve(meta["base_model"]),
                                     LoraSettings(**meta["lora"]))
        checkpoints.load_trainable(policy, ckpt, self.device, path)
        weights = Weights(policy=policy.requires_grad_(False), params=None,
                          base_model=meta["base_model"], codec=codec, model_path=path)
        with self.lock:
            self.named_samplers[path] = weights
        return weights

    def sample_batch(self, weights: Weights, requests: list[dict[str, Any]]
                     ) -> list[tuple[list[SampledRow], PromptScores | None]]:
        """Every request (same weights and sampling parameters, each a dict from
        `rlscope.serve.sampling.parse_sample_request`) in one decode batch; per request, its
        sampled rows and its prompt scores (log-probs and/or top-k; None unless asked for)."""
        first = requests[0]
        cfg = SamplingConfig(temperature=first["temperature"], top_k=first["top_k"],
                             top_p=first["top_p"])
        rows = [SampleRow(prompt=r["prompt"], max_tokens=r["max_tokens"],
                          stop_ids=r["stop_ids"], stop_strings=r["stop_strings"], seed=s)
                for r in requests
                for s in self._row_seeds(r["seed"], r["num_samples"], r.get("row_offset", 0))]
        t0 = time.perf_counter()
        with LoadedWeights(weights) as policy:
            sampled = sample_rows(policy, rows, cfg, weights.codec)
            prompt_lps = [prompt_scores(policy, r["prompt"], r["prompt_logprobs_last_n"],
                                        r["prompt_logprobs"], r.get("topk_prompt_logprobs", 0))
                          if r["prompt_logprobs"] or r.get("topk_prompt_logprobs", 0) else None
                          for r in requests]
        if weights.owner is not None:
            weights.owner.stats.add_samples([len(s.tokens) for s in sampled],
                                            sum(s.stop_reason == "length" for s in sampled),
                                            time.perf_counter() - t0)
        out = []
        start = 0
        for req, lps in zip(requests, prompt_lps, strict=True):
            out.append((sampled[start:start + req["num_samples"]], lps))
            start += req["num_samples"]
        return out

    def _row_seeds(self, seed: int | None, n: int, offset: int = 0) -> list[int]:
        """Noise seeds of rows ``offset .. offset + n - 1`` of a request (a seeded request's
        rows get the same seeds however it is split into chunks)."""
        if seed is None:
            return [int(s) for s in self._rng.integers(0, 2**62, size=n)]
        return [(int(seed) * 1_000_003 + i) % 2**62 for i in range(offset, offset + n)]

    # ------------------------------------------------------------------ checkpoints

    def save_weights(self, model_id: str, name: str) -> dict[str, Any]:
        model = self.model(model_id)
        path = checkpoints.save(model, "weights", name)
        model.last_checkpoint = checkpoints.record(path)
        checkpoints.write_run(model)
        return {"type": "save_weights", "path": path}

    def save_weights_external(self, model_id: str, name: str,
                              recipients: object = None) -> dict[str, Any]:
        """``save_weights_external``: the weights as a Hugging Face model directory."""
        return hf_export.save_external(self.cfg, self.model(model_id), name, recipients)

    def load_weights(self, path: str, optimizer: bool, model_id: str | None = None,
                     session_id: str | None = None, model_seq_id: int | None = None,
                     user_metadata: dict[str, str] | None = None) -> dict[str, Any]:
        """Load a checkpoint into a new training client (``session_id`` + ``model_seq_id``,
        the create-from-checkpoint path) or into an existing one (``model_id``)."""
        ckpt = checkpoints.checkpoint_dir(self.root, path)
        meta = checkpoints.read_meta(ckpt, path)
        if optimizer and not (ckpt / "optimizer.pt").is_file():
            raise UserError(f"{path} holds no optimizer state (sampler weights?); load it with "
                            "optimizer=False")
        # read (and vet) every file before a new training client exists
        trainable = checkpoints.read_trainable(ckpt, path, self.device)
        opt_state = checkpoints.load_tensors(ckpt / "optimizer.pt", path, self.device) \
            if optimizer else None
        if model_id is None:
            if session_id is None or model_seq_id is None:
                raise UserError("load_weights needs model_id, or session_id and model_seq_id")
            model_id = f"{session_id}:train:{model_seq_id}"
            run = checkpoints.parse_tinker_path(path)[0]
            metadata = user_metadata if user_metadata is not None else \
                checkpoints.read_run(self.root, run).get("user_metadata") or {}
            model = self._new_training_model(model_id, meta["base_model"],
                                             LoraSettings(**meta["lora"]), metadata)
        else:
            model = self.model(model_id)
        checkpoints.copy_trainable(model.policy, trainable, path)
        if opt_state is not None:
            try:
                model.optimizer.load_state_dict(opt_state)
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(f"checkpoint {path}: its optimizer state does not fit this "
                                "model") from e
        model.optimizer.zero_grad(set_to_none=True)
        log.info("loaded %s into %s (optimizer: %s)", path, model_id, optimizer)
        return {"type": "load_weights", "path": path, "model_id": model_id}

    def training_run(self, run_id: str) -> dict[str, Any]:
        with self.lock:
            model = self.models.get(run_id)
        if model is not None:  # live: from memory (run.json is written on the worker only)
            return checkpoints.run_record(model)
        return checkpoints.read_run(self.root, run_id)

    def finish_session(self, session_id: str) -> None:
        """Mark the run directories of a finished session's training clients."""
        with self.lock:
            # the session is what precedes the last ":train:" (a session id may hold one)
            models = [m for m in self.models.values()
                      if m.model_id.rsplit(":train:", 1)[0] == session_id]
        for model in models:
            self._write_status(model, "finished")

    def close(self) -> None:
        """Flush every run directory (status ``finished``)."""
        with self.lock:
            models = list(self.models.values())
        for model in models:
            model.metrics_log.close()
            self._write_status(model, "finished")
            checkpoints.write_run(model)


def _microbatches(data: list[WireDatum], budget: int) -> list[list[int]]:
    """Datum indices in order, grouped so each group's padded size (rows × longest) stays
    within ``budget`` tokens (a datum longer than the budget gets a group of its own)."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, d in enumerate(data):
        grown = max(longest, len(d.tokens))
        if current and grown * (len(current) + 1) > budget:
            batches.append(current)
            current, grown = [], len(d.tokens)
        current.append(i)
        longest = grown
    if current:
        batches.append(current)
    return batches
