"""`generate`: reproducible counter-based sampling, temperature / top-k / top-p, stop tokens.

Every check compares the sampler with an independent path: the full teacher-forced forward over
the generated sequence, a plain-Python reference of the top-k / nucleus sets, the same prompt
sampled alone, the uncached decoder, or the empirical frequencies of many draws.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling import SamplingConfig, generate

VOCAB = 7
MAX_LEN = 32
PROMPT_LENS = (3, 5, 7)
N_NEW = 8
ATOL = 1e-5


@pytest.fixture(scope="module")
def policy() -> TinyTransformer:
    torch.manual_seed(0)
    # The balanced init: its fresh head gives nearly flat distributions (the reference init's
    # N(0, 1)·√d token embeddings make them nearly one-hot); sharpen them so top-k / top-p sets
    # are neither everything nor one token.
    model = TinyTransformer(TinyConfig(vocab_size=VOCAB, max_len=MAX_LEN,
                                       embed_init="balanced")).eval()
    with torch.no_grad():
        model.head.weight.mul_(4.0)
    return model


def _ragged(seed: int = 0, lens: tuple[int, ...] = PROMPT_LENS
            ) -> tuple[list[torch.Tensor], PromptBatch]:
    """Prompts of ``lens`` and their left-padded batch (pad id 0, attention mask)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in lens]
    return prompts, PromptBatch.left_padded(prompts)


def _seeds(n: int, offset: int = 0) -> torch.Tensor:
    return torch.arange(n, dtype=torch.long) * 7919 + 12345 + offset


@torch.no_grad()
def _full_logits(policy: torch.nn.Module, out: RolloutBatch) -> torch.Tensor:
    """Teacher-forced logits that predicted each completion token, ``[B, T, V]``."""
    tokens_BL, mask_BL = out.full_tokens()
    logits_BLV = policy(tokens_BL, mask_BL)[0].double()
    P, T = out.prompt_len, out.completion_tokens_BT.shape[1]
    return logits_BLV[:, P - 1:P - 1 + T]


def _reference_keep(logits_V: list[float], temperature: float, top_k: int,
                    top_p: float) -> list[bool]:
    """Plain-Python top-k then top-p set of one position (ties broken by the lower index)."""
    V = len(logits_V)
    order = sorted(range(V), key=lambda v: (-logits_V[v], v))
    if 0 < top_k < V:
        order = order[:top_k]
    weights = {v: math.exp((logits_V[v] - logits_V[order[0]]) / temperature) for v in order}
    total = sum(weights.values())
    keep = [False] * V
    mass = 0.0
    for v in order:
        if top_p < 1.0 and mass >= top_p:
            break
        keep[v] = True
        mass += weights[v] / total
    return keep


def _reference_keep_BTV(logits_BTV: torch.Tensor, temperature: float, top_k: int,
                        top_p: float) -> torch.Tensor:
    B, T, _ = logits_BTV.shape
    rows = [[_reference_keep(logits_BTV[b, t].tolist(), temperature, top_k, top_p)
             for t in range(T)] for b in range(B)]
    return torch.tensor(rows, dtype=torch.bool)


def test_same_seeds_same_rollout_other_seeds_differ(policy: TinyTransformer) -> None:
    _, prompts = _ragged()
    cfg = SamplingConfig(temperature=1.0)
    a = generate(policy, prompts, cfg, _seeds(3), N_NEW)
    b = generate(policy, prompts, cfg, _seeds(3), N_NEW)
    c = generate(policy, prompts, cfg, _seeds(3, offset=1), N_NEW)
    assert torch.equal(a.completion_tokens_BT, b.completion_tokens_BT)
    assert torch.equal(a.logp_sampler_BT, b.logp_sampler_BT)
    assert torch.equal(a.logp_raw_BT, b.logp_raw_BT)
    for i in range(3):
        assert not torch.equal(a.completion_tokens_BT[i], c.completion_tokens_BT[i])


def test_greedy_is_argmax_and_tiny_temperature_is_greedy(policy: TinyTransformer) -> None:
    _, prompts = _ragged()
    greedy = generate(policy, prompts, SamplingConfig(temperature=0.0), _seeds(3), N_NEW)
    logits_BTV = _full_logits(policy, greedy)
    assert torch.equal(greedy.completion_tokens_BT, logits_BTV.argmax(-1))
    # Greedy decoding reports the raw policy's log-probs for both tensors.
    torch.testing.assert_close(greedy.logp_sampler_BT, greedy.logp_raw_BT, atol=0, rtol=0)
    assert greedy.keep_mask_BTV is None
    cold = generate(policy, prompts, SamplingConfig(temperature=1e-4), _seeds(3), N_NEW)
    assert torch.equal(cold.completion_tokens_BT, greedy.completion_tokens_BT)
    # At T = 1e-4 the argmax token carries essentially all the mass.
    assert cold.logp_sampler_BT.abs().max() < 1e-3
    torch.testing.assert_close(cold.logp_raw_BT, greedy.logp_raw_BT, atol=ATOL, rtol=0)


FILTERS = [(1.0, 0, 1.0), (0.7, 3, 1.0), (0.7, 0, 0.8), (1.3, 4, 0.7), (1.0, 1, 1.0)]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), FILTERS,
                         ids=[f"T{t}-k{k}-p{p}" for t, k, p in FILTERS])
def test_filters_and_logprobs_match_full_forward(policy: TinyTransformer, temperature: float,
                                                 top_k: int, top_p: float) -> None:
    _, prompts = _ragged(seed=1, lens=(4, 6, 2, 5, 6, 3))
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    out = generate(policy, prompts, cfg, _seeds(6), N_NEW)
    tokens_BT = out.completion_tokens_BT
    assert tokens_BT.shape == (6, N_NEW)
    assert torch.equal(out.completion_mask_BT, torch.ones(6, N_NEW))
    assert not out.finished_by_stop_B.any()
    logits_BTV = _full_logits(policy, out)
    ref_keep_BTV = _reference_keep_BTV(logits_BTV, temperature, top_k, top_p)
    chosen_BT = ref_keep_BTV.gather(-1, tokens_BT[..., None])[..., 0]
    assert chosen_BT.all(), "a sampled token lies outside the top-k / nucleus set"
    if top_k or top_p < 1.0:
        assert out.keep_mask_BTV is not None
        assert torch.equal(out.keep_mask_BTV, ref_keep_BTV)
        kept_B_T = ref_keep_BTV.sum(-1)
        assert kept_B_T.max() < VOCAB, "the filter never removed a token: test is vacuous"
        if top_k:
            assert kept_B_T.max() <= top_k
            # Independent of the reference: each sample's logit is among the k largest.
            kth_BT = logits_BTV.topk(top_k, dim=-1).values[..., -1]
            chosen_logit_BT = logits_BTV.gather(-1, tokens_BT[..., None])[..., 0]
            assert (chosen_logit_BT >= kth_BT - 1e-6).all()
        if top_k == 1:
            assert torch.equal(tokens_BT, logits_BTV.argmax(-1))
    else:
        assert out.keep_mask_BTV is None
    scaled_BTV = (logits_BTV / temperature).masked_fill(~ref_keep_BTV, float("-inf"))
    expected_sampler_BT = scaled_BTV.log_softmax(-1).gather(-1, tokens_BT[..., None])[..., 0]
    expected_raw_BT = logits_BTV.log_softmax(-1).gather(-1, tokens_BT[..., None])[..., 0]
    torch.testing.assert_close(out.logp_sampler_BT.double(), expected_sampler_BT,
                               atol=ATOL, rtol=0)
    torch.testing.assert_close(out.logp_raw_BT.double(), expected_raw_BT, atol=ATOL, rtol=0)
    if top_k == 1:
        assert torch.equal(out.logp_sampler_BT, torch.zeros(6, N_NEW))


def _first_index(row: list[int], stops: set[int]) -> int | None:
    return next((t for t, tok in enumerate(row) if tok in stops), None)


@pytest.mark.parametrize("top_k", [0, 2], ids=["unfiltered", "top_k2"])
def test_stop_tokens_end_rows_and_mask_the_rest(policy: TinyTransformer, top_k: int) -> None:
    _, prompts = _ragged(seed=3, lens=(4, 6, 2, 5, 6, 3, 4, 5))
    B, pad, stops = 8, 6, (2, 5)
    free = generate(policy, prompts, SamplingConfig(top_k=top_k), _seeds(B), N_NEW)
    out = generate(policy, prompts, SamplingConfig(top_k=top_k, stop_token_ids=stops),
                   _seeds(B), N_NEW, pad_token_id=pad)
    lengths, stopped = [], []
    for row in free.completion_tokens_BT.tolist():
        first = _first_index(row, set(stops))
        stopped.append(first is not None)
        lengths.append(N_NEW if first is None else first + 1)
    assert any(stopped) and not all(stopped), "need rows of both finish reasons"
    assert any(n < N_NEW for n in lengths)
    T = out.completion_tokens_BT.shape[1]
    assert T == max(lengths) <= N_NEW
    assert out.finished_by_stop_B.tolist() == stopped
    for i, n in enumerate(lengths):
        row = out.completion_tokens_BT[i]
        # The row's draws do not depend on stopping: counter-based noise and an equal prefix.
        assert torch.equal(row[:n], free.completion_tokens_BT[i, :n])
        assert torch.equal(row[n:], torch.full((T - n,), pad))
        assert out.completion_mask_BT[i].tolist() == [1.0] * n + [0.0] * (T - n)
        masked = row[:n].tolist()
        assert sum(tok in stops for tok in masked) == (1 if stopped[i] else 0)
        if stopped[i]:
            assert masked[-1] in stops
        torch.testing.assert_close(out.logp_sampler_BT[i, :n], free.logp_sampler_BT[i, :n],
                                   atol=ATOL, rtol=0)
        assert torch.equal(out.logp_sampler_BT[i, n:], torch.zeros(T - n))
        assert torch.equal(out.logp_raw_BT[i, n:], torch.zeros(T - n))
        if top_k:
            assert out.keep_mask_BTV is not None and free.keep_mask_BTV is not None
            assert torch.equal(out.keep_mask_BTV[i, :n], free.keep_mask_BTV[i, :n])
            # After the stop the pad token is emitted: everything is kept there, so its
            # log-prob is finite and the learner replaying this mask never meets -inf.
            assert out.keep_mask_BTV[i, n:].all()
    assert not free.finished_by_stop_B.any()
    if top_k:
        assert free.keep_mask_BTV is not None
        dead_BT = out.completion_mask_BT == 0
        pad_kept_BT = free.keep_mask_BTV[:, :T, pad]
        assert (dead_BT & ~pad_kept_BT).any(), "pad never outside the kept set: test is vacuous"


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 0), (0.7, 3)],
                         ids=["unfiltered", "T0.7-k3"])
def test_recorded_sum_p2_is_that_of_the_sampling_distribution(policy: TinyTransformer,
                                                              temperature: float,
                                                              top_k: int) -> None:
    """``with_sum_p2`` records Σ_v μ(v | prefix)² of the processed distribution (temperature
    and kept set), 0 after a stop, and changes nothing else in the rollout."""
    _, prompts = _ragged(seed=3, lens=(4, 6, 2, 5, 6, 3, 4, 5))
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, stop_token_ids=(2, 5))
    plain = generate(policy, prompts, cfg, _seeds(8), N_NEW)
    out = generate(policy, prompts, cfg, _seeds(8), N_NEW, with_sum_p2=True)
    assert plain.sum_p2_sampler_BT is None and out.sum_p2_sampler_BT is not None
    assert torch.equal(out.completion_tokens_BT, plain.completion_tokens_BT)
    assert torch.equal(out.logp_sampler_BT, plain.logp_sampler_BT)
    mask_BT = out.completion_mask_BT
    assert (mask_BT == 0).any(), "no row stopped early: test is vacuous"
    logits_BTV = _full_logits(policy, out)
    keep_BTV = _reference_keep_BTV(logits_BTV, temperature, top_k, 1.0)
    mu_BTV = (logits_BTV / temperature).masked_fill(~keep_BTV, float("-inf")).softmax(-1)
    expected_BT = mu_BTV.square().sum(-1) * mask_BT
    torch.testing.assert_close(out.sum_p2_sampler_BT.double(), expected_BT, atol=ATOL, rtol=0)
    # a distribution over V = 7 symbols: 1/7 <= Σμ² <= 1 wherever a token was generated
    alive = out.sum_p2_sampler_BT[mask_BT.bool()]
    assert (alive >= 1 / VOCAB - ATOL).all() and (alive <= 1 + ATOL).all()


def test_every_row_stops_at_once(policy: TinyTransformer) -> None:
    _, prompts = _ragged()
    out = generate(policy, prompts, SamplingConfig(stop_token_ids=tuple(range(VOCAB))),
                   _seeds(3), N_NEW)
    assert out.completion_tokens_BT.shape == (3, 1)
    assert torch.equal(out.completion_mask_BT, torch.ones(3, 1))
    assert out.finished_by_stop_B.all()


def test_length_limit_never_exceeded_and_unstopped_rows_finish_by_length(
        policy: TinyTransformer) -> None:
    _, prompts = _ragged()
    for n_new in (1, 3):
        # Token id VOCAB is never sampled, so no row can stop.
        out = generate(policy, prompts, SamplingConfig(stop_token_ids=(VOCAB,)), _seeds(3),
                       n_new)
        assert out.completion_tokens_BT.shape == (3, n_new)
        assert torch.equal(out.completion_mask_BT, torch.ones(3, n_new))
        assert not out.finished_by_stop_B.any()


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0),
                                 SamplingConfig(temperature=0.8, top_p=0.9),
                                 SamplingConfig(temperature=1.2, top_k=3, stop_token_ids=(4,))],
                         ids=["plain", "top_p", "top_k-stop"])
def test_ragged_batch_equals_each_prompt_alone(policy: TinyTransformer,
                                               cfg: SamplingConfig) -> None:
    prompts, batch = _ragged(seed=4)
    seeds_B = _seeds(3, offset=5)
    out = generate(policy, batch, cfg, seeds_B, N_NEW)
    for i, p in enumerate(prompts):
        alone = generate(policy, PromptBatch(tokens_BP=p[None]), cfg, seeds_B[i:i + 1], N_NEW)
        n = int(alone.completion_mask_BT.sum())
        assert int(out.completion_mask_BT[i].sum()) == n
        assert bool(out.finished_by_stop_B[i]) == bool(alone.finished_by_stop_B[0])
        assert torch.equal(out.completion_tokens_BT[i, :n], alone.completion_tokens_BT[0, :n])
        torch.testing.assert_close(out.logp_sampler_BT[i, :n], alone.logp_sampler_BT[0, :n],
                                   atol=ATOL, rtol=0)
        torch.testing.assert_close(out.logp_raw_BT[i, :n], alone.logp_raw_BT[0, :n],
                                   atol=ATOL, rtol=0)
        if out.keep_mask_BTV is not None:
            assert alone.keep_mask_BTV is not None
            assert torch.equal(out.keep_mask_BTV[i, :n], alone.keep_mask_BTV[0, :n])


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0),
                                 SamplingConfig(temperature=0.7, top_k=4, top_p=0.9,
                                                stop_token_ids=(1,))],
                         ids=["plain", "filtered-stop"])
def test_uncached_decoding_equals_cached(policy: TinyTransformer, cfg: SamplingConfig) -> None:
    _, prompts = _ragged(seed=5)
    seeds_B = _seeds(3, offset=9)
    cached = generate(policy, prompts, cfg, seeds_B, N_NEW)
    full = generate(policy, prompts, SamplingConfig(**{**cfg.__dict__, "use_cache": False}),
                    seeds_B, N_NEW)
    assert torch.equal(cached.completion_tokens_BT, full.completion_tokens_BT)
    assert torch.equal(cached.completion_mask_BT, full.completion_mask_BT)
    assert torch.equal(cached.finished_by_stop_B, full.finished_by_stop_B)
    torch.testing.assert_close(cached.logp_sampler_BT, full.logp_sampler_BT, atol=ATOL, rtol=0)
    torch.testing.assert_close(cached.logp_raw_BT, full.logp_raw_BT, atol=ATOL, rtol=0)


N_DRAWS = 20_000


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 0), (0.7, 3)], ids=["T1", "T0.7-k3"])
def test_first_token_frequencies_match_the_distribution(policy: TinyTransformer,
                                                        temperature: float, top_k: int) -> None:
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    prompts = PromptBatch(tokens_BP=prompt.expand(N_DRAWS, -1))
    cfg = SamplingConfig(temperature=temperature, top_k=top_k)
    out = generate(policy, prompts, cfg, torch.arange(N_DRAWS, dtype=torch.long), 1)
    with torch.no_grad():
        logits_V = policy(prompt)[0][0, -1].double() / temperature
    if top_k:
        logits_V = logits_V.masked_fill(logits_V < logits_V.topk(top_k).values[-1], -math.inf)
    probs_V = logits_V.softmax(-1)
    freq_V = torch.bincount(out.completion_tokens_BT[:, 0], minlength=VOCAB).double() / N_DRAWS
    assert probs_V.max() < 0.9, "a near-deterministic distribution would prove little"
    assert (freq_V - probs_V).abs().max() < 0.015
    assert (freq_V[probs_V == 0] == 0).all()
    # Pearson chi-square over tokens with mass; its 99.9% quantile at <= 6 d.o.f. is < 22.5.
    support = probs_V > 0
    chi2 = (N_DRAWS * (freq_V - probs_V)[support].square() / probs_V[support]).sum()
    assert chi2 < 22.5


# --------------------------------------------------------------------------- HF adapter

HF_VOCAB = 11


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def hf_policy(request: pytest.FixtureRequest) -> torch.nn.Module:
    pytest.importorskip("transformers")
    from rlscope.policy.hf import HFPolicy, tiny_hf_model

    model = tiny_hf_model(request.param, HF_VOCAB, seed=0, hidden_size=32, num_layers=1,
                          num_heads=2, max_len=MAX_LEN)
    return HFPolicy(model).eval()


def _hf_ragged(seed: int) -> tuple[list[torch.Tensor], PromptBatch]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, HF_VOCAB, (n,), generator=g) for n in PROMPT_LENS]
    return prompts, PromptBatch.left_padded(prompts)


def test_hf_same_seed_same_rollout(hf_policy: torch.nn.Module) -> None:
    _, prompts = _hf_ragged(seed=0)
    cfg = SamplingConfig(temperature=0.9, top_p=0.95)
    a = generate(hf_policy, prompts, cfg, _seeds(3), N_NEW)
    b = generate(hf_policy, prompts, cfg, _seeds(3), N_NEW)
    c = generate(hf_policy, prompts, cfg, _seeds(3, offset=1), N_NEW)
    assert torch.equal(a.completion_tokens_BT, b.completion_tokens_BT)
    assert torch.equal(a.logp_sampler_BT, b.logp_sampler_BT)
    assert not torch.equal(a.completion_tokens_BT, c.completion_tokens_BT)
    logits_BTV = _full_logits(hf_policy, a)
    expected_raw_BT = logits_BTV.log_softmax(-1).gather(-1, a.completion_tokens_BT[..., None])
    torch.testing.assert_close(a.logp_raw_BT.double(), expected_raw_BT[..., 0], atol=ATOL,
                               rtol=0)


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0),
                                 SamplingConfig(temperature=0.7, top_k=5, stop_token_ids=(3,))],
                         ids=["plain", "top_k-stop"])
def test_hf_ragged_batch_equals_each_prompt_alone(hf_policy: torch.nn.Module,
                                                  cfg: SamplingConfig) -> None:
    prompts, batch = _hf_ragged(seed=1)
    seeds_B = _seeds(3, offset=2)
    out = generate(hf_policy, batch, cfg, seeds_B, N_NEW)
    for i, p in enumerate(prompts):
        alone = generate(hf_policy, PromptBatch(tokens_BP=p[None]), cfg, seeds_B[i:i + 1],
                         N_NEW)
        n = int(alone.completion_mask_BT.sum())
        assert int(out.completion_mask_BT[i].sum()) == n
        assert torch.equal(out.completion_tokens_BT[i, :n], alone.completion_tokens_BT[0, :n])
        torch.testing.assert_close(out.logp_sampler_BT[i, :n], alone.logp_sampler_BT[0, :n],
                                   atol=ATOL, rtol=0)
        torch.testing.assert_close(out.logp_raw_BT[i, :n], alone.logp_raw_BT[0, :n],
                                   atol=ATOL, rtol=0)


def test_noise_at_late_steps_matches_the_tensor_path() -> None:
    """Past step ~187, ``(step + 1) * M1`` overflows int64: a Python-int step must wrap as a
    tensor step does (long completions, e.g. code_unit_tests' 256 tokens, reach it)."""
    from rlscope.sampling.processors import uniform_noise

    seeds_N1 = torch.tensor([[0], [7], [123456789]])
    steps = [0, 5, 187, 188, 255, 1000, 10**6]
    together_NTV = uniform_noise(seeds_N1, torch.tensor(steps), 11)
    for t, step in enumerate(steps):
        alone_NV = uniform_noise(seeds_N1[:, 0], step, 11)
        assert torch.equal(alone_NV, together_NTV[:, t]), step
        assert ((alone_NV > 0) & (alone_NV < 1)).all()


def test_zero_new_tokens_is_a_clear_error() -> None:
    """``max_new_tokens`` 0 is refused with a message (it used to fail inside torch.stack)."""
    policy = TinyTransformer(TinyConfig(vocab_size=8, max_len=16))
    prompts = PromptBatch(tokens_BP=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens=0 must be >= 1"):
        generate(policy, prompts, SamplingConfig(), torch.arange(2), 0)
