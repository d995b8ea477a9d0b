"""Generation backends: the engines behind `rlscope.sampling.sampler.generate`.

A backend turns a `PromptBatch` into a `RolloutBatch` with the sampler's contract (the same
tokens for the same row seeds, processed and raw log-probs, the kept top-k/top-p set, entropy,
Σμ²); `SamplingConfig.backend` picks one by name from `BACKENDS`:

- ``eager`` (`eager.EagerBackend`): the policy's own ``prefill`` / ``decode_step`` in a Python
  loop; every policy (on CUDA the tiny transformer replays it from CUDA graphs).
- ``static`` (`hf_static.HFStaticBackend`): rlscope's own decode step over the weights of a Hugging
  Face Llama / Qwen2 / Qwen3 / Mistral model, with a preallocated static KV cache, the prompt
  prefilled once per group, and on CUDA the prefill and the decode step replayed from CUDA
  graphs; its Triton kernels are `decode_attention` (kernels in `decode_kernels`) and
  `fused_draw` (kernels in `draw_kernels`).
- ``auto``: ``static`` where it supports the policy on a CUDA device, else ``eager``.

An external engine (vLLM, SGLang, colocated on the same GPU) plugs in as one more entry: an
object with ``supports`` and ``generate`` that pushes the learner's weights to the engine when
they changed, asks it for completions with per-row seeds, and returns the sampler's log-probs
(see ``docs/architecture.md``). Nothing else in the loop changes.
"""

from __future__ import annotations

from typing import Protocol

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.base import Policy
from rlscope.sampling.backends.eager import EagerBackend
from rlscope.sampling.backends.hf_static import HFStaticBackend
from rlscope.sampling.draw import SamplingConfig

__all__ = ["BACKENDS", "GenerationBackend", "check_backend", "resolve"]


class GenerationBackend(Protocol):
    """What `generate` needs from an engine."""

    def supports(self, policy: Policy, device: torch.device) -> bool:
        """Whether this backend can sample from ``policy`` on ``device``."""
        ...

    def unsupported_reason(self, policy: Policy, device: torch.device) -> str | None:
        """Why it cannot (None when it can): shown when the user asked for it by name."""
        ...

    def generate(self, policy: Policy, prompts: PromptBatch, cfg: SamplingConfig,
                 row_seeds_B: torch.Tensor, max_new_tokens: int, pad_token_id: int = 0,
                 group_id_B: torch.Tensor | None = None, with_entropy: bool = False,
                 with_sum_p2: bool = False) -> RolloutBatch:
        """`rlscope.sampling.sampler.generate`'s contract."""
        ...


BACKENDS: dict[str, GenerationBackend] = {
    "eager": EagerBackend(),
    "static": HFStaticBackend(),
}
"""Every backend by name (``SamplingConfig.backend`` also accepts ``auto``)."""

BACKEND_CHOICES: tuple[str, ...] = ("auto", *BACKENDS)
"""Values ``SamplingConfig.backend`` accepts."""


def resolve(name: str, policy: Policy, device: torch.device) -> GenerationBackend:
    """The backend ``name`` selects for ``policy`` on ``device`` (``auto``: ``static`` where it
    supports the policy on CUDA, else ``eager``). Raises ValueError for an unknown name or a
    named backend that does not support the policy, saying why."""
    if name == "auto":
        static = BACKENDS["static"]
        return static if device.type == "cuda" and static.supports(policy, device) \
            else BACKENDS["eager"]
    if name not in BACKENDS:
        raise ValueError(f"sampling.backend={name!r} is unknown; expected one of "
                         f"{BACKEND_CHOICES}")
    backend = BACKENDS[name]
    reason = backend.unsupported_reason(policy, device)
    if reason is not None:
        raise ValueError(f"sampling.backend={name!r} cannot sample from this policy: {reason}; "
                         "use --backend auto or eager")
    return backend


def check_backend(cfg: SamplingConfig, policy: Policy, device: torch.device) -> None:
    """Raise ValueError before any work when ``cfg.backend`` cannot serve ``policy``."""
    resolve(cfg.backend, policy, device)
