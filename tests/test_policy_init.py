"""`ModelConfig.embed_init`: the reference sandbox's model (PyTorch's default inits, as
`nn.TransformerEncoderLayer`) and the balanced embedding init, with the parameter count of the
token_reversal default model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rlscope.policy import ModelConfig, build_policy
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.tasks import make_task
from rlscope.tasks.base import make_policy_for

D = 64


def _tiny(embed_init: str, vocab: int = 50, max_len: int = 400) -> TinyTransformer:
    """Large tables so that the sample std is within a few percent of the population std."""
    torch.manual_seed(0)
    policy = build_policy(ModelConfig(embed_init=embed_init), vocab, max_len)  # type: ignore[arg-type]
    assert isinstance(policy, TinyTransformer)
    return policy


def test_token_reversal_default_model_has_101824_parameters() -> None:
    task = make_task("token_reversal")
    assert (task.vocab_size, task.prompt_len + task.completion_len) == (3, 21)
    policy = make_policy_for(task, ModelConfig())
    assert sum(p.numel() for p in policy.parameters()) == 101_824


def test_reference_is_the_default() -> None:
    # issue 15: every sandbox task and the evidence suite run under the reference sandbox's init
    assert ModelConfig().embed_init == "reference"
    assert TinyConfig().embed_init == "reference"


def test_reference_embeddings_are_pytorch_default() -> None:
    policy = _tiny("reference")
    tok_std = policy.tok.weight.std().item()
    assert tok_std == pytest.approx(1.0, rel=0.05)
    # after the sqrt(d_model) scale the token vectors are sqrt(d) times the position vectors
    scaled_std = (policy.tok.weight * policy.scale).std().item()
    assert scaled_std == pytest.approx(math.sqrt(D), rel=0.05)
    assert policy.pos.weight.std().item() == pytest.approx(1.0, rel=0.05)
    assert policy.tok.weight.mean().abs().item() < 0.05


def test_reference_blocks_initialise_as_transformer_encoder_layer() -> None:
    policy = _tiny("reference")
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, 2, 4 * D, dropout=0.0, norm_first=True)
    in_bound = math.sqrt(6 / (D + 3 * D))  # xavier_uniform_ on the [3d, d] in_proj
    lin_bound = 1 / math.sqrt(D)  # nn.Linear's kaiming_uniform(a=√5) bound for fan_in d
    assert layer.self_attn.in_proj_weight.abs().max().item() <= in_bound
    for block in policy.blocks:
        qkv_w = block.qkv.weight
        assert qkv_w.shape == layer.self_attn.in_proj_weight.shape
        assert qkv_w.abs().max().item() <= in_bound
        # uniform on [-b, b]: std b/√3, and it fills the range (not the narrower Linear bound)
        assert qkv_w.std().item() == pytest.approx(in_bound / math.sqrt(3), rel=0.05)
        assert qkv_w.abs().max().item() > lin_bound * 1.1
        assert torch.count_nonzero(block.qkv.bias) == 0
        assert torch.count_nonzero(block.proj.bias) == 0
        assert block.proj.weight.abs().max().item() <= lin_bound
        assert block.proj.weight.std().item() == pytest.approx(
            layer.self_attn.out_proj.weight.std().item(), rel=0.1)
        assert block.fc.weight.abs().max().item() <= 1 / math.sqrt(D)
        assert block.out.weight.abs().max().item() <= 1 / math.sqrt(4 * D)
        assert block.fc.bias.abs().max().item() <= 1 / math.sqrt(D)
        for ln in (block.ln1, block.ln2):
            assert torch.equal(ln.weight, torch.ones(D))
            assert torch.equal(ln.bias, torch.zeros(D))
    assert policy.head.bias is None


def test_balanced_keeps_the_balanced_statistics() -> None:
    policy = _tiny("balanced")
    assert policy.tok.weight.std().item() == pytest.approx(D ** -0.5, rel=0.05)
    assert (policy.tok.weight * policy.scale).std().item() == pytest.approx(1.0, rel=0.05)
    assert policy.pos.weight.std().item() == pytest.approx(1.0, rel=0.05)
    for block in policy.blocks:  # plain nn.Linear defaults, as before the option existed
        assert block.qkv.weight.abs().max().item() <= 1 / math.sqrt(D)
        assert torch.count_nonzero(block.qkv.bias) > 0


def test_inits_share_shapes_and_differ_in_values() -> None:
    ref, bal = _tiny("reference"), _tiny("balanced")
    ref_shapes = {n: p.shape for n, p in ref.named_parameters()}
    assert ref_shapes == {n: p.shape for n, p in bal.named_parameters()}
    assert not torch.equal(ref.tok.weight, bal.tok.weight)


def test_unknown_embed_init_is_rejected() -> None:
    errors = ModelConfig(embed_init="xavier").validate()  # type: ignore[arg-type]
    assert any("embed_init" in e for e in errors)
    with pytest.raises(ValueError, match="embed_init"):
        TinyTransformer(TinyConfig(embed_init="xavier"))
    assert any("--arch tiny" in e
               for e in ModelConfig(arch="llama", embed_init="balanced").validate())

