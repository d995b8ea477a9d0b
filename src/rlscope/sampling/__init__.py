"""Batched generation with a KV cache and the sampling-distribution log-probs."""

from rlscope.sampling.processors import keep_mask, processed_logprobs
from rlscope.sampling.sampler import SamplingConfig, generate

__all__ = ["SamplingConfig", "generate", "keep_mask", "processed_logprobs"]
