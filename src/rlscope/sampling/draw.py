"""One step of sampling and the rollout it builds: `SamplingConfig`, `draw` (one token per
row from the processed distribution) and `assemble` (stacked draws → `RolloutBatch`).

Shared by the eager loop (`rlscope.sampling.sampler.generate`), the CUDA-graph decoder
(`rlscope.sampling.graphs`) and the server's sampler (`rlscope.serve.sampling`), so each of
them draws the same tokens from the same noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.sampling.processors import keep_mask, processed_logprobs

BACKEND_NAMES: tuple[str, ...] = ("auto", "eager", "static")
"""Values of ``SamplingConfig.backend``: ``auto`` and the names of
`rlscope.sampling.backends.BACKENDS` (kept equal by a test)."""


@dataclass(frozen=True)
class SamplingConfig:
    """How rollouts are drawn."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose mass reaches top_p (1 = off)."""
    max_new_tokens: int = 0
    """Tokens to generate per prompt (0 = the task's completion length)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion (the stop token is kept and counted)."""
    replay_sampling_mask: bool = True
    """Learner replays the sampler's top-k/top-p kept set, so its log-probs match the sampler's."""
    use_cache: bool = True
    """Decode with the KV cache (False recomputes the full prefix each step: a test baseline)."""
    decode_graphs: bool = True
    """Replay the tiny transformer's cached decode step from CUDA graphs on CUDA devices (same
    tokens; launch overhead dominates at sandbox sizes). No effect on CPU or other policies;
    ``--cuda_graphs False`` (the run's switch) turns it off too."""
    backend: str = "auto"
    """Generation backend (`rlscope.sampling.backends`): ``auto`` = ``static`` for Hugging Face
    Llama/Qwen2/Qwen3/Mistral models on CUDA, else ``eager``; ``eager`` = the policy's own
    prefill/decode_step loop (every policy; HF models use their dynamic cache); ``static`` =
    rlscope's static-cache decoder over the HF weights, CUDA-graphed on CUDA (an unsupported
    model is an error before training starts, saying why)."""
    stop_check_every: int = 8
    """Static backend: the host checks whether every row has stopped only every this many
    positions (each check is a device sync); the output is trimmed to the eager path's length."""
    compile_sampler: bool = False
    """Static backend on CUDA: compile the whole decode step (model and draw) with
    ``torch.compile`` before capturing it, fusing its elementwise kernels (the first call of
    each batch bucket compiles, about a minute for a 24-layer model)."""

    def validate(self) -> list[str]:
        errors = []
        if self.temperature < 0:
            errors.append(f"sampling.temperature={self.temperature} must be >= 0")
        if self.top_k < 0:
            errors.append(f"sampling.top_k={self.top_k} must be >= 0 (0 turns it off)")
        if not 0 < self.top_p <= 1:
            errors.append(f"sampling.top_p={self.top_p} must lie in (0, 1]")
        if self.max_new_tokens < 0:
            errors.append(f"sampling.max_new_tokens={self.max_new_tokens} must be >= 0")
        if self.stop_check_every < 1:
            errors.append(f"sampling.stop_check_every={self.stop_check_every} must be >= 1")
        if self.backend not in BACKEND_NAMES:
            errors.append(f"sampling.backend={self.backend!r} must be one of {BACKEND_NAMES}")
        return errors


@dataclass(frozen=True)
class Draw:
    """One sampled token per row and what the rollout records about it (all ``[B]`` or
    ``[B, V]``); ``keep_BV`` is None without top-k/top-p, ``entropy_B`` and ``sum_p2_B``
    (Σ_v μ(v)² of the sampling distribution) unless asked for."""

    token_B: torch.Tensor
    logp_sampler_B: torch.Tensor
    logp_raw_B: torch.Tensor
    keep_BV: torch.Tensor | None
    entropy_B: torch.Tensor | None
    sum_p2_B: torch.Tensor | None = None


def draw(logits_BV: torch.Tensor, alive_B: torch.Tensor | None,
         gumbel_BV: torch.Tensor | None, cfg: SamplingConfig, pad_token_id: int,
         with_entropy: bool, with_sum_p2: bool = False) -> Draw:
    """One token per row from the processed distribution of ``logits_BV``.

    ``gumbel_BV`` are this step's `processors.gumbel_offsets` (None when greedy); rows no longer
    alive emit ``pad_token_id`` (``alive_B`` None: every row is, as without stop tokens).
    Shared by the eager loop and the CUDA-graph decoder.
    """
    greedy = cfg.temperature == 0
    temperature = 1.0 if greedy else cfg.temperature
    logits_BV = logits_BV.to(torch.promote_types(logits_BV.dtype, torch.float32))
    logp_raw_BV = logits_BV.log_softmax(-1)
    keep_BV = None if greedy else keep_mask(logits_BV / temperature, cfg.top_k, cfg.top_p)
    if keep_BV is not None and alive_B is not None:
        # A finished row emits the pad token, which may lie outside its kept set: keep
        # everything there so its log-prob (sampler's and replayed learner's) stays finite
        # and masking by 0 never meets -inf (0 * -inf = NaN).
        keep_BV = keep_BV | ~alive_B[:, None]
    logp_BV = logp_raw_BV if temperature == 1.0 and keep_BV is None else \
        processed_logprobs(logits_BV, temperature, keep_BV)
    if gumbel_BV is None:
        token_B = logp_BV.argmax(-1)
    else:
        token_B = (logp_BV - gumbel_BV).argmax(-1)
    if alive_B is not None:
        token_B = torch.where(alive_B, token_B, pad_token_id)
    entropy_B = -(logp_raw_BV.exp() * logp_raw_BV).nan_to_num().sum(-1) if with_entropy \
        else None
    sum_p2_B = logp_BV.exp().square().sum(-1) if with_sum_p2 else None
    logp_sampler_B = logp_BV.gather(-1, token_B[:, None])[:, 0]
    logp_raw_B = logp_sampler_B if logp_BV is logp_raw_BV else \
        logp_raw_BV.gather(-1, token_B[:, None])[:, 0]
    return Draw(token_B=token_B, logp_sampler_B=logp_sampler_B, logp_raw_B=logp_raw_B,
                keep_BV=keep_BV, entropy_B=entropy_B, sum_p2_B=sum_p2_B)


def assemble(prompts: PromptBatch, tokens_BT: torch.Tensor, alive_BT: torch.Tensor,
             logp_sampler_BT: torch.Tensor, logp_raw_BT: torch.Tensor,
             keep_BTV: torch.Tensor | None, entropy_BT: torch.Tensor | None,
             finished_by_stop_B: torch.Tensor, group_id_B: torch.Tensor | None,
             sum_p2_BT: torch.Tensor | None = None) -> RolloutBatch:
    """The `RolloutBatch` of stacked draws; ``alive_BT`` (row alive before each draw) is the
    completion mask."""
    B = tokens_BT.shape[0]
    return RolloutBatch(
        prompt_tokens_BP=prompts.tokens_BP,
        prompt_mask_BP=prompts.attention_mask_BP,
        completion_tokens_BT=tokens_BT,
        completion_mask_BT=alive_BT.float(),
        logp_sampler_BT=logp_sampler_BT * alive_BT,
        logp_raw_BT=logp_raw_BT * alive_BT,
        finished_by_stop_B=finished_by_stop_B,
        group_id_B=group_id_B if group_id_B is not None else
        torch.arange(B, device=tokens_BT.device),
        keep_mask_BTV=keep_BTV,
        targets_BT=prompts.targets_BT,
        score_mask_BT=prompts.score_mask_BT,
        entropy_BT=entropy_BT * alive_BT if entropy_BT is not None else None,
        sum_p2_sampler_BT=sum_p2_BT * alive_BT if sum_p2_BT is not None else None,
    )
