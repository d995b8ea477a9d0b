"""The eager generation backend: a Python loop over `Policy.prefill` / `Policy.decode_step`.

Works for every `Policy` (the tiny transformer, Hugging Face models with their dynamic cache,
LoRA-wrapped models, the MLP). On CUDA the tiny transformer's loop is replayed from CUDA graphs
(`rlscope.sampling.graphs`), which gives the same rollout.
"""

from __future__ import annotations

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.base import Policy
from rlscope.sampling import graphs
from rlscope.sampling.draw import Draw, SamplingConfig, assemble, draw
from rlscope.sampling.processors import gumbel_offsets


class EagerBackend:
    """`GenerationBackend` over the policy's own incremental-decoding calls."""

    name = "eager"

    def supports(self, policy: Policy, device: torch.device) -> bool:
        """Every policy."""
        return True

    def unsupported_reason(self, policy: Policy, device: torch.device) -> str | None:
        """Never unsupported."""
        return None

    @torch.no_grad()
    def generate(self, policy: Policy, prompts: PromptBatch, cfg: SamplingConfig,
                 row_seeds_B: torch.Tensor, max_new_tokens: int, pad_token_id: int = 0,
                 group_id_B: torch.Tensor | None = None, with_entropy: bool = False,
                 with_sum_p2: bool = False) -> RolloutBatch:
        """`rlscope.sampling.sampler.generate` by the eager loop (see there)."""
        return generate_eager(policy, prompts, cfg, row_seeds_B, max_new_tokens, pad_token_id,
                              group_id_B, with_entropy, with_sum_p2)


@torch.no_grad()
def generate_eager(policy: Policy, prompts: PromptBatch, cfg: SamplingConfig,
                   row_seeds_B: torch.Tensor, max_new_tokens: int, pad_token_id: int = 0,
                   group_id_B: torch.Tensor | None = None, with_entropy: bool = False,
                   with_sum_p2: bool = False) -> RolloutBatch:
    """The eager decode loop (the reference every other backend must equal)."""
    B, P = prompts.tokens_BP.shape
    device = prompts.tokens_BP.device
    if cfg.decode_graphs and cfg.use_cache and max_new_tokens > 0 \
            and graphs.supported(policy, device):
        return graphs.generate_graphed(policy, prompts, cfg, row_seeds_B, max_new_tokens,
                                       pad_token_id, group_id_B, with_entropy, with_sum_p2)
    greedy = cfg.temperature == 0
    stops = torch.tensor(cfg.stop_token_ids, device=device, dtype=torch.long)
    draws: list[Draw] = []
    alive_out = []
    alive_B = torch.ones(B, dtype=torch.bool, device=device)
    if cfg.use_cache:
        cache = policy.init_cache(B, P + max_new_tokens)
        logits_BV = policy.prefill(prompts.tokens_BP, prompts.attention_mask_BP, cache)
    else:
        seq_BT, mask_BT = prompts.tokens_BP, prompts.attention_mask_BP
        logits_BV = policy.forward(seq_BT, mask_BT)[0][:, -1]
    for step in range(max_new_tokens):
        gumbel_BV = None if greedy else gumbel_offsets(row_seeds_B, step, logits_BV.shape[-1])
        d = draw(logits_BV, alive_B if stops.numel() else None, gumbel_BV, cfg, pad_token_id,
                 with_entropy, with_sum_p2)
        draws.append(d)
        alive_out.append(alive_B)
        token_B = d.token_B
        if stops.numel():
            alive_B = alive_B & ~torch.isin(token_B, stops)
            if not bool(alive_B.any()):
                break
        if step + 1 == max_new_tokens:
            break
        if cfg.use_cache:
            logits_BV = policy.decode_step(token_B, cache)
        else:
            seq_BT = torch.cat([seq_BT, token_B[:, None]], 1)
            if mask_BT is not None:
                mask_BT = torch.cat([mask_BT, torch.ones_like(mask_BT[:, :1])], 1)
            logits_BV = policy.forward(seq_BT, mask_BT)[0][:, -1]

    keep = [d.keep_BV for d in draws if d.keep_BV is not None]
    entropy = [d.entropy_B for d in draws if d.entropy_B is not None]
    sum_p2 = [d.sum_p2_B for d in draws if d.sum_p2_B is not None]
    return assemble(prompts,
                    tokens_BT=torch.stack([d.token_B for d in draws], 1),
                    alive_BT=torch.stack(alive_out, 1),
                    logp_sampler_BT=torch.stack([d.logp_sampler_B for d in draws], 1),
                    logp_raw_BT=torch.stack([d.logp_raw_B for d in draws], 1),
                    keep_BTV=torch.stack(keep, 1) if keep else None,
                    entropy_BT=torch.stack(entropy, 1) if entropy else None,
                    finished_by_stop_B=~alive_B if stops.numel() else torch.zeros_like(alive_B),
                    group_id_B=group_id_B,
                    sum_p2_BT=torch.stack(sum_p2, 1) if sum_p2 else None)
