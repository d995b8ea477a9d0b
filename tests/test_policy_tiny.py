"""`TinyTransformer`: cached decoding equals the full forward; padding is invisible (under both
initialisations, `TinyConfig.embed_init`)."""

from __future__ import annotations

import pytest
import torch

from rlscope.policy.base import Policy
from rlscope.policy.tiny import KVCache, TinyConfig, TinyTransformer

VOCAB = 7
MAX_LEN = 32
PROMPT_LENS = (3, 5, 7)
N_DECODE = 6
ATOL = 1e-5


@pytest.fixture(params=["reference", "balanced"])
def policy(request: pytest.FixtureRequest) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(TinyConfig(vocab_size=VOCAB, max_len=MAX_LEN,
                                      embed_init=request.param)).eval()


def _ragged_batch(seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor,
                                          torch.Tensor]:
    """Prompts of PROMPT_LENS, left-padded with token 0; plus N_DECODE tokens per row."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in PROMPT_LENS]
    T = max(PROMPT_LENS)
    tokens_BT = torch.zeros(len(prompts), T, dtype=torch.long)
    mask_BT = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens_BT[i, T - len(p):] = p
        mask_BT[i, T - len(p):] = 1
    gen_BN = torch.randint(0, VOCAB, (len(prompts), N_DECODE), generator=g)
    return prompts, tokens_BT, mask_BT, gen_BN


def test_protocol(policy: TinyTransformer) -> None:
    assert isinstance(policy, Policy)
    assert policy.vocab_size == VOCAB
    assert policy.hidden_size == 64


def test_cached_decode_matches_full_forward_and_unpadded(policy: TinyTransformer) -> None:
    prompts, tokens_BT, mask_BT, gen_BN = _ragged_batch()
    B, T = tokens_BT.shape
    full_tokens_BT = torch.cat([tokens_BT, gen_BN], dim=1)
    full_mask_BT = torch.cat([mask_BT, torch.ones_like(gen_BN)], dim=1)

    with torch.no_grad():
        full_logits_BTV, _ = policy(full_tokens_BT, full_mask_BT)
        alone_logits = [
            policy(torch.cat([p, gen_BN[i]])[None])[0][0] for i, p in enumerate(prompts)
        ]
        cache = policy.init_cache(B, T + N_DECODE)
        assert isinstance(cache, KVCache)
        step_logits = [policy.prefill(tokens_BT, mask_BT, cache)]
        step_logits += [policy.decode_step(gen_BN[:, t], cache) for t in range(N_DECODE)]

    assert full_logits_BTV.shape == (B, T + N_DECODE, VOCAB)
    assert cache.length == T + N_DECODE
    assert cache.next_pos_B.tolist() == [n + N_DECODE for n in PROMPT_LENS]
    for k, logits_BV in enumerate(step_logits):
        assert logits_BV.shape == (B, VOCAB)
        torch.testing.assert_close(logits_BV, full_logits_BTV[:, T - 1 + k], atol=ATOL, rtol=0)
        for i, n in enumerate(PROMPT_LENS):
            torch.testing.assert_close(
                logits_BV[i], alone_logits[i][n - 1 + k], atol=ATOL, rtol=0
            )
    for i, n in enumerate(PROMPT_LENS):
        torch.testing.assert_close(
            full_logits_BTV[i, T - n:], alone_logits[i], atol=ATOL, rtol=0
        )


def test_unpadded_prefill_matches_full_forward(policy: TinyTransformer) -> None:
    g = torch.Generator().manual_seed(1)
    tokens_BT = torch.randint(0, VOCAB, (2, 9), generator=g)
    with torch.no_grad():
        full_BTV, _ = policy(tokens_BT)
        cache = policy.init_cache(2, 9)
        logits = [policy.prefill(tokens_BT[:, :4], None, cache)]
        logits += [policy.decode_step(tokens_BT[:, t], cache) for t in range(4, 9)]
    assert not cache.padded
    for k, logits_BV in enumerate(logits):
        torch.testing.assert_close(logits_BV, full_BTV[:, 3 + k], atol=ATOL, rtol=0)


def test_hidden_through_head_equals_logits(policy: TinyTransformer) -> None:
    _, tokens_BT, mask_BT, _ = _ragged_batch(seed=2)
    with torch.no_grad():
        for mask in (mask_BT, None):
            logits_BTV, hidden_BTD = policy(tokens_BT, mask)
            assert hidden_BTD.shape == (*tokens_BT.shape, policy.hidden_size)
            torch.testing.assert_close(policy.head(hidden_BTD), logits_BTV, atol=1e-6, rtol=0)


def test_longer_than_max_len_raises(policy: TinyTransformer) -> None:
    tokens_BT = torch.zeros(1, MAX_LEN + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="max_len"):
        policy(tokens_BT)
    with pytest.raises(ValueError, match="max_len"):
        policy(tokens_BT, torch.ones_like(tokens_BT))
    with pytest.raises(ValueError, match="max_len"):
        policy.init_cache(1, MAX_LEN + 1)
    policy(tokens_BT[:, :MAX_LEN])  # exactly max_len is fine
    cache = policy.init_cache(1, 4)
    with torch.no_grad():
        policy.prefill(tokens_BT[:, :3], None, cache)
        policy.decode_step(tokens_BT[:, 0], cache)
        with pytest.raises(ValueError, match="full"):
            policy.decode_step(tokens_BT[:, 0], cache)


@pytest.mark.parametrize("padded", [True, False])
def test_static_decode_matches_dynamic_decode(policy: TinyTransformer, padded: bool) -> None:
    """`decode_step_static` (whole cache, validity mask, device write index: what the CUDA
    graphs replay) gives the logits of `decode_step`, also when the cache is reused."""
    _, tokens_BT, mask_BT, gen_BN = _ragged_batch(seed=3)
    mask = mask_BT if padded else None
    B, T = tokens_BT.shape
    static = policy.init_cache(B, T + N_DECODE, static=True)
    with torch.no_grad():
        for _ in range(2):
            static.length = 0
            got = [policy.prefill(tokens_BT, mask, static)]
            got += [policy.decode_step_static(gen_BN[:, t], static) for t in range(N_DECODE)]
            cache = policy.init_cache(B, T + N_DECODE)
            want = [policy.prefill(tokens_BT, mask, cache)]
            want += [policy.decode_step(gen_BN[:, t], cache) for t in range(N_DECODE)]
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
            assert int(static.pos) == T + N_DECODE
            assert torch.equal(static.next_pos_B, cache.next_pos_B)
    with pytest.raises(ValueError, match="static"):
        policy.decode_step_static(gen_BN[:, 0], cache)


def test_shared_prefix_forward_equals_full_forward_values_and_gradients() -> None:
    """Each group's prompt computed once gives the full forward's logits, hidden states and
    parameter gradients (fp64, to rounding)."""
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=5, max_len=32)).double()
    G, K, P, C = 3, 4, 6, 5
    prompt_GP = torch.randint(0, 5, (G, P))
    cont_BC = torch.randint(0, 5, (G * K, C))
    full_logits, full_hidden = policy(torch.cat([prompt_GP.repeat_interleave(K, 0), cont_BC], 1))
    shared_logits, shared_hidden = policy.forward_shared_prefix(prompt_GP, cont_BC)
    torch.testing.assert_close(shared_logits, full_logits[:, P - 1:], atol=1e-12, rtol=0)
    torch.testing.assert_close(shared_hidden, full_hidden[:, P - 1:], atol=1e-12, rtol=0)
    weights = torch.randn_like(shared_logits)
    grads = []
    for logits in (full_logits[:, P - 1:], shared_logits):
        policy.zero_grad()
        (logits * weights).sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in policy.parameters()])
    for g_full, g_shared in zip(*grads, strict=True):
        torch.testing.assert_close(g_shared, g_full, atol=1e-10, rtol=0)


def test_shared_prefix_rejects_ragged_groups() -> None:
    policy = TinyTransformer(TinyConfig(vocab_size=5, max_len=32))
    with pytest.raises(ValueError, match="equal groups"):
        policy.forward_shared_prefix(torch.zeros(2, 3, dtype=torch.long),
                                     torch.zeros(5, 2, dtype=torch.long))
