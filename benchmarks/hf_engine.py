"""Issue 17's engine benchmark: sampler, learner and GRPO step on Hugging Face models, one JSON.

Two model shapes are built from a config (random init, no download; ``--models``):

- ``104m``: Qwen2, hidden 768, 12 layers, 12 query / 4 key-value heads, MLP 3072, byte
  vocabulary (256), untied head (the shape of ``benchmarks/lm_throughput.py``);
- ``qwen0.5b``: the Qwen2.5-0.5B shape: vocab 151,936, hidden 896, 24 layers, 14 query / 2
  key-value heads, MLP 4,864, tied embeddings, rope theta 1e6, RMS-norm eps 1e-6 (494M
  parameters);
- ``tiny``: a 2-layer toy of the same family (vocab 512) for a CPU smoke run.

Sections (``--sections``), each measured for every model in the same process:

1. ``sampler``: completion tokens/s at every ``--batch_sizes`` × ``--new_tokens`` with
   ``--prompt_len``-token random prompts (``--ragged_prompts``: lengths uniform in
   [prompt_len/4, prompt_len], left-padded; ``--sampler_group``: rows per shared prompt), no
   stop tokens (every row decodes the full length), temperature 1, no top-k/top-p, for each
   path of ``--sampler_paths``:
   ``rlscope:<backend>`` is `rlscope.sampling.generate` on the `HFPolicy` the trainer builds
   (float32 master weights, ``--autocast bf16``) with ``SamplingConfig.backend`` set to
   ``<backend>`` (``default`` where the config has no backend field); ``hf:dynamic`` is
   ``model.generate`` with Hugging Face's dynamic cache and ``hf:static`` is
   ``model.generate(cache_implementation="static")``, which transformers compiles on CUDA (as
   Hugging Face recommends; ``compiled_graphs`` in its cells shows that it did); the two HF
   paths run on a bf16 copy of the weights. Warm-up calls (``--warmup``, at least 2 for
   ``hf:static``) are excluded; the median of ``--repeats`` timed calls is reported, with ms per
   decode position (wall / new tokens) and the peak GPU memory of the cell
   (``torch.cuda.max_memory_allocated``, reset before the cell; only that path's model is on
   the GPU). A cell that runs out of memory records ``"oom"`` (any other failure ``"error: ..."``,
   traceback on stderr) and the run goes on.
2. ``learner``: one optimizer step (forward + backward over micro-batches, gradient clip,
   AdamW) of rlscope's learner (`rlscope.learner.update`, as `rlscope.train.setup` builds it)
   on ``--learner_rows`` rows whose prompt + completion lengths are uniform in
   [``--min_len``, ``--max_len``] (prompt ``--learner_prompt_len`` tokens, the rest completion
   masked after its end, as after a stop token), bf16 autocast over float32 master weights,
   GRPO with no KL. ``padded`` turns the learner's packing and chunked log-probs off (full
   logits, ``--micro_batch_size`` rows per micro-batch); ``packed`` turns packing on (token
   budget ``--token_budget``, default micro_batch_size × max_len). Both are set by name on
   ``TrainConfig.learner`` when the installed rlscope has it; without it both rows measure the
   one learner there is (the JSON's ``learner_config`` says what ran). Tokens/s counts real
   tokens (prompt + completion, padding excluded); MFU = 6·N·tokens/s over the card's dense
   bf16 peak (``lm_throughput.PEAK_BF16_FLOPS``; attention FLOPs left out). Reported: the
   median of ``--learner_steps`` timed steps after ``--learner_warmup`` untimed ones, and
   every timed step (``step_times_s``), so that a step still compiling shows.
3. ``grpo``: the full GRPO step, `rlscope train` against TRL's `GRPOTrainer` (its default
   generation path, ``model.generate``) on the same saved model, prompts, batch
   (``--grpo_prompts`` × ``--grpo_group``), ``--grpo_new_tokens``, lr, clip ε 0.2, no KL, bf16,
   and the same reward (`benchmarks/trl_grpo_compare.py` runs both). Token space: the task is
   byte-level (`length_target`), the model's vocabulary may be larger (151,936); both tools see
   the same ids: the tokenizer given to TRL maps ids 0..255 to bytes and decodes every id
   ≥ 256 to nothing, and rlscope's task drops ids outside the byte range before counting words,
   so the reward reads the byte ids only, identically. Newline (id 10) is the stop token of both
   (at a 151,936 vocabulary a random model almost never samples it, so rows run to the limit).
   Reported: the median step time after ``--grpo_warmup`` steps, completion tokens per step
   (each tool's own mean length × batch) and the ratios.

Also recorded: rlscope's `environment_info`, the card, torch/transformers/trl versions, the
parameter count of each model and its ``targets`` (issue 17's, beside what was measured).
JSON goes to stdout and ``--output``; progress and the trainers' logs go to stderr.

    python benchmarks/hf_engine.py --models 104m qwen0.5b --output hf_engine.json
    python benchmarks/hf_engine.py --sections sampler --models qwen0.5b --batch_sizes 256 \\
        --new_tokens 128 --output sampler.json
    python benchmarks/hf_engine.py --models tiny --device cpu --autocast none \\
        --batch_sizes 4 --new_tokens 8 --prompt_len 8 --learner_rows 8 \\
        --learner_prompt_len 6 --min_len 8 --max_len 24 --micro_batch_size 4 \\
        --grpo_prompts 2 --grpo_group 2 --grpo_new_tokens 8 --grpo_micro_batch 2 \\
        --grpo_steps 3 --grpo_warmup 1    # CPU smoke run (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.config import OptimConfig, RunConfig, TrainConfig
from rlscope.learner import prepare
from rlscope.methods import MethodConfig
from rlscope.policy import ModelConfig
from rlscope.policy.hf import HFPolicy
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.draw import assemble
from rlscope.tasks import TaskConfig
from rlscope.utils import environment_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_throughput import PEAK_BF16_FLOPS, peak_flops
from trl_grpo_compare import run_rlscope, run_trl

SECTIONS = ("sampler", "learner", "grpo")
SHAPES: dict[str, dict[str, Any]] = {
    "104m": dict(vocab_size=256, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4, intermediate_size=3072, tie_word_embeddings=False,
                 rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=4096),
    "qwen0.5b": dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                     tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
                     max_position_embeddings=32768),
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
                 rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096),
}
"""Qwen2 config fields of each ``--models`` shape."""
HF_PATHS = ("hf:dynamic", "hf:static")
TARGETS: dict[str, dict[str, float]] = {
    "104m": {"sampler_tokens_per_s_b256_t128": 500e3},
    "qwen0.5b": {"sampler_tokens_per_s_b256_t128": 150e3, "learner_mfu": 0.35,
                 "grpo_step_speedup_over_trl": 5.0},
}
"""Issue 17's targets (one H100): rlscope's sampler at batch 256 × 128 new tokens, the
packed learner's MFU, TRL's GRPO step time over rlscope's."""
OOM = "oom"


def log(msg: str) -> None:
    print(f"[hf_engine] {msg}", file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: torch.device) -> float | None:
    """Peak allocated GPU memory since the last `reset_peak` (None off CUDA)."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


@contextmanager
def cell_guard(cell: dict[str, Any], device: torch.device) -> Iterator[None]:
    """Run one cell; if it fails, record ``"oom"`` (out of memory) or ``"error: ..."`` as its
    ``status`` (traceback to stderr) and go on with the next cell."""
    try:
        yield
    except Exception as exc:  # one cell's failure must not end the table
        keep: dict[str, Any] = {k: cell[k] for k in ("path", "batch_size", "new_tokens", "mode",
                                                     "learner_config") if k in cell}
        cell.clear()
        cell.update(keep)
        cell["status"] = OOM if is_oom(exc) else f"error: {type(exc).__name__}: {exc}"[:500]
        log(f"  {cell['status'][:200]}")
        if not is_oom(exc):
            traceback.print_exc(file=sys.stderr)
    finally:
        free_memory(device)


# ---------------------------------------------------------------------------- models


def build_model(shape: str, seed: int = 0) -> Any:
    """The ``shape``'s randomly initialised Qwen2 causal LM (SDPA attention), float32 on the
    CPU, eval mode; the same weights for the same seed (the global RNG is left alone)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**SHAPES[shape], bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.float().eval()


def n_params(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied head counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_model(shape: str, path: Path) -> int:
    """Save the shape's init (newline = EOS, NUL = pad, as `length_target` uses them) for the
    learner and GRPO sections; returns its parameter count."""
    model = build_model(shape)
    model.config.eos_token_id = 10
    model.config.pad_token_id = 0
    model.generation_config.eos_token_id = 10
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    return n_params(model)


# ---------------------------------------------------------------------------- sampler


def rlscope_backends() -> list[str]:
    """The rlscope sampler backends to measure: ``eager`` and ``static`` where
    ``SamplingConfig.backend`` exists (those of them the backend registry lists), else the one
    path there is (``default``)."""
    if "backend" not in {f.name for f in dataclasses.fields(SamplingConfig)}:
        return ["default"]
    try:
        from rlscope.sampling import backends  # type: ignore[attr-defined]
        registry = getattr(backends, "BACKENDS", None)
    except ImportError:
        registry = None
    found = [b for b in ("eager", "static") if registry is None or b in registry]
    if "static" in found and "compile_sampler" in {f.name for f in dataclasses.fields(
            SamplingConfig)}:
        found.append("static+compile")  # the static decode step compiled, then captured
    return found


def sampler_paths(requested: list[str]) -> list[str]:
    available = [f"rlscope:{b}" for b in rlscope_backends()] + list(HF_PATHS)
    if requested == ["all"]:
        return available
    unknown = [p for p in requested if p not in available]
    if unknown:
        raise ValueError(f"--sampler_paths {unknown} not available here; choose from "
                         f"{available} (or all)")
    return requested


def random_prompts(batch: int, prompt_len: int, vocab: int, ragged: bool, seed: int,
                   device: torch.device, group: int = 1) -> PromptBatch:
    """``batch`` random prompts of ``prompt_len`` ids (ragged: lengths uniform in
    [prompt_len/4, prompt_len], left-padded with 0 and masked), each repeated for ``group``
    consecutive rows."""
    g = torch.Generator().manual_seed(seed)
    n = -(-batch // group)
    tokens_BP = torch.randint(1, vocab, (n, prompt_len), generator=g)
    lengths_B = torch.randint(max(prompt_len // 4, 1), prompt_len + 1, (n,), generator=g) \
        if ragged else torch.full((n,), prompt_len)
    mask_BP = (torch.arange(prompt_len) >= prompt_len - lengths_B[:, None]).long()
    tokens_BP = (tokens_BP * mask_BP).repeat_interleave(group, 0)[:batch].to(device)
    mask_BP = mask_BP.repeat_interleave(group, 0)[:batch].to(device)
    return PromptBatch(tokens_BP=tokens_BP, attention_mask_BP=mask_BP if ragged else None)


def rlscope_sampler(model: Any, backend: str, autocast: str, group: int) -> Callable[..., int]:
    """A call ``f(prompts, new_tokens) -> completion tokens`` of `rlscope.sampling.generate`
    on the policy the trainer builds around ``model`` (float32 master, autocast); rows come in
    groups of ``group`` sharing a prompt (``group_id_B``)."""
    policy = HFPolicy(model)
    policy.autocast_dtype = torch.bfloat16 if autocast == "bf16" else None
    policy.eval()
    cfg = SamplingConfig(temperature=1.0, stop_token_ids=())
    if backend == "static+compile":
        cfg = dataclasses.replace(cfg, backend="static", compile_sampler=True)  # type: ignore[call-arg]
    elif backend != "default":
        cfg = dataclasses.replace(cfg, backend=backend)  # type: ignore[call-arg]

    def run(prompts: PromptBatch, new_tokens: int) -> int:
        seeds_B = torch.arange(prompts.batch_size, device=prompts.tokens_BP.device)
        out = generate(policy, prompts, cfg, seeds_B, new_tokens,
                       group_id_B=torch.div(seeds_B, group, rounding_mode="floor"))
        return int(out.completion_mask_BT.sum())

    return run


def hf_sampler(model: Any, static: bool) -> Callable[..., int]:
    """A call ``f(prompts, new_tokens) -> completion tokens`` of ``model.generate`` (dynamic
    cache, or ``cache_implementation="static"``, compiled by transformers on CUDA)."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    extra = {"cache_implementation": "static"} if static else {}

    def run(prompts: PromptBatch, new_tokens: int) -> int:
        mask_BP = prompts.attention_mask_BP if prompts.attention_mask_BP is not None \
            else torch.ones_like(prompts.tokens_BP)
        out_BL = model.generate(input_ids=prompts.tokens_BP, attention_mask=mask_BP,
                                do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                **extra)
        return int(out_BL.shape[0] * (out_BL.shape[1] - prompts.tokens_BP.shape[1]))

    return run


def compiled_graphs() -> int:
    """Graphs TorchDynamo has compiled in this process so far (shows whether
    ``cache_implementation="static"`` ran compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def timed(fn: Callable[[], int], device: torch.device) -> tuple[float, int]:
    sync(device)
    t0 = time.perf_counter()
    tokens = fn()
    sync(device)
    return time.perf_counter() - t0, tokens


def sampler_section(args: argparse.Namespace, shape: str, device: torch.device
                    ) -> list[dict[str, Any]]:
    """One row per (path, batch, new tokens)."""
    master = build_model(shape)
    vocab = SHAPES[shape]["vocab_size"]
    rows: list[dict[str, Any]] = []
    for path in sampler_paths(args.sampler_paths):
        kind, name = path.split(":")
        log(f"{shape} sampler {path}")
        model = None
        try:
            if kind == "rlscope":
                model = copy.deepcopy(master).to(device)
                sample = rlscope_sampler(model, name, args.autocast, args.sampler_group)
            else:
                dtype = torch.bfloat16 if args.autocast == "bf16" else torch.float32
                model = copy.deepcopy(master).to(device, dtype)
                sample = hf_sampler(model, static=name == "static")
        except Exception as exc:  # an unavailable path is recorded, not fatal
            rows.append({"path": path, "status": f"error: {exc}"})
            continue
        for batch in args.batch_sizes:
            for new_tokens in args.new_tokens:
                cell: dict[str, Any] = {"path": path, "batch_size": batch,
                                        "new_tokens": new_tokens}
                prompts = random_prompts(batch, args.prompt_len, vocab, args.ragged_prompts,
                                         seed=batch, device=device, group=args.sampler_group)
                with cell_guard(cell, device):
                    graphs_before = compiled_graphs()
                    # compiled paths compile on the first call and capture CUDA graphs later
                    start = time.perf_counter()
                    for _ in range(max(args.warmup, 2) if path == "hf:static" else args.warmup):
                        sample(prompts, new_tokens)
                    sync(device)
                    cell["warmup_s"] = time.perf_counter() - start  # compilation and capture
                    cell["compiled_graphs"] = compiled_graphs() - graphs_before
                    reset_peak(device)
                    times, tokens = [], 0
                    for _ in range(args.repeats):
                        dt, tokens = timed(functools.partial(sample, prompts, new_tokens),
                                           device)
                        times.append(dt)
                    wall = statistics.median(times)
                    cell.update(status="ok", wall_s=wall, completion_tokens=tokens,
                                tokens_per_s=tokens / wall,
                                ms_per_position=1000 * wall / new_tokens,
                                peak_memory_mb=peak_mb(device))
                    log(f"  batch {batch} × {new_tokens}: {tokens / wall:,.0f} tokens/s")
                rows.append(cell)
        del model, sample
        free_memory(device)
        if path == "hf:static" and device.type == "cuda":
            torch._dynamo.reset()  # drop compiled graphs and their CUDA-graph pools
    return rows


# ---------------------------------------------------------------------------- learner

ON_VALUES = ("on", "true", "yes", "always", "auto")
OFF_VALUES = ("off", "false", "no", "never", "none", "full")


def switch_value(cls: type, name: str, on: bool) -> Any:
    """The value of ``cls``'s field ``name`` that turns it on or off, whatever its type: a
    bool; one of a Literal's values ("on"/"off"-like); an int (0 = off, on = its default)."""
    default = getattr(cls(), name)
    if isinstance(default, bool):
        return on
    try:
        hint = typing.get_type_hints(cls).get(name)
    except Exception:  # unresolvable annotations: fall back on the default
        hint = None
    choices = [a for a in typing.get_args(hint) if isinstance(a, str)] \
        if typing.get_origin(hint) is typing.Literal else []
    if choices:
        wanted = ON_VALUES if on else OFF_VALUES
        return next((c for w in wanted for c in choices if c.lower() == w), default)
    if isinstance(default, int):
        return default if on else 0
    if isinstance(default, str):
        return "on" if on else "off"
    return default


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values read as JSON where they parse (numbers, true/false), else
    as strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"learner override {item!r} must read key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def learner_config(cfg: TrainConfig, packed: bool, token_budget: int, checkpointing: bool,
                   overrides: dict[str, Any]) -> tuple[TrainConfig, dict[str, Any] | None]:
    """``cfg`` with ``TrainConfig.learner`` set for the padded or the packed learner (where the
    installed rlscope has it; else ``cfg`` unchanged and None)."""
    if not hasattr(cfg, "learner"):
        return cfg, None
    lc = cfg.learner
    cls = type(lc)
    names = {f.name for f in dataclasses.fields(lc)}
    changes: dict[str, Any] = {}
    if "packing" in names:
        changes["packing"] = switch_value(cls, "packing", packed)
    if not packed and "logprob_chunk" in names:
        changes["logprob_chunk"] = switch_value(cls, "logprob_chunk", False)
    if packed and "token_budget" in names:
        changes["token_budget"] = token_budget
    if "activation_checkpointing" in names:
        changes["activation_checkpointing"] = switch_value(cls, "activation_checkpointing",
                                                           checkpointing)
    changes |= overrides
    lc = dataclasses.replace(lc, **changes)
    return dataclasses.replace(cfg, learner=lc), dataclasses.asdict(lc)  # type: ignore[call-arg]


def plan_summary(plan: Any) -> dict[str, Any]:
    """The learner plan's layout fields as built (what actually ran: micro-batch rows, and
    the packed learner and token budget where rlscope has them)."""
    keys = ("micro_batch_size", "num_minibatches", "group_size", "packed", "token_budget")
    out: dict[str, Any] = {}
    for key in keys:
        if hasattr(plan, key):
            value = getattr(plan, key)
            out[key] = value if value is None or isinstance(value, (bool, int, float, str)) \
                else (dataclasses.asdict(value) if dataclasses.is_dataclass(value)
                      and not isinstance(value, type) else str(value))
    return out


def ragged_batch(rows: int, prompt_len: int, min_len: int, max_len: int, vocab: int,
                 group: int, device: torch.device, seed: int = 0) -> RolloutBatch:
    """``rows`` rollouts of ``prompt_len`` prompt tokens and completions padded to
    ``max_len - prompt_len``, each row's total real length uniform in [min_len, max_len]
    (completion masked after its end), with GRPO-ready rewards."""
    g = torch.Generator().manual_seed(seed)
    T = max_len - prompt_len
    prompts = PromptBatch(tokens_BP=torch.randint(1, vocab, (rows, prompt_len), generator=g))
    lengths_B = torch.randint(max(min_len - prompt_len, 1), T + 1, (rows,), generator=g)
    alive_BT = torch.arange(T)[None] < lengths_B[:, None]
    tokens_BT = torch.where(alive_BT, torch.randint(1, vocab, (rows, T), generator=g), 0)
    logp_BT = -torch.rand(rows, T, generator=g) * 8
    batch = assemble(prompts, tokens_BT=tokens_BT, alive_BT=alive_BT, logp_sampler_BT=logp_BT,
                     logp_raw_BT=logp_BT, keep_BTV=None, entropy_BT=None,
                     finished_by_stop_B=lengths_B < T,
                     group_id_B=torch.arange(rows) // group)
    batch = dataclasses.replace(batch, rewards_B=torch.randn(rows, generator=g))
    return batch.to(device)


def learner_section(args: argparse.Namespace, shape: str, model_dir: Path, params: int,
                    device: torch.device, runs_dir: str) -> list[dict[str, Any]]:
    """Padded and packed learner steps on the same ragged batch."""
    from rlscope.train import setup

    vocab = SHAPES[shape]["vocab_size"]
    batch = ragged_batch(args.learner_rows, args.learner_prompt_len, args.min_len,
                         args.max_len, vocab, args.learner_group, device)
    real_tokens = int(batch.completion_mask_BT.sum()) + batch.prompt_tokens_BP.numel()
    padded_tokens = batch.prompt_tokens_BP.numel() + batch.completion_tokens_BT.numel()
    budget = args.token_budget or args.micro_batch_size * args.max_len
    peak = peak_flops() if device.type == "cuda" else None
    rows: list[dict[str, Any]] = []
    for mode in args.learner_modes:
        packed = mode == "packed"
        log(f"{shape} learner {mode}")
        cfg = TrainConfig(
            method="grpo", task="length_target",
            task_options=TaskConfig(length_limit=args.max_len, eval_batches=1,
                                    eval_batch_size=8),
            components=MethodConfig(selection="none", kl_coef=0.0),
            model=ModelConfig(arch="hf", path=str(model_dir), autocast=args.autocast),
            optim=OptimConfig(lr=1e-5, grad_clip=1.0),
            run=RunConfig(num_steps=1, batch_size=args.learner_rows,
                          group_size=args.learner_group,
                          micro_batch_size=args.micro_batch_size, eval_every=0,
                          device=str(device), progress=False, runs_dir=runs_dir,
                          log_samples=0, doctor_every=0, name=f"learner_{mode}"))
        overrides = parse_overrides(args.learner_packed if packed else args.learner_padded)
        cfg, used = learner_config(cfg, packed, budget, args.activation_checkpointing,
                                   overrides)
        cell: dict[str, Any] = {"mode": mode, "learner_config": used}
        with cell_guard(cell, device):
            parts = setup(cfg)
            cell["plan"] = plan_summary(parts.plan)
            parts.policy.train()
            inputs, _ = prepare(parts.spec, batch, parts.policy, None, None, 0.0,
                                parts.d.group_size, parts.plan.dist)
            for _ in range(args.learner_warmup):
                parts.learn(batch, inputs, 0.0, None)
            reset_peak(device)
            times = []
            for _ in range(args.learner_steps):
                sync(device)
                t0 = time.perf_counter()
                parts.learn(batch, inputs, 0.0, None)
                sync(device)
                times.append(time.perf_counter() - t0)
            step = statistics.median(times)
            tps = real_tokens / step
            cell.update(status="ok", step_s=step, step_times_s=times, tokens_per_s=tps,
                        mfu=6 * params * tps / peak if peak else None,
                        peak_memory_mb=peak_mb(device))
            log(f"  {tps:,.0f} tokens/s, step {step:.3f} s")
            del parts, inputs
        rows.append(cell)
    for r in rows:
        r.update(rows=args.learner_rows, real_tokens=real_tokens, padded_tokens=padded_tokens)
    return rows


# ---------------------------------------------------------------------------- GRPO


def grpo_section(args: argparse.Namespace, model_dir: Path, device: torch.device,
                 tmp: str, checkpoint: Callable[[dict[str, Any]], object] = lambda part: None
                 ) -> dict[str, Any]:
    """rlscope `train` against TRL's `GRPOTrainer` (via `trl_grpo_compare`)."""
    ns = argparse.Namespace(
        length_limit=args.grpo_new_tokens, batch_size=args.grpo_prompts * args.grpo_group,
        group_size=args.grpo_group, lr=1e-5, steps=args.grpo_steps, warmup=args.grpo_warmup,
        device=str(device), autocast=args.autocast, micro_batch_size=args.grpo_micro_batch,
        compile_sampler=args.grpo_compile_sampler, compile_blocks=args.grpo_compile_blocks)
    out: dict[str, Any] = {"batch_size": ns.batch_size, "new_tokens": ns.length_limit,
                           "micro_batch_size": ns.micro_batch_size,
                           "rlscope_compile_sampler": ns.compile_sampler,
                           "rlscope_compile_blocks": ns.compile_blocks}
    log("grpo: rlscope")
    reset_peak(device)
    ours: dict[str, Any] = {}
    with cell_guard(ours, device):
        ours.update(run_rlscope(ns, model_dir, tmp))
        ours["peak_memory_mb"] = peak_mb(device)
    out["rlscope"] = ours
    log(f"grpo: rlscope {json.dumps(ours, default=str)}")
    checkpoint(out)  # rlscope's numbers survive a cut-off TRL run
    if args.skip_trl:
        return out
    log("grpo: TRL")
    reset_peak(device)
    trl: dict[str, Any] = {}
    with cell_guard(trl, device):  # a missing trl is recorded as this cell's error
        trl.update(run_trl(ns, model_dir, str(Path(tmp) / "trl")))
        trl["peak_memory_mb"] = peak_mb(device)
    out["trl"] = trl
    if "step_s" in ours and "step_s" in trl:
        for r in (ours, trl):
            r["completion_tokens_per_s"] = r["completion_tokens_per_step"] / r["step_s"]
        out["step_time_ratio_trl_over_rlscope"] = trl["step_s"] / ours["step_s"]
        out["tokens_per_s_ratio_rlscope_over_trl"] = (ours["completion_tokens_per_s"]
                                                      / trl["completion_tokens_per_s"])
    return out


# ---------------------------------------------------------------------------- main


def target_check(shape: str, res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 17's targets for ``shape`` against what was measured (None where the cell was
    not measured): the best rlscope sampler path at batch 256 × 128, the packed learner's
    MFU, and TRL's step time over rlscope's."""
    measured: dict[str, float | None] = {}
    rates = [r["tokens_per_s"] for r in res.get("sampler", [])
             if r.get("status") == "ok" and r["path"].startswith("rlscope:")
             and r["batch_size"] == 256 and r["new_tokens"] == 128]
    measured["sampler_tokens_per_s_b256_t128"] = max(rates) if rates else None
    mfus = [r["mfu"] for r in res.get("learner", [])
            if r.get("status") == "ok" and r["mode"] == "packed" and r.get("mfu")]
    measured["learner_mfu"] = mfus[0] if mfus else None
    measured["grpo_step_speedup_over_trl"] = res.get("grpo", {}).get(
        "step_time_ratio_trl_over_rlscope")
    out = {}
    for key, target in TARGETS.get(shape, {}).items():
        value = measured[key]
        out[key] = {"target": target, "measured": value,
                    "met": None if value is None else value >= target}
    return out


def versions() -> dict[str, str | None]:
    import transformers

    try:
        import trl
        trl_version: str | None = trl.__version__
    except ImportError:
        trl_version = None
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "trl": trl_version}


def add_sampler_switches(group: Any) -> None:
    """Arguments that turn each of rlscope's static-sampler changes off (or an experimental one
    on), so each is measured against the sampler without it (shared with profile_engine)."""
    a = group.add_argument
    a("--no_fuse_rope", action="store_true",
      help="rotation and cache writes as their own kernels (hf_static.FUSE_ROPE off)")
    a("--split_down", type=int, default=None,
      help="the decode step's down projection as this many split-K partial products "
           "(hf_static.SPLIT_K_DOWN; 0 = one product; default: the module's), where the "
           "step's own layers run (--no_triton_layers, or where the Triton layers do not "
           "apply); the Triton layers take triton_layers.SPLIT_DOWN")
    a("--split_out", type=int, default=None,
      help="the decode step's output projection as this many split-K partial products "
           "(hf_static.SPLIT_K_OUT; 0 = one product; default: the module's), where the "
           "step's own layers run (as --split_down)")
    a("--no_fused_draw", action="store_true",
      help="draw with the plain draw (hf_static.FUSED_DRAW off)")
    a("--decode_block", type=int, default=None,
      help="keys per block of the Triton decode attention (decode_attention.BLOCK_N; "
           "default: the module's)")
    a("--decode_warps", type=int, default=None,
      help="warps per program of the Triton decode attention (decode_attention.NUM_WARPS; "
           "default: the module's)")
    a("--no_graph_prefill", action="store_true",
      help="an eager prefill (hf_static.GRAPH_PREFILL off)")
    a("--no_share_prompt", action="store_true",
      help="every row reads its own copy of its prompt's keys "
           "(hf_static.SHARE_PROMPT_KEYS off)")
    a("--no_rope_table", action="store_true",
      help="every decode step computes its rows' rotations (hf_static.ROPE_TABLE off)")
    a("--no_compile_prefill", action="store_true",
      help="the graphed prefill stays eager under --compile_sampler "
           "(hf_static.COMPILE_PREFILL off)")
    a("--no_fused_gate_up", action="store_true",
      help="decode steps run the gate/up product and the SiLU product as two steps "
           "(hf_static.FUSED_GATE_UP off), where the step's own layers run (as --split_down)")
    a("--no_triton_layers", action="store_true",
      help="decode layers run as the step's own kernels (cuBLAS products, compiled norms) "
           "instead of Triton kernels chained with programmatic dependent launch "
           "(hf_static.TRITON_LAYERS off)")
    a("--no_pdl", action="store_true",
      help="the Triton decode layers launch plainly, without programmatic dependent launch "
           "(triton_layers.PDL off)")


def sampler_switch_errors(args: argparse.Namespace) -> list[str]:
    """Problems with `add_sampler_switches`' arguments, each saying what to change."""
    errors = []
    if args.split_down is not None and args.split_down < 0:
        errors.append(f"--split_down must be >= 0 (got {args.split_down})")
    if args.split_out is not None and args.split_out < 0:
        errors.append(f"--split_out must be >= 0 (got {args.split_out})")
    if args.decode_block is not None and args.decode_block not in (16, 32, 64, 128, 256):
        errors.append(f"--decode_block must be 16, 32, 64, 128 or 256 (a tl.dot side; got "
                      f"{args.decode_block})")
    if args.decode_warps is not None and args.decode_warps not in (1, 2, 4, 8, 16):
        errors.append(f"--decode_warps must be a power of two from 1 to 16 (got "
                      f"{args.decode_warps})")
    return errors


def apply_sampler_switches(args: argparse.Namespace) -> None:
    """Set the static sampler's module switches from `add_sampler_switches`' arguments."""
    from rlscope.sampling.backends import decode_attention, hf_static, triton_layers

    hf_static.FUSE_ROPE = not args.no_fuse_rope
    hf_static.SHARE_PROMPT_KEYS = not args.no_share_prompt
    hf_static.GRAPH_PREFILL = not args.no_graph_prefill
    hf_static.ROPE_TABLE = not args.no_rope_table
    hf_static.COMPILE_PREFILL = not args.no_compile_prefill
    hf_static.FUSED_GATE_UP = not args.no_fused_gate_up
    hf_static.TRITON_LAYERS = not args.no_triton_layers
    triton_layers.PDL = not args.no_pdl
    if args.split_down is not None:
        hf_static.SPLIT_K_DOWN = args.split_down
    if args.split_out is not None:
        hf_static.SPLIT_K_OUT = args.split_out
    hf_static.FUSED_DRAW = not args.no_fused_draw
    if args.decode_block is not None:
        decode_attention.BLOCK_N = args.decode_block
    if args.decode_warps is not None:
        decode_attention.NUM_WARPS = args.decode_warps


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS,
      help="which tables to measure")
    a("--models", nargs="+", default=["104m", "qwen0.5b"], choices=list(SHAPES),
      help="model shapes, built from config with a random init (tiny: a CPU smoke shape)")
    a("--device", default="cuda", help="torch device (cuda, cuda:N or cpu)")
    a("--autocast", default="bf16", choices=["bf16", "none"],
      help="bf16: rlscope paths run under bf16 autocast over float32 master weights and the "
           "HF generate paths use bf16 weights (TRL: bf16=True); none: float32 throughout")
    a("--seed", type=int, default=0, help="torch seed set before each section")
    a("--output", default="", help="also write the JSON to this file")
    s = p.add_argument_group("sampler")
    s.add_argument("--sampler_paths", nargs="+", default=["all"],
                   help="rlscope:<backend> (default, or eager/static where SamplingConfig "
                        "has a backend), hf:dynamic, hf:static; all = every available one")
    s.add_argument("--batch_sizes", type=int, nargs="+", default=[64, 256, 512],
                   help="rows per generate call")
    s.add_argument("--new_tokens", type=int, nargs="+", default=[128, 512],
                   help="tokens decoded per row (no stop tokens: always all of them)")
    s.add_argument("--prompt_len", type=int, default=64, help="prompt tokens per row")
    s.add_argument("--ragged_prompts", action="store_true",
                   help="prompt lengths uniform in [prompt_len/4, prompt_len], left-padded")
    add_sampler_switches(s)
    s.add_argument("--sampler_group", type=int, default=1,
                   help="rows per prompt (consecutive rows share it and a group id, which "
                        "lets rlscope's static backend prefill it once); 1 = every row its "
                        "own prompt")
    s.add_argument("--warmup", type=int, default=1,
                   help="untimed calls per cell first (graph capture); hf:static gets at "
                        "least 2 (compilation, then CUDA-graph recording)")
    s.add_argument("--repeats", type=int, default=3, help="timed calls per cell (median)")
    g = p.add_argument_group("learner")
    g.add_argument("--learner_modes", nargs="+", default=["padded", "packed"],
                   choices=["padded", "packed"], help="learner configurations to time")
    g.add_argument("--learner_rows", type=int, default=256, help="rows per optimizer step")
    g.add_argument("--learner_group", type=int, default=8, help="GRPO group size of the rows")
    g.add_argument("--learner_prompt_len", type=int, default=32, help="prompt tokens per row")
    g.add_argument("--min_len", type=int, default=64,
                   help="shortest row (prompt + completion tokens)")
    g.add_argument("--max_len", type=int, default=384,
                   help="longest row; the padded layout is learner_prompt_len + completion "
                        "up to this")
    g.add_argument("--micro_batch_size", type=int, default=16,
                   help="rows per forward/backward (run.micro_batch_size)")
    g.add_argument("--token_budget", type=int, default=0,
                   help="packed learner's tokens per micro-batch (learner.token_budget); "
                        "0 = micro_batch_size × max_len")
    g.add_argument("--activation_checkpointing", action="store_true",
                   help="learner.activation_checkpointing on, both modes")
    g.add_argument("--learner_padded", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra TrainConfig.learner fields for the padded mode")
    g.add_argument("--learner_packed", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra TrainConfig.learner fields for the packed mode")
    g.add_argument("--learner_warmup", type=int, default=3,
                   help="untimed steps first: with compile_blocks=true the first steps still "
                        "compile (one H100, 0.5B: 0.84 s median over steps 2-4, 0.50 s after "
                        "3 warm-up steps)")
    g.add_argument("--learner_steps", type=int, default=3, help="timed steps (median)")
    r = p.add_argument_group("grpo")
    r.add_argument("--grpo_prompts", type=int, default=32, help="prompts per step")
    r.add_argument("--grpo_group", type=int, default=8, help="completions per prompt")
    r.add_argument("--grpo_new_tokens", type=int, default=256,
                   help="completion limit (newline also stops)")
    r.add_argument("--grpo_micro_batch", type=int, default=32,
                   help="rows per forward/backward for both tools (rlscope "
                        "run.micro_batch_size; TRL per_device_train_batch_size with gradient "
                        "accumulation to the batch, one generation per optimizer step); "
                        "0 = the whole batch")
    r.add_argument("--grpo_steps", type=int, default=6, help="steps per tool")
    r.add_argument("--grpo_warmup", type=int, default=2, help="steps left out of the median")
    r.add_argument("--skip_trl", action="store_true", help="time rlscope only")
    r.add_argument("--grpo_compile_sampler", action="store_true",
                   help="rlscope with --compile_sampler (the static decode step compiled)")
    r.add_argument("--grpo_compile_blocks", action="store_true",
                   help="rlscope with --compile_blocks (the learner's blocks compiled)")
    return p


def check_args(args: argparse.Namespace) -> list[str]:
    """Problems with the options, each saying what to change (none: an empty list)."""
    errors = sampler_switch_errors(args)
    counts = {"--batch_sizes": min(args.batch_sizes), "--new_tokens": min(args.new_tokens),
              "--prompt_len": args.prompt_len, "--repeats": args.repeats,
              "--sampler_group": args.sampler_group,
              "--learner_rows": args.learner_rows, "--learner_group": args.learner_group,
              "--learner_prompt_len": args.learner_prompt_len,
              "--micro_batch_size": args.micro_batch_size,
              "--learner_steps": args.learner_steps, "--grpo_prompts": args.grpo_prompts,
              "--grpo_group": args.grpo_group, "--grpo_new_tokens": args.grpo_new_tokens}
    errors += [f"{name} must be >= 1 (got {value})" for name, value in counts.items()
               if value < 1]
    if not args.learner_prompt_len < args.min_len <= args.max_len:
        errors.append(f"need --learner_prompt_len < --min_len <= --max_len (got "
                      f"{args.learner_prompt_len}, {args.min_len}, {args.max_len})")
    if args.learner_group >= 1 and args.learner_rows % args.learner_group:
        errors.append(f"--learner_rows {args.learner_rows} must be a multiple of "
                      f"--learner_group {args.learner_group}")
    grpo_batch = args.grpo_prompts * args.grpo_group
    if args.grpo_micro_batch < 0 or (args.grpo_micro_batch
                                     and grpo_batch % args.grpo_micro_batch):
        errors.append(f"--grpo_micro_batch {args.grpo_micro_batch} must divide the GRPO batch "
                      f"{grpo_batch} (--grpo_prompts × --grpo_group), or be 0")
    if not 0 <= args.grpo_warmup < args.grpo_steps:
        errors.append(f"--grpo_warmup {args.grpo_warmup} must lie in [0, --grpo_steps "
                      f"{args.grpo_steps})")
    if args.warmup < 0 or args.learner_warmup < 0 or args.token_budget < 0:
        errors.append("--warmup, --learner_warmup and --token_budget must be >= 0")
    return errors


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected section for every model; the JSON-ready result."""
    device = torch.device(args.device)
    if device.type == "cuda":
        # one compilation per static-cache shape (batch × length); the default limit is 8
        for name in ("cache_size_limit", "recompile_limit"):  # the name varies by version
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
    out: dict[str, Any] = {"benchmark": "hf_engine", "config": vars(args),
                           "card": torch.cuda.get_device_name(device)
                           if device.type == "cuda" else None,
                           "peak_bf16_flops": peak_flops() if device.type == "cuda" else None,
                           "peak_bf16_flops_table": PEAK_BF16_FLOPS,
                           "versions": versions(), "rlscope_backends": rlscope_backends(),
                           "models": {}}
    log(f"card {out['card']}, versions {out['versions']}, rlscope sampler backends "
        f"{out['rlscope_backends']}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.models:
            model_dir = Path(tmp) / shape
            params = save_model(shape, model_dir)
            log(f"{shape}: {params:,} parameters")
            res: dict[str, Any] = {"params": params, "shape": SHAPES[shape]}
            out["models"][shape] = res
            if "sampler" in args.sections:
                torch.manual_seed(args.seed)
                res["sampler"] = sampler_section(args, shape, device)
                write_partial(out, args.output)
            if "learner" in args.sections:
                torch.manual_seed(args.seed)
                res["learner"] = learner_section(args, shape, model_dir, params, device, tmp)
                write_partial(out, args.output)
            if "grpo" in args.sections:
                torch.manual_seed(args.seed)
                runs = Path(tmp) / f"{shape}_grpo"
                runs.mkdir()
                res["grpo"] = grpo_section(
                    args, model_dir, device, str(runs),
                    lambda part, res=res: (res.update(grpo=part),
                                           write_partial(out, args.output)))
            res["targets"] = target_check(shape, res)
    out["environment"] = environment_info(device)
    return out


def write_partial(out: dict[str, Any], path: str) -> None:
    """Write what has been measured so far to ``--output`` (a run cut off by a time limit
    keeps its finished sections; the final write replaces it)."""
    if path:
        Path(path).write_text(json.dumps(out, indent=2, default=str))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser()
    args = p.parse_args(argv)
    errors = check_args(args)
    if errors:
        p.error("; ".join(errors))
    apply_sampler_switches(args)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON alone
        out = run(args)
    text = json.dumps(out, indent=2, default=str)
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return out


if __name__ == "__main__":
    main()
