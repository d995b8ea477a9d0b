"""One GRPO recipe step: `rlscope train` against TRL's `GRPOTrainer`, same model, same batch.

Both load the same randomly initialised Qwen2-style model (saved once with
``save_pretrained``, then ``--arch hf --path`` for rlscope and the path for TRL), on the same
`length_target` prompts (the task's 128 instructions as UTF-8 bytes, left-padded with NUL),
with the same batch (``--batch_size`` completions in groups of ``--group_size``), completion
limit, sampling (temperature 1), learning rate, clip ε = 0.2, no KL term, one pass over each
batch, bf16 autocast over float32 weights, and the same reward (2 − words/16 of the text before
the first newline). TRL generates with `model.generate` (its default without vLLM); it gets a
character-level tokenizer whose ids are the bytes, so both see identical token ids; ids ≥ 256
(a model whose vocabulary is larger than the task's) decode to nothing there, as rlscope's
task drops them before counting words. ``--micro_batch_size`` m splits the learner's work into
m-row micro-batches in both tools (TRL: per-device batch m with gradient accumulation up to the
batch, so it still generates the whole batch once per optimizer step); 0 = the whole batch.
`benchmarks/hf_engine.py` imports `run_rlscope` and `run_trl` for its larger models.

Reported: the median wall time of a step after ``--warmup`` steps, the completion tokens per
step (the mean completion length × batch, from each tool's own log), and their ratio.

    python benchmarks/trl_grpo_compare.py --batch_size 256 --steps 8 --output trl.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rlscope.config import LearnerConfig, OptimConfig, RunConfig, TrainConfig
from rlscope.methods import MethodConfig
from rlscope.policy import ModelConfig
from rlscope.policy.hf import tiny_hf_model
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.tasks.length_target import INSTRUCTIONS, length_reward
from rlscope.train import train
from rlscope.utils import environment_info


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def byte_tokenizer() -> Any:
    """A fast HF tokenizer with id = byte for ASCII text, newline as EOS and NUL as padding."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {(chr(i) if 32 <= i < 127 or i in (9, 10) else f"<0x{i:02X}>"): i
             for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<0x00>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="\n", pad_token="<0x00>")


def save_model(args: argparse.Namespace, path: Path) -> int:
    model = tiny_hf_model("qwen2", 256, seed=0, hidden_size=args.d_model,
                          num_layers=args.n_layers, num_heads=args.n_heads,
                          num_kv_heads=args.n_kv_heads, intermediate_size=args.intermediate_size,
                          max_len=256, attn_implementation="sdpa")
    model.config.eos_token_id = 10
    model.config.pad_token_id = 0
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def micro_batch(args: argparse.Namespace) -> int:
    """Rows per forward/backward (0 = the whole batch). TRL gets it as its per-device batch
    with gradient accumulation up to the batch, so it still generates the whole batch once per
    optimizer step."""
    micro = int(getattr(args, "micro_batch_size", 0))
    if micro and args.batch_size % micro:
        raise ValueError(f"--micro_batch_size {micro} must divide --batch_size "
                         f"{args.batch_size}")
    return micro


def rlscope_speedups(args: argparse.Namespace) -> dict[str, Any]:
    """The optional fast paths asked for (``compile_sampler``, ``compile_blocks``), as
    `TrainConfig` fields where this rlscope has them."""
    out: dict[str, Any] = {}
    if getattr(args, "compile_sampler", False):
        out["sampling"] = dataclasses.replace(SamplingConfig(), compile_sampler=True)  # type: ignore[call-arg]
    if getattr(args, "compile_blocks", False):
        out["learner"] = LearnerConfig(compile_blocks=True)
    return out


def run_rlscope(args: argparse.Namespace, model_dir: Path, runs_dir: str) -> dict[str, float]:
    cfg = TrainConfig(
        method="grpo", task="length_target",
        task_options=TaskConfig(length_limit=args.length_limit, eval_batches=1,
                                eval_batch_size=8),
        components=MethodConfig(selection="none", kl_coef=0.0),
        model=ModelConfig(arch="hf", path=str(model_dir), autocast=args.autocast),
        optim=OptimConfig(lr=args.lr, grad_clip=1.0),
        run=RunConfig(num_steps=args.steps, batch_size=args.batch_size,
                      group_size=args.group_size, micro_batch_size=micro_batch(args),
                      eval_every=0, device=args.device,
                      progress=False, runs_dir=runs_dir, log_samples=0, doctor_every=0,
                      name="rlscope"),
        **rlscope_speedups(args))
    steps = train(cfg).metrics[args.warmup:]
    step_s = statistics.median(m["time/step"] for m in steps)
    tokens = statistics.median(m["length/mean"] for m in steps) * args.batch_size
    return {"step_s": step_s, "completion_tokens_per_step": tokens,
            "sample_s": statistics.median(m["time/sample"] for m in steps),
            "learn_s": statistics.median(m["time/learn"] for m in steps),
            # the static sampler's bf16 weight copy, refreshed after each update (0 without it)
            "sampler_weight_sync_s": statistics.median(
                m.get("time/sampler_weight_sync", 0.0) for m in steps)}


def run_trl(args: argparse.Namespace, model_dir: Path, out_dir: str) -> dict[str, float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.lengths: list[float] = []

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            _sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            _sync()
            self.times.append(time.perf_counter() - self.t0)

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: Any = None,
                   **k: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [length_reward(len(c.split("\n")[0].split()), None) for c in completions]

    micro = micro_batch(args) or args.batch_size
    n_prompts = args.batch_size // args.group_size * (args.steps + 1)
    prompts = [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(n_prompts)]
    config = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=micro,
        gradient_accumulation_steps=args.batch_size // micro,
        num_generations=args.group_size, max_completion_length=args.length_limit,
        learning_rate=args.lr, max_grad_norm=1.0, beta=0.0, epsilon=0.2, num_iterations=1,
        temperature=1.0, loss_type="dapo", scale_rewards="group", bf16=args.autocast == "bf16",
        use_cpu=args.device == "cpu",
        gradient_checkpointing=False, max_steps=args.steps, logging_steps=1,
        save_strategy="no", report_to="none", lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.999, weight_decay=0.0, seed=0, disable_dropout=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=byte_tokenizer(), callbacks=[timer])
    with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its logs; stdout is JSON
        trainer.train()
    times = timer.times[args.warmup:]
    lengths = timer.lengths[args.warmup:] or timer.lengths
    return {"step_s": statistics.median(times),
            "completion_tokens_per_step": statistics.median(lengths) * args.batch_size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d_model", type=int, default=768)
    p.add_argument("--n_layers", type=int, default=12)
    p.add_argument("--n_heads", type=int, default=12)
    p.add_argument("--n_kv_heads", type=int, default=4)
    p.add_argument("--intermediate_size", type=int, default=3072)
    p.add_argument("--length_limit", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--group_size", type=int, default=8)
    p.add_argument("--micro_batch_size", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--autocast", default="bf16", choices=["none", "bf16"])
    p.add_argument("--skip_trl", action="store_true")
    p.add_argument("--output", default="")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        n_params = save_model(args, model_dir)
        ours = run_rlscope(args, model_dir, tmp)
        trl = None if args.skip_trl else run_trl(args, model_dir, str(Path(tmp) / "trl"))
    out: dict[str, Any] = {"benchmark": "trl_grpo_compare", "params": n_params,
                           "config": vars(args), "rlscope": ours, "trl": trl}
    if trl:
        for r in (ours, trl):
            r["completion_tokens_per_s"] = r["completion_tokens_per_step"] / r["step_s"]
        out["step_time_ratio_trl_over_rlscope"] = trl["step_s"] / ours["step_s"]
        out["tokens_per_s_ratio_rlscope_over_trl"] = (ours["completion_tokens_per_s"]
                                                      / trl["completion_tokens_per_s"])
    out["environment"] = environment_info(torch.device(args.device))
    text = json.dumps(out, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
