"""Paired A/B of the static sampler's module settings, every variant in one process.

`benchmarks/hf_engine.py` measures one setting of the sampler's switches per process. To
compare settings on a noisy GPU, or settings that have no command-line switch, this runs the
static sampler (``backend="static"``; compiled and replayed from CUDA graphs on CUDA with
``--compile``) once per ``--variant``. Each variant is ``NAME:SETTINGS``, where ``SETTINGS``
is a comma-separated list of ``module.ATTRIBUTE=value``:

- ``module`` is one of `MODULES` (``hf_static``, ``decode_attention``, ``fused_draw``,
  ``triton_layers``);
- ``ATTRIBUTE`` is an upper-case module setting (``hf_static.SPLIT_K_DOWN``,
  ``decode_attention.NUM_WARPS``, ...);
- ``value`` is a Python literal of the setting's own type (it may hold commas: a comma
  starts the next setting only where ``module.ATTRIBUTE=`` follows).

An empty ``SETTINGS`` keeps the defaults. Between variants every setting returns to its
default, the sampler's buckets are dropped and TorchDynamo is reset, so each variant
compiles afresh.

Per variant, after ``--warmup`` untimed calls: the median, min and max wall time of
``--repeats`` calls and the completion tokens/s of the median. On CUDA, also the replay time
of one decode position right after a prefill (`profile_engine.replay_after_prefill_us`),
the peak memory, and, with ``--profile NAME``, that variant's kernels over one whole call
(`profile_engine.profile_kernels`; divide by ``--new_tokens`` for a position), and with
``--timeline NAME`` where one whole call's wall time goes (`profile_engine.call_timeline`:
the GPU's busy and idle time, the largest gaps and what launched the kernel after each). Name the
default setting twice (``base:`` and ``base2:``) to see the drift within a call. Prints
JSON; progress goes to stderr.

    python benchmarks/sampler_ab.py --model 104m --compile \\
        --variant base: --variant split3:hf_static.SPLIT_K_DOWN=3 \\
        --variant warps4:decode_attention.NUM_WARPS=4 --variant base2:
    python benchmarks/sampler_ab.py --model tiny --device cpu --autocast none --batch 4 \\
        --prompt_len 6 --new_tokens 5 --group 2 --variant base: \\
        --variant plain_draw:hf_static.FUSED_DRAW=False      # CPU smoke run (seconds)
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from rlscope.policy.hf import HFPolicy
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.backends import decode_attention, fused_draw, hf_static, triton_layers
from rlscope.utils import environment_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_engine import SHAPES, build_model, peak_mb, random_prompts, reset_peak, sync, timed
from profile_engine import call_timeline, profile_kernels, replay_after_prefill_us

MODULES: dict[str, ModuleType] = {"hf_static": hf_static, "decode_attention": decode_attention,
                                  "fused_draw": fused_draw, "triton_layers": triton_layers}
"""The modules whose settings a variant may change."""


def log(msg: str) -> None:
    print(f"[sampler_ab] {msg}", file=sys.stderr, flush=True)


def parse_variant(text: str) -> tuple[str, dict[tuple[str, str], Any]]:
    """``NAME:mod.ATTR=value,...`` as ``(name, {(mod, ATTR): value})``; ValueError saying
    what to change."""
    name, sep, body = text.partition(":")
    if not sep or not name:
        raise ValueError(f"--variant {text!r}: write NAME:SETTINGS (SETTINGS may be empty, "
                         f"as in base:)")
    settings: dict[tuple[str, str], Any] = {}
    # a comma starts a new setting only where module.ATTRIBUTE= follows, so values may hold
    # commas themselves (tuples, dicts)
    parts = re.split(r",\s*(?=[A-Za-z_]\w*\.[A-Za-z_]\w*\s*=)", body)
    for item in filter(None, (part.strip() for part in parts)):
        key, eq, raw = item.partition("=")
        mod, dot, attr = key.strip().partition(".")
        if not eq or not dot:
            raise ValueError(f"--variant {name}: {item!r} is not module.ATTRIBUTE=value")
        if mod not in MODULES:
            raise ValueError(f"--variant {name}: unknown module {mod!r} (one of "
                             f"{', '.join(MODULES)})")
        if not attr.isupper() or not hasattr(MODULES[mod], attr):
            raise ValueError(f"--variant {name}: {mod} has no setting {attr!r}")
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            raise ValueError(f"--variant {name}: {raw.strip()!r} is not a Python literal "
                             f"(strings need quotes)") from None
        default = getattr(MODULES[mod], attr)
        if default is not None and value is not None and type(value) is not type(default) \
                and not (isinstance(default, float) and type(value) is int):
            raise ValueError(f"--variant {name}: {mod}.{attr} takes values of type "
                             f"{type(default).__name__} (default {default!r}), got {value!r}")
        settings[(mod, attr)] = value
    return name, settings


def apply(settings: dict[tuple[str, str], Any], defaults: dict[tuple[str, str], Any]) -> None:
    """Every setting any variant changes back to its default, then this variant's."""
    for (mod, attr), value in {**defaults, **settings}.items():
        setattr(MODULES[mod], attr, value)


def run(args: argparse.Namespace, variants: list[tuple[str, dict[tuple[str, str], Any]]]
        ) -> dict[str, Any]:
    device = torch.device(args.device)
    defaults = {key: getattr(MODULES[key[0]], key[1]) for _, s in variants for key in s}
    model = build_model(args.model).to(device)
    policy = HFPolicy(model)
    policy.autocast_dtype = torch.bfloat16 if args.autocast == "bf16" else None
    policy.eval()
    prompts = random_prompts(args.batch, args.prompt_len, SHAPES[args.model]["vocab_size"],
                             False, args.seed, device, args.group)
    seeds_B = torch.arange(args.batch, device=device)
    group_B = torch.div(seeds_B, args.group, rounding_mode="floor")
    cfg = SamplingConfig(temperature=1.0, stop_token_ids=(), backend="static",
                         compile_sampler=args.compile)

    def call() -> int:
        out = generate(policy, prompts, cfg, seeds_B, args.new_tokens, group_id_B=group_B)
        return int(out.completion_mask_BT.sum())

    rows = []
    try:
        for name, settings in variants:
            apply(settings, defaults)
            hf_static._DECODERS.clear()
            torch._dynamo.reset()
            log(f"{name}: {settings or 'defaults'}")
            row: dict[str, Any] = {"variant": name,
                                   "settings": {f"{m}.{a}": v for (m, a), v in settings.items()}}
            t0 = time.perf_counter()
            for _ in range(args.warmup):
                call()
            sync(device)
            row["warmup_s"] = round(time.perf_counter() - t0, 2)
            reset_peak(device)
            times, tokens = [], 0
            for _ in range(args.repeats):
                seconds, tokens = timed(call, device)
                times.append(seconds)
            wall = statistics.median(times)
            row.update(completion_tokens=tokens, tokens_per_s=round(tokens / wall, 1),
                       call_ms=round(wall * 1e3, 3), min_call_ms=round(min(times) * 1e3, 3),
                       max_call_ms=round(max(times) * 1e3, 3), peak_memory_mb=peak_mb(device))
            if device.type == "cuda":
                row["replay_us"] = replay_after_prefill_us(policy, prompts, seeds_B, group_B,
                                                           args.new_tokens)
                if name in args.profile:  # one whole call: divide by new_tokens per position
                    row["profile"] = profile_kernels(call, 1)
                if name in args.timeline:
                    row["timeline"] = call_timeline(call)
            log(f"  {row['tokens_per_s']:,.0f} tokens/s, {row['call_ms']} ms a call")
            rows.append(row)
    finally:
        apply({}, defaults)
        hf_static._DECODERS.clear()
    return {"benchmark": "sampler_ab", "config": vars(args),
            "card": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "rows": rows, "environment": environment_info(device)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--variant", action="append", default=[], required=True,
      help="NAME:module.ATTRIBUTE=value,... (repeat; an empty list keeps the defaults)")
    a("--model", default="104m", choices=list(SHAPES),
      help="model shape, built from config with a random init (tiny: a CPU smoke shape)")
    a("--device", default="cuda", help="torch device (cuda, cuda:N or cpu)")
    a("--autocast", default="bf16", choices=["bf16", "none"],
      help="bf16: float32 master weights under bf16 autocast (the sampler runs bf16); "
           "none: float32")
    a("--compile", action="store_true",
      help="compile the decode step (SamplingConfig.compile_sampler; CUDA only)")
    a("--batch", type=int, default=256, help="rows per call")
    a("--prompt_len", type=int, default=64, help="prompt tokens per row")
    a("--new_tokens", type=int, default=128, help="tokens decoded per row (no stop tokens)")
    a("--group", type=int, default=8, help="consecutive rows sharing a prompt and group id")
    a("--warmup", type=int, default=2, help="untimed calls per variant (the first compiles)")
    a("--repeats", type=int, default=5, help="timed calls per variant (median)")
    a("--seed", type=int, default=0, help="seed of the random prompts")
    a("--profile", nargs="*", default=[],
      help="variant names whose busiest kernels are profiled (CUDA)")
    a("--timeline", nargs="*", default=[],
      help="variant names whose whole call is traced (CUDA): host and GPU spans, GPU idle "
           "time by gap size, the largest gaps and what launched the kernel after each")
    a("--output", default="", help="also write the JSON to this file")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser()
    args = p.parse_args(argv)
    errors = []
    variants = []
    for text in args.variant:
        try:
            variants.append(parse_variant(text))
        except ValueError as exc:
            errors.append(str(exc))
    names = [name for name, _ in variants]
    if len(set(names)) != len(names):
        errors.append(f"--variant names must differ (got {', '.join(names)}); name a repeat "
                      f"base2:")
    errors += [f"--{flag} {n}: no variant of that name"
               for flag in ("profile", "timeline") for n in getattr(args, flag) if n not in names]
    for flag in ("batch", "prompt_len", "group", "repeats"):
        if getattr(args, flag) < 1:
            errors.append(f"--{flag} must be >= 1 (got {getattr(args, flag)})")
    if args.new_tokens < 2:
        errors.append(f"--new_tokens must be >= 2 (a decode step; got {args.new_tokens})")
    if args.warmup < 0:
        errors.append(f"--warmup must be >= 0 (got {args.warmup})")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        errors.append(f"--device {args.device}: CUDA is not available here; use --device cpu "
                      f"(with --autocast none)")
    if args.compile and torch.device(args.device).type != "cuda":
        errors.append("--compile needs --device cuda (the sampler compiles on CUDA only)")
    if errors:
        p.error("; ".join(errors))
    res = run(args, variants)
    text = json.dumps(res, indent=2, default=str)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")
    return res


if __name__ == "__main__":
    main()
