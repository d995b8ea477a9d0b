"""Batched generation with a KV cache.

``generate(policy, prompts, cfg, row_seeds_B)`` returns a `RolloutBatch` with the sampled
tokens, the loss mask, the finish reason, and two log-prob tensors (under the processed sampling
distribution and under the raw policy at temperature 1). Sampling is reproducible: each row
draws from a counter-based stream keyed by its own seed (see `processors.uniform_noise`).

One step of sampling is `draw`. The engine is a generation backend
(`rlscope.sampling.backends`, chosen by ``SamplingConfig.backend``): the eager loop over the
policy's ``prefill`` / ``decode_step`` (on CUDA the tiny transformer's loop is replayed from
CUDA graphs, `rlscope.sampling.graphs`), or the static-cache decoder for Hugging Face models
(`rlscope.sampling.backends.hf_static`). Every backend runs the same `draw` and gives the same
rollout.
"""

from __future__ import annotations

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.base import Policy
from rlscope.sampling import backends
from rlscope.sampling.draw import SamplingConfig

__all__ = ["SamplingConfig", "generate"]


@torch.no_grad()
def generate(policy: Policy, prompts: PromptBatch, cfg: SamplingConfig,
             row_seeds_B: torch.Tensor, max_new_tokens: int, pad_token_id: int = 0,
             group_id_B: torch.Tensor | None = None, with_entropy: bool = False,
             with_sum_p2: bool = False) -> RolloutBatch:
    """Sample ``max_new_tokens`` tokens (fewer if every row stops) for each prompt row.

    Shapes: prompts ``[B, P]`` left-padded; returns completions ``[B, T]`` with
    ``T <= max_new_tokens``. Greedy when ``cfg.temperature == 0``. ``with_entropy`` also
    records the raw policy's entropy at every step (``entropy_BT``, used by evaluation);
    ``with_sum_p2`` records Σ_v μ(v | prefix)² of the sampling distribution
    (``sum_p2_sampler_BT``, kondo selection's behaviour baseline). ``group_id_B`` marks rows
    sharing a prompt (the static backend prefills it once per group). ``cfg.backend`` picks the
    engine; ``use_cache=False`` always runs the eager loop. ``max_new_tokens`` must be >= 1.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    device = prompts.tokens_BP.device
    name = cfg.backend if cfg.use_cache else "eager"
    backend = backends.resolve(name, policy, device)
    return backend.generate(policy, prompts, cfg, row_seeds_B, max_new_tokens, pad_token_id,
                            group_id_B, with_entropy, with_sum_p2)
