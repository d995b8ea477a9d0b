"""Batched generation with a KV cache and the sampling-distribution log-probs."""

from rlscope.sampling.processors import SampledDistribution, keep_mask, processed_logprobs
from rlscope.sampling.sampler import SamplingConfig, generate

__all__ = ["SampledDistribution", "SamplingConfig", "generate", "keep_mask",
           "processed_logprobs"]
