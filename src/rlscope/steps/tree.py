"""The ``tree`` step kind: GRPO over trees of REPL rollouts (``rlm_grpo`` on ``rlm_papers``,
COMPANIONS.md §4).

A step draws batch_size / group_size train examples and runs group_size trees on each
(`rlscope.envs.rlm.run_trees`: a root in its REPL, children spawned by ``rlm_query*``), the
model sampling every turn through `RecordingGenerator` (temperature 1, top-p 1, top-k 0);
scores each root's final answer (`char_f1`, or the judge); turns the root rewards into group
advantages and every generated turn into a weighted segment (`segment_weights`); and updates
the policy on the segments (`rlscope.steps.tree_update`). Evaluation runs one greedy tree per
eval example. The model is a Hugging Face architecture built from a config with the byte chat
codec, or a local directory with its tokenizer and chat template; LoRA adapters (or full
fine-tuning with a frozen copy as the KL reference when ``--lora_rank 0``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlscope import checkpoint
from rlscope.checks import device_errors, model_module_errors
from rlscope.envs.rlm import (
    RlmConfig,
    RlmExample,
    TreeRecord,
    check_prompt_lengths,
    load_examples,
    rlm_errors,
    run_trees,
    sandbox_errors,
    score_tree,
    segment_weights,
    split_examples,
    tree_metrics,
)
from rlscope.methods.spec import MethodSpec
from rlscope.metrics.estimators import advantage_metrics, group_outcome_metrics
from rlscope.policy import add_lora, build_policy, reference_of
from rlscope.policy.base import Policy
from rlscope.steps.base import StepKind
from rlscope.steps.tree_model import (
    ByteChat,
    ChatCodec,
    Generation,
    Message,
    RecordingGenerator,
    TemplateChat,
)
from rlscope.steps.tree_update import (
    TreeSegment,
    UpdateOptions,
    tree_advantages,
    update_on_segments,
)

if TYPE_CHECKING:
    from rlscope.config import TrainConfig
    from rlscope.policy import ModelConfig

TASK = "rlm_papers"
DEFAULT_GROUP_SIZE = 4
"""Trees per prompt when --group_size is 0."""
SAMPLES_PER_STEP = 2
"""At most this many whole trees (they are long) written to samples.jsonl per sampled step
(``--log_samples`` caps it further)."""


def group_size_of(cfg: TrainConfig) -> int:
    """Trees per prompt: --group_size, or `DEFAULT_GROUP_SIZE` when it is 0."""
    return cfg.run.group_size or DEFAULT_GROUP_SIZE


def tree_errors(cfg: TrainConfig, spec: MethodSpec) -> list[str]:
    """The rejections of COMPANIONS.md §4 (one line each, saying what to change)."""
    r, m, t, sampling = cfg.run, cfg.model, cfg.rlm_train, cfg.sampling
    errors = (m.validate() + model_module_errors(m) + device_errors(r.device)
              + rlm_errors(cfg.rlm) + sandbox_errors(rlm_options(cfg)))
    if (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens) != (
            1.0, 1.0, 0, 0):
        errors.append("--temperature, --top_p, --top_k, --max_new_tokens: rlm_grpo samples at "
                      "temperature 1, top-p 1, top-k 0 (its turn lengths are --max_plan_tokens "
                      "and --max_child_tokens); drop them")
    g = group_size_of(cfg)
    if g <= 1:
        errors.append(f"--group_size {g}: rlm_grpo compares trees of one prompt; use 2 or more")
    elif r.batch_size % g:
        errors.append(f"--batch_size {r.batch_size} is not a multiple of --group_size {g}")
    if spec.objective.clip_low <= 0 or spec.objective.clip_high <= 0:
        errors.append(f"--clip_low {spec.objective.clip_low} / --clip_high "
                      f"{spec.objective.clip_high}: the PPO clip must be > 0")
    if spec.kl.coef < 0:
        errors.append(f"--kl_coef {spec.kl.coef} must be >= 0")
    overridden = [f"--{name}" for name in ("advantage", "gate", "objective", "agg",
                                           "selection", "kl_estimator", "kl_target",
                                           "kl_place", "kl_control", "entropy_coef")
                  if getattr(cfg.components, name) is not None]
    if overridden:
        errors.append(f"{', '.join(overridden)}: rlm_grpo's update is fixed (PPO clip, k3 KL "
                      "to the reference in the loss, segment-weighted); use --kl_coef, "
                      "--clip_low/--clip_high and --no_scale_rewards")
    if m.arch not in ("llama", "qwen2", "hf"):
        errors.append(f"--arch {m.arch}: rlm_grpo trains a Hugging Face model (--arch qwen2 or "
                      "llama built from a config, or --arch hf --path DIR)")
    if t.enable_thinking and m.arch != "hf":
        errors.append("--enable_thinking needs --arch hf (a chat template that reads it); a "
                      "model built from a config uses the byte chat format")
    cuda = r.device.startswith("cuda") or (r.device == "auto" and torch.cuda.is_available())
    if t.load_in_4bit and (m.lora_rank < 1 or m.arch != "hf" or not cuda):
        errors.append("--load_in_4bit needs LoRA (--lora_rank > 0), --arch hf and a CUDA "
                      "device: the 4-bit base stays frozen and bitsandbytes runs on CUDA")
    if t.eval_examples < 0:
        errors.append(f"--eval_examples {t.eval_examples} must be >= 0 (0 = the whole split)")
    if m.dtype != "float32" and m.arch == "hf" and t.load_in_4bit:
        errors.append("--load_in_4bit keeps float32 adapters: use --dtype float32")
    return errors


def rlm_options(cfg: TrainConfig) -> RlmConfig:
    """The environment's options, the REPL's sandbox mode taken from ``--unsafe_sandbox``."""
    return dataclasses.replace(cfg.rlm, unsafe_sandbox=cfg.task_options.unsafe_sandbox)


def chat_codec(model: ModelConfig, enable_thinking: bool) -> ChatCodec:
    """The local directory's chat template (``--arch hf``), else the byte chat codec."""
    if model.arch == "hf":
        return TemplateChat(model.path, enable_thinking)
    return ByteChat()


def positions(rlm: RlmConfig) -> int:
    """Positions a config-built model needs: the longest prompt plus one turn."""
    return rlm.max_prompt_tokens + max(rlm.max_plan_tokens, rlm.max_child_tokens)


def rlm_policy(model: ModelConfig, codec: ChatCodec, max_len: int, device: torch.device,
               init: str = "", load_in_4bit: bool = False) -> Policy:
    """The policy: built from the config (or loaded from ``--path``; in 4-bit with
    ``load_in_4bit``), ``init``'s weights loaded (an ``rlscope sft`` output or a checkpoint),
    then LoRA adapters on top when ``--lora_rank`` > 0."""
    policy = _four_bit(model.path) if load_in_4bit else build_policy(
        dataclasses.replace(model, lora_rank=0), codec.vocab_size, max_len).to(device)
    if init:
        checkpoint.load_init(init, policy, device)
    if model.lora_rank > 0:
        from rlscope.policy.hf import HFPolicy

        assert isinstance(policy, HFPolicy)
        policy = add_lora(policy, model)
    return policy


def _four_bit(path: str) -> Policy:
    """A local model's frozen base in NF4 with double quantisation (bitsandbytes, CUDA)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from rlscope.policy.hf import HFPolicy

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                 quantization_config=quant)
    return HFPolicy(model.eval())


class TreeStep:
    """One ``rlm_grpo`` run (module docstring)."""

    def __init__(self, cfg: TrainConfig, spec: MethodSpec, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        rlm = cfg.rlm
        examples = load_examples(rlm.train_file or None, rlm.max_examples)
        self.train_examples, eval_examples = split_examples(examples)
        n_eval = cfg.rlm_train.eval_examples
        self.eval_examples = eval_examples[:n_eval] if n_eval else eval_examples
        self.codec = chat_codec(cfg.model, cfg.rlm_train.enable_thinking)
        check_prompt_lengths(examples, lambda c: len(self.codec.prompt_ids(c)),
                             rlm.max_prompt_tokens)
        self.policy = rlm_policy(cfg.model, self.codec, positions(rlm), device, cfg.run.init,
                                 cfg.rlm_train.load_in_4bit)
        self.reference = reference_of(self.policy)
        self.params = [p for p in self.policy.parameters()  # type: ignore[attr-defined]
                       if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.params, lr=o.lr, weight_decay=o.weight_decay,
                                           betas=(o.adam_beta1, o.adam_beta2))
        self.group_size = group_size_of(cfg)
        self.options = UpdateOptions(
            clip_low=spec.objective.clip_low, clip_high=spec.objective.clip_high,
            kl_coef=spec.kl.coef, micro_batch_size=cfg.run.micro_batch_size or 1,
            inner_epochs=cfg.run.inner_epochs, grad_clip=o.grad_clip)
        seed = cfg.run.seed
        self.prompts = torch.Generator().manual_seed(seed)
        self.sampling = torch.Generator().manual_seed(seed + 1)
        self.order = torch.Generator().manual_seed(seed + 2)
        self.pending: list[dict[str, Any]] = []

    def _trees(self, examples: list[RlmExample], greedy: bool, seeds: torch.Generator
               ) -> tuple[list[TreeRecord], RecordingGenerator]:
        generate = RecordingGenerator(self.policy, self.codec, greedy, seeds, self.device)
        trees = run_trees(examples, generate, rlm_options(self.cfg), generate.count_tokens)
        return trees, generate

    def _rewards(self, trees: list[TreeRecord], examples: list[RlmExample]
                 ) -> tuple[torch.Tensor, dict[str, float]]:
        """Root rewards ``[B]`` (`rlscope.envs.rlm.score_tree`: char_f1 or the judge; no
        FINAL scores 0) and the environment's metrics of the trees (`tree_metrics`)."""
        scores = [score_tree(t, e, self.cfg.rlm) for t, e in zip(trees, examples, strict=True)]
        return (torch.tensor([s.reward for s in scores], dtype=torch.float64),
                tree_metrics(trees, scores))

    def train_step(self, step: int) -> dict[str, float]:
        g = self.group_size
        picks = torch.randint(len(self.train_examples), (self.cfg.run.batch_size // g,),
                              generator=self.prompts).tolist()
        examples = [self.train_examples[i] for i in picks for _ in range(g)]
        trees, generate = self._trees(examples, False, self.sampling)
        rewards_B, env_metrics = self._rewards(trees, examples)
        adv_B = tree_advantages(rewards_B, g, self.cfg.rlm_train.scale_rewards)
        segments = tree_segments(trees, generate.take, adv_B,
                                 self.cfg.rlm.train_child_trajectories)
        update = update_on_segments(self.policy, self.reference, self.optimizer, self.params,
                                    segments, len(trees), self.options, self.order)
        if self.cfg.run.log_samples and step % max(self.cfg.run.samples_every, 1) == 0:
            self.pending += [{"step": step, "reward": float(rewards_B[i]),
                              "advantage": float(adv_B[i]), **trees[i].to_dict()}
                             for i in range(min(self.cfg.run.log_samples, SAMPLES_PER_STEP,
                                                len(trees)))]
        ones_B1 = torch.ones(len(trees), 1, dtype=torch.float64)
        measured = advantage_metrics(adv_B[:, None], ones_B1, rewards_B, g) \
            | group_outcome_metrics(rewards_B, g)
        return {**env_metrics, **{k: float(v) for k, v in measured.items()}, **update}

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """One greedy tree per eval example: ``eval/reward``, ``eval/final_rate``,
        ``eval/children_mean`` (none without eval examples)."""
        examples = list(self.eval_examples)
        if not examples:  # a --train_file without eval rows
            return {}
        trees, _ = self._trees(examples, True, torch.Generator().manual_seed(0))
        _, measured = self._rewards(trees, examples)
        return {"eval/reward": measured["reward/mean"],
                "eval/final_rate": measured["rlm/final_rate"],
                "eval/children_mean": measured["rlm/children_mean"]}

    def take_samples(self) -> list[dict[str, Any]]:
        """The whole trees to append to ``samples.jsonl`` since the last call."""
        out, self.pending = self.pending, []
        return out

    def export(self, directory: Path) -> None:
        """The adapter (LoRA) or the full model, the tokenizer and its config into
        ``directory``."""
        from rlscope.policy.hf import HFPolicy

        directory.mkdir(parents=True, exist_ok=True)
        assert isinstance(self.policy, HFPolicy)
        model: Any = self.policy.unwrap()
        if self.policy.has_adapters:
            self.policy.save_adapter(directory)
            model.get_base_model().config.save_pretrained(str(directory))
        else:
            model.save_pretrained(str(directory))
        self.codec.save(directory)

    def state_dict(self) -> dict[str, Any]:
        trained = {name: p.detach().clone() for name, p in
                   self.policy.named_parameters()  # type: ignore[attr-defined]
                   if p.requires_grad}
        return {"trained": trained, "optimizer": self.optimizer.state_dict(),
                "prompts": self.prompts.get_state(), "sampling": self.sampling.get_state(),
                "order": self.order.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = dict(self.policy.named_parameters())  # type: ignore[attr-defined]
        with torch.no_grad():
            for name, value in state["trained"].items():
                params[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        for name in ("prompts", "sampling", "order"):
            getattr(self, name).set_state(state[name])

    def describe(self) -> str:
        m = self.cfg.model
        model = f"{m.path} (chat template)" if m.arch == "hf" else (
            f"{m.arch} d_model={m.d_model} n_layers={m.n_layers} n_heads={m.n_heads} "
            "(byte chat codec)")
        lora = f"LoRA r={m.lora_rank} α={m.lora_alpha}" if m.lora_rank else "full fine-tuning"
        return (f"rlm_papers: {len(self.train_examples)} train / {len(self.eval_examples)} eval "
                f"examples; {model}; {lora}")


def tree_segments(trees: Sequence[TreeRecord], take: Callable[[Sequence[Message], str],
                                                              Generation],
                  adv_B: torch.Tensor, train_child_trajectories: bool) -> list[TreeSegment]:
    """Every generated turn of ``trees`` as a `TreeSegment`: its ids (``take(prompt,
    text)``: the recorded generation), its tree's advantage and its credit weight
    (`rlscope.envs.rlm.segment_weights`)."""
    segments = []
    for i, tree in enumerate(trees):
        weights = segment_weights(tree, train_child_trajectories)
        for segment, weight in zip(tree.segments, weights, strict=True):
            ids = take(segment.prompt, segment.text)
            segments.append(TreeSegment(
                i, -1 if segment.child is None else segment.child, segment.turn,
                ids.prompt_ids, ids.completion_ids, float(adv_B[i]), weight))
    return segments


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The modules the RLM defaults put LoRA adapters on (COMPANIONS.md §4)."""


def tree_defaults(cfg: TrainConfig) -> TrainConfig:
    """The RLM defaults (COMPANIONS.md §4): 100 steps, batch 4 = 1 prompt × 4 trees, one inner
    epoch, AdamW lr 1e-5 without weight decay, LoRA r 16 / α 32 / dropout 0 on the attention
    and MLP projections, evaluation and checkpoints every 25 steps; on CUDA (``--device cuda``,
    or ``auto`` with a GPU) bf16 autocast and gradient checkpointing. Flags given on the
    command line or in a manifest override them (`rlscope.steps.with_kind_defaults`)."""
    from rlscope.config import OptimConfig, RunConfig, TrainConfig
    from rlscope.policy import ModelConfig

    device = cfg.run.device
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return TrainConfig(
        method=cfg.method, task=cfg.task,
        run=RunConfig(num_steps=100, batch_size=4, group_size=4, inner_epochs=1,
                      eval_every=25, checkpoint_every=25),
        optim=OptimConfig(lr=1e-5, weight_decay=0.0),
        model=ModelConfig(lora_rank=16, lora_alpha=32, lora_dropout=0.0,
                          lora_targets=LORA_TARGETS, autocast="bf16" if cuda else "none",
                          gradient_checkpointing=cuda))


KIND = StepKind(tasks={TASK: "questions over several fictional papers answered from a Python "
                             "REPL with sub-agent calls (rlm_grpo; COMPANIONS.md §4)"},
                validate=tree_errors, build=TreeStep, defaults=tree_defaults)
"""The ``tree`` step kind's record in `rlscope.steps.STEPS`."""

__all__ = ["KIND", "LORA_TARGETS", "TreeStep", "chat_codec", "positions", "rlm_policy",
           "tree_defaults", "tree_errors", "tree_segments"]
