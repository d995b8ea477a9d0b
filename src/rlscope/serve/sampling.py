"""Batched sampling for the server: many requests' rows decoded together with a KV cache.

It reuses the engine's one-step `rlscope.sampling.draw.draw` and its counter-based noise
(`rlscope.sampling.processors.gumbel_offsets`), so a seeded row gets the same tokens whatever
batch it shares. On top of `rlscope.sampling.sampler.generate` it adds what the Tinker API
needs: a token budget per row, token-id stops and string stops (a row stops at the *first*
occurrence, and the tokens that complete it are kept exactly once), and prompt log-probs.

Returned log-probs are those of the distribution each token was drawn from (temperature, top-k
and top-p applied); at temperature 1 with no truncation they are the policy's own log-probs,
the numbers ``forward`` computes for the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlscope.policy.base import Policy
from rlscope.sampling.draw import SamplingConfig, draw
from rlscope.sampling.processors import gumbel_offsets
from rlscope.serve.state import UserError
from rlscope.serve.tokenizer_dir import TextCodec
from rlscope.serve.validate import get_bool, get_dict, get_float, get_int


@dataclass(frozen=True)
class SampleRow:
    """One sequence to sample: the prompt and how it ends."""

    prompt: list[int]
    max_tokens: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    seed: int
    """Seed of this row's counter-based noise stream."""


@dataclass(frozen=True)
class SampledRow:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    """``stop`` or ``length``."""


def _ends_with_stop(codec: TextCodec, tokens: list[int], stop_strings: tuple[str, ...],
                    prev_text_len: int) -> tuple[bool, int]:
    """Whether the decoded completion now contains a stop string that was not complete one
    token earlier; returns it with the current text length."""
    text = codec.decode(tokens)
    for s in stop_strings:
        pos = text.find(s, max(0, prev_text_len - len(s) + 1))
        if pos >= 0:
            return True, len(text)
    return False, len(text)


@torch.no_grad()
def sample_rows(policy: Policy, rows: Sequence[SampleRow], cfg: SamplingConfig,
                codec: TextCodec) -> list[SampledRow]:
    """Sample every row in one batch (left-padded prompts, KV-cached decoding).

    ``cfg`` holds temperature (0 = greedy), top-k (0 = off) and top-p shared by the batch.
    """
    if not rows:
        return []
    device = next(iter(policy.parameters())).device
    B = len(rows)
    P = max(len(r.prompt) for r in rows)
    budget = max(r.max_tokens for r in rows)
    tokens_BP = torch.zeros(B, P, dtype=torch.long, device=device)
    mask_BP = torch.zeros(B, P, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        tokens_BP[i, P - len(r.prompt):] = torch.tensor(r.prompt, dtype=torch.long)
        mask_BP[i, P - len(r.prompt):] = 1
    padded = bool((mask_BP == 0).any())
    seeds_B = torch.tensor([r.seed for r in rows], dtype=torch.long, device=device)
    out_tokens: list[list[int]] = [[] for _ in rows]
    out_logps: list[list[float]] = [[] for _ in rows]
    reasons = ["length"] * B
    text_len = [0] * B
    alive = [r.max_tokens > 0 for r in rows]
    if budget == 0:
        return [SampledRow([], [], "length") for _ in rows]
    cache = policy.init_cache(B, P + budget)
    logits_BV = policy.prefill(tokens_BP, mask_BP if padded else None, cache)
    greedy = cfg.temperature == 0
    for step in range(budget):
        alive_B = torch.tensor(alive, dtype=torch.bool, device=device)
        gumbel_BV = None if greedy else gumbel_offsets(seeds_B, step, logits_BV.shape[-1])
        d = draw(logits_BV, alive_B, gumbel_BV, cfg, 0, with_entropy=False)
        token_list = d.token_B.tolist()
        logp_list = d.logp_sampler_B.tolist()
        for i, r in enumerate(rows):
            if not alive[i]:
                continue
            tok = int(token_list[i])
            out_tokens[i].append(tok)
            out_logps[i].append(float(logp_list[i]))
            if tok in r.stop_ids:
                alive[i], reasons[i] = False, "stop"
                continue
            if r.stop_strings:
                hit, text_len[i] = _ends_with_stop(codec, out_tokens[i], r.stop_strings,
                                                   text_len[i])
                if hit:
                    alive[i], reasons[i] = False, "stop"
                    continue
            if len(out_tokens[i]) >= r.max_tokens:
                alive[i] = False
        if not any(alive):
            break
        logits_BV = policy.decode_step(d.token_B, cache)
    return [SampledRow(out_tokens[i], out_logps[i], reasons[i]) for i in range(B)]


TOPK_EMPTY_LOGPROB = -99999.0
"""The log-prob of an empty top-k cell (with token 0), as Tinker's ``TopkLogprobs`` marks it."""


@dataclass(frozen=True)
class PromptScores:
    """What a sample request asked for about its prompt."""

    logprobs: list[float] | None
    """``log p(prompt[i] | prompt[:i])`` per position, NaN where unscored (always at 0);
    None unless ``prompt_logprobs`` was asked for."""
    topk_ids: list[list[int]] | None = None
    """Per position, the ``k`` most likely next-token ids (most likely first); rows not
    scored hold token 0 (position 0 always). None unless ``topk_prompt_logprobs`` > 0."""
    topk_logprobs: list[list[float]] | None = None
    """Their log-probs; `TOPK_EMPTY_LOGPROB` in rows not scored."""


@torch.no_grad()
def prompt_scores(policy: Policy, prompt: list[int], last_n: int | None = None,
                  with_logprobs: bool = True, topk: int = 0) -> PromptScores:
    """One teacher-forced forward over ``prompt``: the log-prob of each prompt token (NaN at 0,
    which nothing predicts, and, with ``last_n``, before the last ``last_n`` positions) and, with
    ``topk`` > 0, the ``topk`` most likely tokens and their log-probs at each position
    (position i: the distribution that predicts ``prompt[i]``; empty rows where unscored)."""
    if not prompt:
        return PromptScores([] if with_logprobs else None,
                            [] if topk else None, [] if topk else None)
    device = next(iter(policy.parameters())).device
    tokens_1T = torch.tensor([prompt], dtype=torch.long, device=device)
    logits_1TV = policy.forward(tokens_1T, None)[0]
    logp_TV = logits_1TV[0, :-1].float().log_softmax(-1)  # row i predicts prompt[i + 1]
    start = 1 if last_n is None else max(1, len(prompt) - last_n)
    values: list[float] | None = None
    if with_logprobs:
        logp_T = logp_TV.gather(-1, tokens_1T[0, 1:, None])[:, 0]
        values = [math.nan, *logp_T.tolist()]
        values = [math.nan if i < start else v for i, v in enumerate(values)]
    if not topk:
        return PromptScores(values)
    top = logp_TV.topk(topk, dim=-1)
    empty_ids, empty_lps = [0] * topk, [TOPK_EMPTY_LOGPROB] * topk
    ids = [empty_ids, *top.indices.tolist()]
    lps = [empty_lps, *top.values.tolist()]
    ids = [row if i >= start else empty_ids for i, row in enumerate(ids)]
    lps = [row if i >= start else empty_lps for i, row in enumerate(lps)]
    return PromptScores(values, ids, lps)


@dataclass(frozen=True)
class SampleLimits:
    """Caps on one sample request (``--max_num_samples``, ``--max_sample_tokens``,
    ``--max_batch_tokens``)."""

    max_num_samples: int = 1024
    max_tokens: int = 4096
    max_batch_tokens: int = 2_000_000
    max_topk_logprobs: int = 64


def parse_sample_request(body: dict[str, Any], codec_eos: int | None, vocab: int,
                         max_len: int | None, prompt: list[int],
                         limits: SampleLimits | None = None) -> dict[str, Any]:
    """Validate an ``asample`` body into the dict `Engine.sample_batch` reads; raises
    UserError (naming the field) on bad, oversized or unsupported input."""
    limits = limits or SampleLimits()
    params = get_dict(body, "sampling_params", None) or {}
    num_samples = get_int(body, "num_samples", 1, lo=1, hi=limits.max_num_samples)
    if not prompt:
        raise UserError("the prompt is empty")
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise UserError(f"prompt token ids must lie in 0..{vocab - 1}")
    max_tokens = get_int(params, "max_tokens", None, lo=0, hi=limits.max_tokens)
    if max_len is not None and len(prompt) >= max_len:
        raise UserError(f"the prompt ({len(prompt)} tokens) fills the model's {max_len} "
                        "positions; nothing can be sampled (shorten the prompt, or serve a "
                        "model with a longer context, e.g. --tiny_max_len)")
    requested = max_tokens
    if max_tokens is None:
        max_tokens = max(0, min((max_len or 2048) - len(prompt), limits.max_tokens))
    elif max_len is not None and len(prompt) + max_tokens > max_len:
        # like a served model's context limit: sample what fits, and say so in the log
        max_tokens = max_len - len(prompt)
    total = num_samples * (len(prompt) + max_tokens)
    if total > limits.max_batch_tokens:
        raise UserError(f"num_samples × (prompt + max_tokens) = {total} tokens exceeds this "
                        f"server's cap of {limits.max_batch_tokens} (--max_batch_tokens); "
                        "split the request")
    stop = params.get("stop")
    stop_ids: set[int] = set()
    stop_strings: list[str] = []
    if stop is None:
        if codec_eos is not None:
            stop_ids.add(int(codec_eos))
    elif isinstance(stop, str):
        if not stop:
            raise UserError("field 'stop': an empty stop string would stop at once")
        stop_strings.append(stop)
    elif isinstance(stop, list):
        if len(stop) > 64:
            raise UserError("field 'stop' may hold at most 64 entries")
        for s in stop:
            if isinstance(s, bool) or not isinstance(s, (int, str)):
                raise UserError(f"field 'stop': entries must be token ids or strings, got {s!r}")
            if isinstance(s, str):
                if not s:
                    raise UserError("field 'stop': an empty stop string would stop at once")
                if len(s) > 1024:
                    raise UserError("field 'stop': a stop string is longer than 1024 characters")
                stop_strings.append(s)
            else:
                stop_ids.add(int(s))
    else:
        raise UserError(f"field 'stop' must be null, a string or a list, got {stop!r}")
    temperature = get_float(params, "temperature", 1.0, lo=0.0)
    top_k = get_int(params, "top_k", -1, lo=-1)
    top_p = get_float(params, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise UserError(f"field 'top_p' must lie in (0, 1], got {top_p}")
    if top_k == 0:
        raise UserError("field 'top_k' must be -1 (off) or >= 1, got 0")
    for key in ("topk_sample_logprobs", "prompt_alt_tokens_k"):
        if (get_int(body, key, 0) or 0) > 0:
            raise UserError(f"{key} > 0 is not supported by rlscope serve")
    topk = int(get_int(body, "topk_prompt_logprobs", 0,
                       lo=0, hi=min(limits.max_topk_logprobs, vocab)) or 0)
    if topk and len(prompt) * topk > limits.max_batch_tokens:
        raise UserError(f"len(prompt) × topk_prompt_logprobs = {len(prompt) * topk} exceeds "
                        f"this server's cap of {limits.max_batch_tokens} (--max_batch_tokens)")
    if body.get("target_prompt_logprobs") is not None:
        raise UserError("target_prompt_logprobs is not supported by rlscope serve")
    seed = get_int(params, "seed", None)
    last_n = get_int(body, "prompt_logprobs_last_n", None, lo=0)
    return {
        "prompt": prompt, "num_samples": num_samples, "max_tokens": max_tokens,
        "stop_ids": frozenset(stop_ids), "stop_strings": tuple(stop_strings),
        "temperature": temperature, "top_k": 0 if top_k == -1 else top_k, "top_p": top_p,
        "seed": seed,
        "prompt_logprobs": bool(get_bool(body, "prompt_logprobs", False)),
        "prompt_logprobs_last_n": last_n,
        "topk_prompt_logprobs": topk,
        "max_tokens_requested": requested,
    }
