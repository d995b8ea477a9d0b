"""CUDA-graph replay of `generate` for the tiny transformer.

At sandbox sizes one decode step is ~70 kernels of a few microseconds each, and launching
them one by one from Python costs several times more than running them (~1 ms against
0.15 ms per token on an H200). A `GraphedDecoder`
records the sampler once as two CUDA graphs over static buffers and replays them:

- ``prefill``: reset the step counter and the alive mask, run the prompt into a static
  `KVCache`, compute the Gumbel offsets of every step at once, draw token 0;
- ``step``: feed the last token through `TinyTransformer.decode_step_static`, advance the step
  counter (a device tensor), draw the next token.

Every draw is `sampling.draw.draw`, written into column ``step`` of ``[B, T, ...]`` output
buffers, so the rollout is the eager sampler's: the same noise bit for bit, and logits that
differ from the eager cache path only by attention summing over a few more (zero-weight) keys,
~1e-7.

Graphs read the policy's parameters in place and so see every optimizer update. Decoders are
cached per policy in a weak dictionary (they die with it), one per (rows, prompt length,
completion length, padding, sampling config), and recaptured when the parameters move.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.base import Policy
from rlscope.policy.tiny import TinyTransformer
from rlscope.sampling.draw import Draw, SamplingConfig, assemble, draw
from rlscope.sampling.processors import gumbel_offsets

# policy -> (its parameters' addresses, {decoder key: decoder})
_DECODERS: weakref.WeakKeyDictionary[TinyTransformer, tuple[tuple[int, ...], dict]] = \
    weakref.WeakKeyDictionary()


def supported(policy: Policy, device: torch.device) -> bool:
    """Whether `generate` can replay graphs for this policy: the tiny transformer on CUDA."""
    return (isinstance(policy, TinyTransformer) and device.type == "cuda"
            and policy.head.weight.is_cuda and not torch.cuda.is_current_stream_capturing())


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """Run ``fn`` once on a side stream (lazy initialisation must not happen inside a
    capture), then record it as a CUDA graph. The warm-up's effects are the caller's."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def record_draw(out: dict[str, torch.Tensor], new_tokens: int, index_1: torch.Tensor,
                d: Draw, alive_B: torch.Tensor | None) -> None:
    """Write one draw into column ``index_1`` (a ``[1]`` device tensor) of the ``[B, T, ...]``
    buffers ``out`` (allocated on first use, so do that outside a capture): the token, the
    alive mask before the draw (None without stop tokens), the log-probs, the kept set, the
    entropy and Σμ² where recorded. Graph-safe; shared by every graphed decoder."""
    values = {"token": d.token_B, "alive": alive_B,
              "logp_sampler": d.logp_sampler_B,
              "logp_raw": None if d.logp_raw_B is d.logp_sampler_B else d.logp_raw_B,
              "keep": d.keep_BV, "entropy": d.entropy_B, "sum_p2": d.sum_p2_B}
    for name, value_B in values.items():
        if value_B is None:
            continue
        if name not in out:
            out[name] = value_B.new_zeros((value_B.shape[0], new_tokens, *value_B.shape[1:]))
        out[name].index_copy_(1, index_1, value_B.unsqueeze(1))


class GraphedDecoder:
    """`generate` for ``rows`` prompts of ``prompt_len`` tokens and ``new_tokens`` draws."""

    def __init__(self, policy: TinyTransformer, rows: int, prompt_len: int, new_tokens: int,
                 cfg: SamplingConfig, padded: bool, with_entropy: bool,
                 pad_token_id: int, with_sum_p2: bool = False) -> None:
        device = policy.head.weight.device
        B, P, T = rows, prompt_len, new_tokens
        self.cfg, self.new_tokens = cfg, T
        self.with_entropy, self.pad_token_id = with_entropy, pad_token_id
        self.with_sum_p2 = with_sum_p2
        self.greedy = cfg.temperature == 0
        self.stops = torch.tensor(cfg.stop_token_ids, device=device, dtype=torch.long)
        self.cache = policy.init_cache(B, P + T, static=True)
        self.tokens_BP = torch.zeros(B, P, dtype=torch.long, device=device)
        self.mask_BP = torch.ones(B, P, dtype=torch.long, device=device) if padded else None
        self.seeds_B = torch.zeros(B, dtype=torch.long, device=device)
        self.steps_T = torch.arange(T, device=device)
        self.gumbel_BTV = torch.zeros(B, T, policy.vocab_size, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.alive_B = torch.ones(B, dtype=torch.bool, device=device)
        self.token_B = torch.zeros(B, dtype=torch.long, device=device)
        self.out: dict[str, torch.Tensor] = {}
        """``[B, T, ...]`` per recorded quantity, allocated by the first (warm-up) draw."""
        # the graphs hold no reference to the policy, only its parameters' addresses
        self.prefill_graph = capture(lambda: self._prefill(policy))
        self.step_graph = capture(lambda: self._step(policy)) if T > 1 else None

    def _prefill(self, policy: TinyTransformer) -> None:
        self.step.zero_()
        self.alive_B.fill_(True)
        self.cache.length = 0  # prefill checks it; static decoding reads cache.pos instead
        logits_BV = policy.prefill(self.tokens_BP, self.mask_BP, self.cache)
        if not self.greedy:
            self.gumbel_BTV.copy_(gumbel_offsets(self.seeds_B[:, None], self.steps_T,
                                                 self.gumbel_BTV.shape[-1]))
        self._draw(logits_BV)

    def _step(self, policy: TinyTransformer) -> None:
        logits_BV = policy.decode_step_static(self.token_B, self.cache)
        self.step += 1
        self._draw(logits_BV)

    def _draw(self, logits_BV: torch.Tensor) -> None:
        index = self.step.view(1)
        gumbel_BV = None if self.greedy else self.gumbel_BTV.index_select(1, index)[:, 0]
        stops = bool(self.stops.numel())
        d = draw(logits_BV, self.alive_B if stops else None, gumbel_BV, self.cfg,
                 self.pad_token_id, self.with_entropy, self.with_sum_p2)
        record_draw(self.out, self.new_tokens, index, d, self.alive_B if stops else None)
        if stops:
            # = torch.isin, whose sorting path (long stop lists) cannot be captured
            self.alive_B &= ~(d.token_B[:, None] == self.stops).any(-1)
        self.token_B.copy_(d.token_B)

    def __call__(self, prompts: PromptBatch, row_seeds_B: torch.Tensor,
                 group_id_B: torch.Tensor | None) -> RolloutBatch:
        self.tokens_BP.copy_(prompts.tokens_BP)
        if self.mask_BP is not None:
            assert prompts.attention_mask_BP is not None
            self.mask_BP.copy_(prompts.attention_mask_BP)
        if not self.greedy:
            self.seeds_B.copy_(row_seeds_B)
        self.prefill_graph.replay()
        n = 1
        while n < self.new_tokens:
            if self.stops.numel() and not bool(self.alive_B.any()):
                break
            assert self.step_graph is not None
            self.step_graph.replay()
            n += 1
        out = {name: buf[:, :n] for name, buf in self.out.items()}
        keep = out.get("keep")
        return assemble(prompts,
                        tokens_BT=out["token"].clone(),
                        alive_BT=out.get("alive", self.alive_B[:, None].expand(-1, n)),
                        logp_sampler_BT=out["logp_sampler"],
                        logp_raw_BT=out.get("logp_raw", out["logp_sampler"]),
                        keep_BTV=keep.clone() if keep is not None else None,
                        entropy_BT=out.get("entropy"),
                        finished_by_stop_B=~self.alive_B if self.stops.numel() else
                        torch.zeros_like(self.alive_B),
                        group_id_B=group_id_B, sum_p2_BT=out.get("sum_p2"))


def generate_graphed(policy: Policy, prompts: PromptBatch, cfg: SamplingConfig,
                     row_seeds_B: torch.Tensor, max_new_tokens: int, pad_token_id: int,
                     group_id_B: torch.Tensor | None, with_entropy: bool,
                     with_sum_p2: bool = False) -> RolloutBatch:
    """`sampler.generate` through a cached `GraphedDecoder` (check `supported` first)."""
    assert isinstance(policy, TinyTransformer)
    B, P = prompts.tokens_BP.shape
    params = tuple(p.data_ptr() for p in policy.parameters())
    cached = _DECODERS.get(policy)
    if cached is None or cached[0] != params:
        cached = _DECODERS[policy] = (params, {})
    key = (B, P, max_new_tokens, prompts.attention_mask_BP is not None, cfg, with_entropy,
           pad_token_id, with_sum_p2)
    decoders = cached[1]
    if key not in decoders:
        decoders[key] = GraphedDecoder(policy, B, P, max_new_tokens, cfg,
                                       prompts.attention_mask_BP is not None, with_entropy,
                                       pad_token_id, with_sum_p2)
    return decoders[key](prompts, row_seeds_B, group_id_B)
