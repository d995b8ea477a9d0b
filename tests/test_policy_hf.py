"""`HFPolicy` on tiny random Llama/Qwen2 models: cached decoding and padding invariance."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from rlscope.policy.base import Policy
from rlscope.policy.hf import HFCache, HFPolicy, tiny_hf_model

VOCAB = 50
PROMPT_LENS = (3, 5, 7)
N_DECODE = 6
ATOL = 1e-5
ARCHS = ("llama", "qwen2")


def _ragged_batch(seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor,
                                          torch.Tensor]:
    """Prompts of PROMPT_LENS, left-padded with token 0; plus N_DECODE tokens per row."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g) for n in PROMPT_LENS]
    T = max(PROMPT_LENS)
    tokens_BT = torch.zeros(len(prompts), T, dtype=torch.long)
    mask_BT = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens_BT[i, T - len(p):] = p
        mask_BT[i, T - len(p):] = 1
    gen_BN = torch.randint(0, VOCAB, (len(prompts), N_DECODE), generator=g)
    return prompts, tokens_BT, mask_BT, gen_BN


@pytest.fixture(params=[(a, impl) for a in ARCHS for impl in ("sdpa", "eager")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def policy(request: pytest.FixtureRequest) -> HFPolicy:
    arch, impl = request.param
    return HFPolicy(tiny_hf_model(arch, VOCAB, seed=0, attn_implementation=impl))


def test_attributes_and_protocol(policy: HFPolicy) -> None:
    assert isinstance(policy, Policy)
    assert policy.vocab_size == VOCAB
    assert policy.hidden_size == 64
    assert policy.unwrap() is policy.model
    assert not policy.training
    assert next(policy.parameters()).dtype == torch.float32


def test_cached_decode_matches_full_forward_and_unpadded(policy: HFPolicy) -> None:
    prompts, tokens_BT, mask_BT, gen_BN = _ragged_batch()
    B, T = tokens_BT.shape
    full_tokens_BT = torch.cat([tokens_BT, gen_BN], dim=1)
    full_mask_BT = torch.cat([mask_BT, torch.ones_like(gen_BN)], dim=1)

    with torch.no_grad():
        full_logits_BTV, _ = policy(full_tokens_BT, full_mask_BT)
        # Each prompt alone (no padding, no mask), followed by the same generated tokens.
        alone_logits = [
            policy(torch.cat([p, gen_BN[i]])[None])[0][0] for i, p in enumerate(prompts)
        ]
        cache = policy.init_cache(B, T + N_DECODE)
        assert isinstance(cache, HFCache)
        step_logits = [policy.prefill(tokens_BT, mask_BT, cache)]
        for t in range(N_DECODE - 1):
            step_logits.append(policy.decode_step(gen_BN[:, t], cache))
        step_logits.append(policy.decode_step(gen_BN[:, N_DECODE - 1], cache))

    assert full_logits_BTV.dtype == torch.float32
    assert full_logits_BTV.shape == (B, T + N_DECODE, VOCAB)
    assert cache.length == T + N_DECODE
    assert cache.attention_mask_BT.shape == (B, T + N_DECODE)
    assert torch.equal(cache.attention_mask_BT, full_mask_BT)
    assert cache.next_pos_B.tolist() == [n + N_DECODE for n in PROMPT_LENS]
    for k, logits_BV in enumerate(step_logits):
        assert logits_BV.shape == (B, VOCAB)
        assert logits_BV.dtype == torch.float32
        pos = T - 1 + k  # prefill returns position T-1, decode step k returns position T-1+k
        torch.testing.assert_close(logits_BV, full_logits_BTV[:, pos], atol=ATOL, rtol=0)
        for i, n in enumerate(PROMPT_LENS):
            torch.testing.assert_close(
                logits_BV[i], alone_logits[i][n - 1 + k], atol=ATOL, rtol=0
            )
    # The padded full forward also matches each prompt alone on every real position.
    for i, n in enumerate(PROMPT_LENS):
        torch.testing.assert_close(
            full_logits_BTV[i, T - n:], alone_logits[i], atol=ATOL, rtol=0
        )


def test_unpadded_prefill_matches_full_forward(policy: HFPolicy) -> None:
    g = torch.Generator().manual_seed(1)
    tokens_BT = torch.randint(0, VOCAB, (2, 9), generator=g)
    with torch.no_grad():
        full_BTV, _ = policy(tokens_BT)
        cache = policy.init_cache(2, 9)
        logits = [policy.prefill(tokens_BT[:, :4], None, cache)]
        for t in range(4, 9):
            logits.append(policy.decode_step(tokens_BT[:, t], cache))
    assert not cache.padded
    for k, logits_BV in enumerate(logits):
        torch.testing.assert_close(logits_BV, full_BTV[:, 3 + k], atol=ATOL, rtol=0)


def test_hidden_through_lm_head_equals_logits(policy: HFPolicy) -> None:
    _, tokens_BT, mask_BT, _ = _ragged_batch(seed=2)
    with torch.no_grad():
        for mask in (mask_BT, None):
            logits_BTV, hidden_BTD = policy(tokens_BT, mask)
            assert hidden_BTD.shape == (*tokens_BT.shape, policy.hidden_size)
            head = policy.unwrap().get_output_embeddings()
            torch.testing.assert_close(head(hidden_BTD).float(), logits_BTV, atol=1e-6, rtol=0)


def test_bad_inputs_raise(policy: HFPolicy) -> None:
    tokens_BT = torch.randint(0, VOCAB, (2, 4))
    with pytest.raises(ValueError, match="2-D"):
        policy(tokens_BT[0])
    with pytest.raises(ValueError, match="integer"):
        policy(tokens_BT.float())
    with pytest.raises(ValueError, match="does not match"):
        policy(tokens_BT, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        policy(torch.zeros(1, 129, dtype=torch.long))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        policy.init_cache(1, 129)
    cache = policy.init_cache(2, 5)
    with pytest.raises(ValueError, match="prefill first"):
        policy.decode_step(tokens_BT[:, 0], cache)
    with pytest.raises(ValueError, match="max_len"):
        policy.prefill(torch.zeros(2, 6, dtype=torch.long), None, cache)
    with pytest.raises(ValueError, match="rows"):
        policy.prefill(tokens_BT[:1], None, cache)
    with torch.no_grad():
        policy.prefill(tokens_BT, None, cache)
        with pytest.raises(ValueError, match="empty cache"):
            policy.prefill(tokens_BT, None, cache)
        with pytest.raises(ValueError, match="1-D"):
            policy.decode_step(tokens_BT, cache)
        policy.decode_step(tokens_BT[:, 0], cache)
        with pytest.raises(ValueError, match="full"):
            policy.decode_step(tokens_BT[:, 0], cache)


def test_tiny_hf_model_is_deterministic_and_validates_arch() -> None:
    a = tiny_hf_model("llama", VOCAB, seed=3)
    b = tiny_hf_model("llama", VOCAB, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    with pytest.raises(ValueError, match="unknown arch"):
        tiny_hf_model("gpt2", VOCAB)


def test_peft_wrapped_model_decodes_like_full_forward() -> None:
    peft = pytest.importorskip("peft")
    base = tiny_hf_model("qwen2", VOCAB, seed=4)
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    policy = HFPolicy(peft.get_peft_model(base, lora)).eval()
    _, tokens_BT, mask_BT, gen_BN = _ragged_batch(seed=5)
    T = tokens_BT.shape[1]
    with torch.no_grad():
        full_BTV, _ = policy(torch.cat([tokens_BT, gen_BN], 1),
                             torch.cat([mask_BT, torch.ones_like(gen_BN)], 1))
        cache = policy.init_cache(len(PROMPT_LENS), T + N_DECODE)
        logits = [policy.prefill(tokens_BT, mask_BT, cache)]
        logits += [policy.decode_step(gen_BN[:, t], cache) for t in range(N_DECODE)]
    for k, logits_BV in enumerate(logits):
        torch.testing.assert_close(logits_BV, full_BTV[:, T - 1 + k], atol=ATOL, rtol=0)
