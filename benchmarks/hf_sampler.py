"""Static-cache HF sampler against the eager (dynamic-cache) path, printed as JSON.

    python benchmarks/hf_sampler.py --batch 64 256 512 --new_tokens 128

Builds a Qwen2.5-0.5B-shaped model from its config (vocab 151,936, hidden 896, 24 layers,
14 query / 2 key-value heads, MLP 4,864, tied embeddings; ``--small`` for a 2-layer model that
runs anywhere), fp32 master weights with bf16 autocast on CUDA, and times
`rlscope.sampling.generate` with ``SamplingConfig(backend="static")`` (CUDA-graphed on CUDA) and
``eager`` on the same prompts (64 tokens, groups of 8 rows sharing a prompt, no stop tokens):
completion tokens/s and ms per decode position after one warm-up call (``--compile`` adds
the static backend with ``compile_sampler``). Also the weight refresh
(``time/sampler_weight_sync``) after every parameter changed, and the peak memory.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--eager_max_batch", type=int, default=256,
                        help="skip the (slow) eager path above this batch")
    parser.add_argument("--small", action="store_true", help="a 2-layer, 1k-vocab model")
    parser.add_argument("--compile", action="store_true",
                        help="also time the static backend with compile_sampler=True")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlscope.batch import PromptBatch
    from rlscope.policy.hf import HFPolicy
    from rlscope.sampling import SamplingConfig, generate
    from rlscope.sampling.backends.hf_static import take_weight_sync_seconds

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    shape = dict(vocab_size=1024, num_hidden_layers=2) if args.small else \
        dict(vocab_size=151936, num_hidden_layers=24)
    config = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, tie_word_embeddings=True,
                         max_position_embeddings=4096, **shape)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    policy = HFPolicy(model.float().to(device).eval())
    if device.type == "cuda":
        policy.autocast_dtype = torch.bfloat16
    V = config.vocab_size
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "params_M": sum(p.numel() for p in policy.parameters()) / 1e6,
        "new_tokens": args.new_tokens, "prompt_len": args.prompt_len}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for B in args.batch:
        groups = max(B // 8, 1)
        tokens_BP = torch.randint(0, V, (groups, args.prompt_len), device=device) \
            .repeat_interleave(B // groups, 0)
        prompts = PromptBatch(tokens_BP=tokens_BP)
        seeds_B = torch.arange(B, device=device)
        group_B = torch.arange(groups, device=device).repeat_interleave(B // groups)
        variants = {"static": SamplingConfig(backend="static"),
                    "eager": SamplingConfig(backend="eager")}
        if args.compile:
            variants["static_compiled"] = SamplingConfig(backend="static", compile_sampler=True)
        for backend, cfg in variants.items():
            if backend == "eager" and B > args.eager_max_batch:
                continue
            generate(policy, prompts, cfg, seeds_B, args.new_tokens, group_id_B=group_B)
            sync()
            t0 = time.perf_counter()
            out = generate(policy, prompts, cfg, seeds_B, args.new_tokens, group_id_B=group_B)
            sync()
            seconds = time.perf_counter() - t0
            T = out.completion_tokens_BT.shape[1]
            result[f"{backend}_b{B}_tokens_per_s"] = round(B * T / seconds)
            result[f"{backend}_b{B}_ms_per_position"] = round(seconds / T * 1e3, 3)
    take_weight_sync_seconds()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.0)  # every parameter "changed": the next call refreshes them all
    B = args.batch[0]
    prompts = PromptBatch(tokens_BP=torch.randint(0, V, (B, args.prompt_len), device=device))
    generate(policy, prompts, SamplingConfig(backend="static"), torch.arange(B, device=device),
             args.new_tokens)
    result["weight_sync_ms"] = round(take_weight_sync_seconds() * 1e3, 2)
    if device.type == "cuda":
        result["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
