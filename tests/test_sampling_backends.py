"""Generation backends: the static-cache decoder over Hugging Face weights equals the eager
dynamic-cache path (CPU, fp32), shares a group's prefill, refreshes its weights after an
optimizer step, and falls back / fails clearly on models it does not implement."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.hf import HFPolicy, tiny_hf_model
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.backends import BACKENDS, check_backend, hf_static, resolve
from rlscope.sampling.backends.hf_static import take_weight_sync_seconds, unsupported_reason

VOCAB = 40
STOPS = (3, 5, 7, 11)
CPU = torch.device("cpu")


def _config_model(arch: str, **extra: object) -> torch.nn.Module:
    """A tiny Qwen3 or Mistral model (GQA 4/2 heads, untied head) built from its config."""
    import transformers
    from transformers import AutoModelForCausalLM

    config_cls = {"qwen3": "Qwen3Config", "mistral": "MistralConfig"}[arch]
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        **({"head_dim": 16} if arch == "qwen3" else {}), **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.float().eval()


def _policy(arch: str) -> HFPolicy:
    if arch in ("qwen3", "mistral"):
        import transformers

        if not hasattr(transformers, {"qwen3": "Qwen3Config",
                                      "mistral": "MistralConfig"}[arch]):
            pytest.skip(f"this transformers has no {arch}")
        return HFPolicy(_config_model(arch))
    return HFPolicy(tiny_hf_model(arch, VOCAB, seed=0))


def _prompts(groups: int = 3, group_size: int = 2) -> tuple[PromptBatch, torch.Tensor,
                                                             torch.Tensor]:
    """Ragged left-padded prompts (3, 6, 9 tokens ...) repeated ``group_size`` times; distinct
    seeds per row and the group ids."""
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(12, VOCAB, (3 + 3 * i,), generator=g) for i in range(groups)]
    prompts = PromptBatch.left_padded(rows).repeat_interleave(group_size)
    seeds_B = torch.randint(0, 2**62, (prompts.batch_size,), generator=g)
    group_B = torch.arange(groups).repeat_interleave(group_size)
    return prompts, seeds_B, group_B


def _assert_same(a: RolloutBatch, b: RolloutBatch, atol: float = 1e-5) -> None:
    assert torch.equal(a.completion_tokens_BT, b.completion_tokens_BT)
    assert torch.equal(a.completion_mask_BT, b.completion_mask_BT)
    assert torch.equal(a.finished_by_stop_B, b.finished_by_stop_B)
    torch.testing.assert_close(a.logp_sampler_BT, b.logp_sampler_BT, atol=atol, rtol=0)
    torch.testing.assert_close(a.logp_raw_BT, b.logp_raw_BT, atol=atol, rtol=0)
    for name in ("entropy_BT", "sum_p2_sampler_BT", "keep_mask_BTV"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            torch.testing.assert_close(x, y, atol=atol, rtol=0)


def _both(policy: HFPolicy, cfg: SamplingConfig, new_tokens: int = 12,
          **kw: object) -> tuple[RolloutBatch, RolloutBatch]:
    prompts, seeds_B, group_B = _prompts()
    out = []
    for backend in ("eager", "static"):
        out.append(generate(policy, prompts, dataclasses.replace(cfg, backend=backend),
                            seeds_B, new_tokens, group_id_B=group_B, with_entropy=True,
                            with_sum_p2=True, **kw))  # type: ignore[arg-type]
    return out[0], out[1]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("cfg", [
    SamplingConfig(stop_token_ids=STOPS),
    SamplingConfig(temperature=0, stop_token_ids=STOPS),
    SamplingConfig(temperature=0.7, top_k=10, top_p=0.9, stop_token_ids=STOPS),
    SamplingConfig(temperature=1.3),
], ids=["t1-stops", "greedy", "topk-topp", "no-stops"])
def test_static_equals_eager_dynamic_cache(arch: str, cfg: SamplingConfig) -> None:
    policy = _policy(arch)
    eager, static = _both(policy, cfg)
    _assert_same(eager, static)
    if cfg.stop_token_ids and cfg.temperature > 0:
        # the case is meaningful: some rows stopped, and the rollout is the eager length
        assert bool(eager.finished_by_stop_B.any())
    if not cfg.stop_token_ids:
        assert static.completion_tokens_BT.shape[1] == 12


def test_static_trims_to_the_last_alive_position() -> None:
    """Every row stops early: the static path runs on past the last stop (k = 8) and trims
    back to the eager length."""
    policy = _policy("llama")
    cfg = SamplingConfig(temperature=0, stop_token_ids=tuple(range(VOCAB)))
    eager, static = _both(policy, cfg, new_tokens=20)
    assert eager.completion_tokens_BT.shape[1] == 1
    _assert_same(eager, static)


def test_group_prefill_equals_per_row_prefill() -> None:
    policy = _policy("qwen2")
    prompts, seeds_B, group_B = _prompts(groups=3, group_size=3)
    cfg = SamplingConfig(backend="static", stop_token_ids=STOPS)
    first_G, row_group_B = hf_static._prefill_groups(
        prompts.tokens_BP, prompts.attention_mask_BP.bool(), group_B)  # type: ignore[union-attr]
    assert first_G.tolist() == [0, 3, 6]  # shared: one prefill row per group
    assert row_group_B.tolist() == group_B.tolist()
    shared = generate(policy, prompts, cfg, seeds_B, 10, group_id_B=group_B)
    per_row = generate(policy, prompts, cfg, seeds_B, 10, group_id_B=None)
    _assert_same(shared, per_row, atol=1e-6)
    assert torch.equal(shared.group_id_B, group_B)


def test_group_ids_over_different_prompts_prefill_per_row() -> None:
    prompts, _, _ = _prompts(groups=2, group_size=2)
    wrong_B = torch.zeros(4, dtype=torch.long)  # claims one group, but prompts differ
    first_G, row_group_B = hf_static._prefill_groups(
        prompts.tokens_BP, prompts.attention_mask_BP.bool(), wrong_B)  # type: ignore[union-attr]
    assert first_G.tolist() == [0, 1, 2, 3] and row_group_B.tolist() == [0, 1, 2, 3]


def test_stop_check_every_k_equals_every_position() -> None:
    policy = _policy("llama")
    prompts, seeds_B, group_B = _prompts()
    out = [generate(policy, prompts, SamplingConfig(backend="static", stop_token_ids=STOPS,
                                                    stop_check_every=k),
                    seeds_B, 16, group_id_B=group_B) for k in (1, 8)]
    _assert_same(out[0], out[1], atol=0)


def test_buckets_are_reused_across_batch_sizes() -> None:
    policy = _policy("llama")
    prompts, seeds_B, _ = _prompts(groups=3, group_size=2)
    cfg = SamplingConfig(backend="static")
    hf_static._DECODERS.pop(policy, None)
    small = generate(policy, prompts.select(torch.arange(3)), cfg, seeds_B[:3], 5)
    generate(policy, prompts, cfg, seeds_B, 5)
    BACKENDS["static"].generate(policy, prompts,
                                SamplingConfig(backend="auto", stop_check_every=3), seeds_B, 5)
    # 3 and 6 rows, prompts <= 16, backend names and stop-check periods: one bucket
    assert len(hf_static._DECODERS[policy][2]) == 1
    # a row's result does not depend on the batch it was drawn in (bucket padding is neutral)
    full = generate(policy, prompts, cfg, seeds_B, 5)
    assert torch.equal(small.completion_tokens_BT, full.completion_tokens_BT[:3])
    torch.testing.assert_close(small.logp_raw_BT, full.logp_raw_BT[:3], atol=1e-5, rtol=0)


def test_weight_refresh_sees_an_optimizer_step() -> None:
    policy = _policy("qwen2")
    prompts, seeds_B, group_B = _prompts()
    cfg = SamplingConfig(backend="static")
    take_weight_sync_seconds()
    before = generate(policy, prompts, cfg, seeds_B, 8, group_id_B=group_B)
    assert take_weight_sync_seconds() > 0  # the first call copied the weights
    generate(policy, prompts, cfg, seeds_B, 8, group_id_B=group_B)
    assert take_weight_sync_seconds() == 0  # unchanged weights are not copied again
    # fused AdamW (the loop's optimizer) does not bump version counters: the step hook sees it
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2, fused=True)
    logits_BTV, _ = policy(prompts.tokens_BP, prompts.attention_mask_BP)
    logits_BTV.logsumexp(-1).mean().backward()
    versions = [p._version for p in policy.parameters()]
    optimizer.step()
    assert [p._version for p in policy.parameters()] == versions
    after = generate(policy, prompts, cfg, seeds_B, 8, group_id_B=group_B)
    assert take_weight_sync_seconds() > 0
    assert not torch.allclose(before.logp_raw_BT, after.logp_raw_BT)
    with torch.no_grad():
        for p in policy.parameters():
            p.data.mul_(1.01)  # invisible to version counters and optimizer hooks
    hf_static.weights_changed()
    after = generate(policy, prompts, cfg, seeds_B, 8, group_id_B=group_B)
    hf_static._DECODERS.pop(policy)
    fresh = generate(policy, prompts, cfg, seeds_B, 8, group_id_B=group_B)
    _assert_same(after, fresh, atol=0)
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 8,
                     group_id_B=group_B)
    _assert_same(after, eager)


def test_unsupported_model_falls_back_with_auto_and_fails_with_static() -> None:
    tiny = TinyTransformer(TinyConfig(vocab_size=VOCAB, max_len=32)).eval()
    assert resolve("auto", tiny, CPU) is BACKENDS["eager"]
    reason = unsupported_reason(tiny)
    assert reason is not None and "not a Hugging Face policy" in reason
    with pytest.raises(ValueError, match=r"sampling.backend=.static. cannot sample.*Hugging"):
        check_backend(SamplingConfig(backend="static"), tiny, CPU)
    prompts, seeds_B, _ = _prompts()
    with pytest.raises(ValueError, match="cannot sample"):
        generate(tiny, prompts, SamplingConfig(backend="static"), seeds_B, 4)
    rollout = generate(tiny, prompts, SamplingConfig(backend="auto"), seeds_B, 4)
    assert rollout.completion_tokens_BT.shape == (6, 4)


def test_auto_picks_static_only_on_cuda_for_supported_models() -> None:
    policy = _policy("llama")
    assert BACKENDS["static"].supports(policy, CPU)
    assert resolve("auto", policy, CPU) is BACKENDS["eager"]
    assert resolve("auto", policy, torch.device("cuda")) is BACKENDS["static"]
    assert resolve("static", policy, CPU) is BACKENDS["static"]


def test_short_sliding_window_is_refused() -> None:
    policy = HFPolicy(_config_model("mistral", sliding_window=8))
    prompts, seeds_B, _ = _prompts()
    with pytest.raises(ValueError, match="sliding_window=8"):
        generate(policy, prompts, SamplingConfig(backend="static"), seeds_B, 4)
    # auto on CUDA would pick static for this model; a too-short window falls back to eager
    auto = BACKENDS["static"].generate(policy, prompts, SamplingConfig(backend="auto"),
                                       seeds_B, 4)
    eager = generate(policy, prompts, SamplingConfig(backend="eager"), seeds_B, 4)
    assert torch.equal(auto.completion_tokens_BT, eager.completion_tokens_BT)
    assert torch.equal(auto.logp_raw_BT, eager.logp_raw_BT)  # the same (eager) computation


def test_lora_model_is_unsupported() -> None:
    pytest.importorskip("peft")
    from rlscope.policy import ModelConfig, add_lora

    policy = add_lora(_policy("llama"), ModelConfig(arch="llama", lora_rank=2))
    reason = unsupported_reason(policy)
    assert reason is not None and "LoRA" in reason


def test_sampling_config_validates_backend_and_stop_check() -> None:
    errors = SamplingConfig(backend="vllm", stop_check_every=0).validate()
    assert any("sampling.backend='vllm'" in e for e in errors)
    assert any("stop_check_every=0" in e for e in errors)
    assert SamplingConfig(backend="static").validate() == []


def test_config_names_match_the_registry() -> None:
    from rlscope.sampling.backends import BACKEND_CHOICES
    from rlscope.sampling.draw import BACKEND_NAMES

    assert BACKEND_CHOICES == BACKEND_NAMES


def test_train_with_the_static_backend(tmp_path) -> None:
    """The loop samples through the static backend: on-policy first pass, the weight sync
    logged every step (the optimizer moved the weights), and a tiny transformer with
    --backend static refused before the first step."""
    from rlscope.config import RunConfig, TrainConfig
    from rlscope.policy import ModelConfig
    from rlscope.tasks import TaskConfig
    from rlscope.train import train

    def cfg(arch: str, name: str) -> TrainConfig:
        return TrainConfig(
            method="grpo", sampling=SamplingConfig(backend="static"),
            model=ModelConfig(arch=arch, d_model=32, n_heads=2, n_layers=1),
            task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=8),
            run=RunConfig(num_steps=3, batch_size=8, eval_every=0, device="cpu",
                          progress=False, doctor_every=0, runs_dir=str(tmp_path), name=name))

    result = train(cfg("qwen2", "static"))
    assert result.run_dir == tmp_path / "static"
    first = result.metrics[0]
    assert abs(first["policy/ratio_mean_first"] - 1.0) < 1e-5
    assert first["sampler/logp_diff_max"] < 1e-4
    assert all(row["time/sampler_weight_sync"] > 0 for row in result.metrics)
    with pytest.raises(ValueError, match="not a Hugging Face policy"):
        train(cfg("tiny", "tiny"))
    assert not (tmp_path / "tiny").exists()


class _ReplayedCall:
    """Stands in for a CUDA graph on CPU: `capture` runs the step once (its warm-up, as the
    real one does) and every replay runs it again."""

    def __init__(self, fn: object) -> None:
        self.fn = fn
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.fn()  # type: ignore[operator]


def test_capture_flow_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graphed flow (the prefill captured and replayed, the decode step captured with its
    warm-up step, the prefill replayed again, decode replays) gives the eager path's rollout:
    the warm-ups' state changes are all reset."""
    graphs: list[_ReplayedCall] = []

    def fake_capture(fn: object) -> _ReplayedCall:
        fn()  # type: ignore[operator]
        graphs.append(_ReplayedCall(fn))
        return graphs[-1]

    monkeypatch.setattr(hf_static, "can_capture", lambda device: True)
    monkeypatch.setattr(hf_static, "capture", fake_capture)
    policy = _policy("qwen2")
    cfg = SamplingConfig(temperature=0.8, top_k=12, stop_token_ids=STOPS)
    eager, static = _both(policy, cfg, new_tokens=14)
    assert len(graphs) == 2  # the prefill's, then the decode step's
    assert graphs[0].replays == 2 and graphs[1].replays > 0
    _assert_same(eager, static)
    again = _both(policy, cfg, new_tokens=14)[1]  # the same bucket: replayed, not recaptured
    assert len(graphs) == 2 and graphs[0].replays == 3
    _assert_same(static, again, atol=0)


@pytest.mark.parametrize("attention", ["triton", "mask"])
def test_buckets_load_their_triton_kernels_before_compiling(monkeypatch: pytest.MonkeyPatch,
                                                            attention: str) -> None:
    """A bucket imports the Triton kernels it will run when it is made, before its step is
    compiled: imported lazily inside the compiled step they changed its guards, and the step
    recompiled on its next call, inside the CUDA graph capture, which failed
    (docs/performance.md)."""
    from rlscope.sampling.backends import decode_attention, fused_draw, gate_up

    events: list[str] = []
    monkeypatch.setattr(decode_attention, "load", lambda: events.append("attention"))
    monkeypatch.setattr(fused_draw, "load", lambda: events.append("draw"))
    monkeypatch.setattr(gate_up, "load", lambda: events.append("gate_up"))
    monkeypatch.setattr(gate_up, "applies", lambda device, dtype: attention == "triton")
    monkeypatch.setattr(fused_draw, "applies", lambda cfg, vocab, device: cfg.top_k == 0)
    monkeypatch.setattr(hf_static, "compiles", lambda device: True)
    monkeypatch.setattr(hf_static, "compile_step",
                        lambda step: events.append("compile") or step)
    weights = hf_static.HFStaticWeights(_policy("qwen2").unwrap(), torch.float32)
    for cfg, want in ((SamplingConfig(compile_sampler=True), ["draw", "compile"]),
                      (SamplingConfig(top_k=5, compile_sampler=True), ["compile"])):
        events.clear()
        hf_static._Bucket(weights, 8, 16, 4, cfg, 0, False, False, attention)
        kernels = ["attention"] if attention == "triton" else []
        gate = ["gate_up"] if attention == "triton" else []  # where it applies
        assert events == kernels + want[:-1] + gate + want[-1:]


def test_static_refuses_sequences_past_the_model_length_as_eager_does() -> None:
    policy = _policy("llama")  # max_position_embeddings=128
    prompts, seeds_B, _ = _prompts()
    for backend in ("eager", "static"):
        with pytest.raises(ValueError, match="exceeds max_position_embeddings=128"):
            generate(policy, prompts, SamplingConfig(backend=backend), seeds_B, 125)


def test_compiled_decode_step_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile_sampler``: the whole decode step traces as one graph (no graph break; CPU
    runs it through ``aot_eager``) and gives the eager path's rollout."""
    compiled: list[object] = []

    def compile_step(step: object) -> object:
        compiled.append(torch.compile(step, backend="aot_eager", fullgraph=True))
        return compiled[-1]

    monkeypatch.setattr(hf_static, "compiles", lambda device: True)
    monkeypatch.setattr(hf_static, "compile_step", compile_step)
    policy = _policy("qwen3")
    cfg = SamplingConfig(temperature=0.9, top_p=0.8, stop_token_ids=STOPS,
                         compile_sampler=True)
    eager, static = _both(policy, cfg, new_tokens=10)
    assert len(compiled) == 1
    _assert_same(eager, static)


def _varlen_reference(q_NKD: torch.Tensor, k_MKD: torch.Tensor, v_MKD: torch.Tensor,
                      cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                      scale: float, used_B: torch.Tensor) -> torch.Tensor:
    """What torch's flash kernel computes for `hf_static.flash_varlen`, in plain torch:
    sequence b's query rows attend (no causal mask) to keys cu_k[b] .. cu_k[b] + used_B[b]."""
    out_NKD = torch.empty_like(q_NKD)
    for b in range(used_B.shape[0]):
        q = q_NKD[int(cu_q[b]):int(cu_q[b + 1])].transpose(0, 1)  # [K, n, D]
        start, n = int(cu_k[b]), int(used_B[b])
        k = k_MKD[start:start + n].transpose(0, 1)
        v = v_MKD[start:start + n].transpose(0, 1)
        w = (q @ k.transpose(-1, -2) * scale).softmax(-1)
        out_NKD[int(cu_q[b]):int(cu_q[b + 1])] = (w @ v).transpose(0, 1)
    return out_NKD


def _use_kernel(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Make the static sampler attend with ``kind`` on CPU (torch's flash kernel replaced by
    `_varlen_reference`; the Triton kernel runs in Triton's CPU interpreter, which has to be
    on before Triton is imported: see `test_triton_decode_kernel_in_the_interpreter`)."""
    monkeypatch.setattr(hf_static, "decode_attention_kind", lambda *a: kind)
    monkeypatch.setattr(hf_static, "flash_varlen", _varlen_reference)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_flash_decode_attends_to_the_mask_paths_keys(monkeypatch: pytest.MonkeyPatch,
                                                     arch: str) -> None:
    """The flash form of the decode attention (per-row key offsets and used counts, query
    heads as rows of their kv head) attends to exactly the keys of the mask form: with the
    kernel replaced by a plain reference, the static sampler gives the eager path's tokens and
    log-probs on ragged left-padded prompts with stops (float32, CPU)."""
    policy = _policy(arch)
    cfg = SamplingConfig(stop_token_ids=STOPS)
    prompts, seeds_B, group_B = _prompts(groups=3, group_size=3)
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 14,
                     group_id_B=group_B, with_entropy=True, with_sum_p2=True)
    _use_kernel(monkeypatch, "flash")
    fast = generate(policy, prompts, dataclasses.replace(cfg, backend="static"), seeds_B, 14,
                    group_id_B=group_B, with_entropy=True, with_sum_p2=True)
    assert [b.attention for b in hf_static._DECODERS[policy][2].values()] == ["flash"]
    assert bool(eager.finished_by_stop_B.any())
    _assert_same(eager, fast)


_TRITON_KERNELS = """
import dataclasses, torch
from rlscope.sampling import generate
from rlscope.sampling.backends import decode_attention, hf_static
from rlscope.sampling.draw import SamplingConfig
import tests.test_sampling_backends as t

g = torch.Generator().manual_seed(0)
B, H, K, D, L = 4, 14, 2, 16, 150
q_BHD = torch.randn(B, H, D, generator=g)
k_BLKD, v_BLKD = torch.randn(2, B, L, K, D, generator=g)
start_B = torch.tensor([0, 10, 85, 3], dtype=torch.int32)
used_B = torch.tensor([150, 64, 1, 100], dtype=torch.int32)
out_BHD = decode_attention.decode_attention(q_BHD, k_BLKD, v_BLKD, start_B, used_B, 0.3)
for b in range(B):
    span = slice(int(start_B[b]), int(start_B[b] + used_B[b]))
    for h in range(H):
        w = (q_BHD[b, h] @ k_BLKD[b, span, h // 7].T * 0.3).softmax(-1)
        torch.testing.assert_close(out_BHD[b, h], w @ v_BLKD[b, span, h // 7],
                                   atol=1e-5, rtol=0)
# shared prompts: columns below 20 come from row src_B[b]
src_B = torch.tensor([0, 0, 2, 2], dtype=torch.int32)
shared_BHD = decode_attention.decode_attention(q_BHD, k_BLKD, v_BLKD, start_B, used_B, 0.3,
                                               src_B, 20)
for b in range(B):
    cols = range(int(start_B[b]), int(start_B[b] + used_B[b]))
    rows = [int(src_B[b]) if c < 20 else b for c in cols]
    k_ND, v_ND = k_BLKD[rows, list(cols)], v_BLKD[rows, list(cols)]
    for h in range(H):
        w = (q_BHD[b, h] @ k_ND[:, h // 7].T * 0.3).softmax(-1)
        torch.testing.assert_close(shared_BHD[b, h], w @ v_ND[:, h // 7], atol=1e-5, rtol=0)
assert not torch.allclose(shared_BHD[1], out_BHD[1])  # row 1 did read row 0's prompt
assert torch.equal(shared_BHD[2], out_BHD[2])  # its span starts past the prompt
# the fused rotation kernel reading a table of R rotations at each row's row (its position)
# equals the kernel given each row's own rotation; rows past the table read its last row
qkv_BX = torch.randn(B, (H + 2 * K) * D, generator=g)
angle_RD = torch.rand(40, D, generator=g) * 6
cos_RD, sin_RD = angle_RD.cos(), angle_RD.sin()
row_B = torch.tensor([3, 39, 0, 57])
col_1 = torch.tensor([90])
used_rope_B = torch.tensor([91, 81, 6, 88], dtype=torch.int32)
outs, caches = [], []
for tables, rows in (((cos_RD, sin_RD), row_B),
                     ((cos_RD[row_B.clamp(max=39)], sin_RD[row_B.clamp(max=39)]), None)):
    k_c, v_c = k_BLKD.clone(), v_BLKD.clone()
    outs.append(decode_attention.decode_attention_rope(
        qkv_BX, *tables, k_c, v_c, col_1, start_B, used_rope_B, H, 0.3, src_B, 20, rows))
    caches.append((k_c, v_c))
assert torch.equal(outs[0], outs[1])
assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
assert not torch.equal(caches[0][0][:, 90], k_BLKD[:, 90])  # the new keys were written
for bad in (torch.zeros(B, 2), torch.zeros(5, D)):
    try:
        decode_attention.decode_attention_rope(qkv_BX, bad, bad, k_BLKD, v_BLKD, col_1,
                                               start_B, used_rope_B, H, 0.3)
    except ValueError:
        pass
    else:
        raise AssertionError(f"accepted rotation tables of shape {tuple(bad.shape)}")
# the fused draw: the eager draw's tokens and log-probs (chunks of 512 and 16 columns)
from rlscope.sampling.backends import fused_draw
from rlscope.sampling.draw import draw
from rlscope.sampling.processors import gumbel_offsets

fused_draw.ON_CPU, fused_draw.MIN_VOCAB = True, 0
fused_draw.CHUNK, fused_draw.BLOCK = 512, 128
logits_BV = torch.randn(6, 1500, generator=g) * 3
logits_BV[1, 700] = 40.0  # a near-certain token in the second chunk
seeds_B = torch.arange(6) * 977 + 5
alive_B = torch.tensor([True, True, False, True, True, True])
step = torch.tensor(3)
for T in (1.0, 0.7):
    cfg = SamplingConfig(temperature=T)
    assert fused_draw.applies(cfg, 1500, logits_BV.device)
    want = draw(logits_BV, alive_B, gumbel_offsets(seeds_B, step, 1500), cfg, 0, True, True)
    got = fused_draw.fused_draw(logits_BV, alive_B, seeds_B, step, cfg, 0, True, True)
    assert torch.equal(got.token_B, want.token_B), (T, got.token_B, want.token_B)
    assert got.token_B[1] == 700 and got.token_B[2] == 0
    for name in ("logp_sampler_B", "logp_raw_B", "entropy_B", "sum_p2_B"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-5, rtol=1e-5)
    assert (got.logp_raw_B is got.logp_sampler_B) == (T == 1.0)
assert not fused_draw.applies(SamplingConfig(top_k=20), 1500, logits_BV.device)
assert not fused_draw.applies(SamplingConfig(top_p=0.9), 1500, logits_BV.device)
assert not fused_draw.applies(SamplingConfig(temperature=0.0), 1500, logits_BV.device)
# the gate/up product with its SiLU product: the unfused steps, on shapes with tails
from rlscope.sampling.backends import gate_up

for M, D, I in ((70, 96, 40), (3, 64, 33)):
    x_MD = torch.randn(M, D, generator=g)
    w_JD = torch.randn(2 * I, D, generator=g) * 0.2
    gate, up = torch.nn.functional.linear(x_MD, w_JD).split(I, -1)
    got = gate_up.gate_up_silu(x_MD, w_JD)
    assert got.shape == (M, I) and got.dtype == w_JD.dtype
    torch.testing.assert_close(got, torch.nn.functional.silu(gate) * up, atol=1e-5, rtol=1e-5)
for x_bad, w_bad in ((torch.zeros(4, 8), torch.zeros(6, 9)), (torch.zeros(4, 8), torch.zeros(5, 8)),
                     (torch.zeros(4, 8), torch.zeros(6, 8, dtype=torch.float64)),
                     (torch.zeros(2, 4, 8), torch.zeros(6, 8))):
    try:
        gate_up.gate_up_silu(x_bad, w_bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"accepted x {tuple(x_bad.shape)}, w {tuple(w_bad.shape)}")
print("triton kernels ok")
"""

_TRITON_SAMPLER = """
import dataclasses, torch
from rlscope.sampling import generate
from rlscope.sampling.backends import decode_attention, hf_static
from rlscope.sampling.draw import SamplingConfig
import tests.test_sampling_backends as t

from rlscope.sampling.backends import fused_draw


def eager_and_static(policy, cfg):
    # the eager path's rollout and the static sampler's (a fresh bucket), ragged grouped prompts
    prompts, seeds_B, group_B = t._prompts(groups=3, group_size=3)
    outs = []
    for backend in ("eager", "static"):
        hf_static._DECODERS.clear()
        outs.append(generate(policy, prompts, dataclasses.replace(cfg, backend=backend),
                             seeds_B, 14, group_id_B=group_B, with_entropy=True,
                             with_sum_p2=True))
    return outs


hf_static.FUSE_ROPE = False  # the plain kernel first; the fused one below
for arch in ("llama", "qwen3"):
    policy = t._policy(arch)
    cfg = SamplingConfig(stop_token_ids=t.STOPS)
    prompts, seeds_B, group_B = t._prompts(groups=3, group_size=3)
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 14,
                     group_id_B=group_B, with_entropy=True, with_sum_p2=True)
    hf_static.decode_attention_kind = lambda *a: "triton"
    fast = generate(policy, prompts, dataclasses.replace(cfg, backend="static"), seeds_B, 14,
                    group_id_B=group_B, with_entropy=True, with_sum_p2=True)
    buckets = list(hf_static._DECODERS[policy][2].values())
    assert [b.attention for b in buckets] == ["triton"]
    src_B = buckets[0].keys.src_B
    assert src_B[:9].tolist() == [0, 0, 0, 3, 3, 3, 6, 6, 6]  # groups read one prompt copy
    assert bool(eager.finished_by_stop_B.any())
    t._assert_same(eager, fast)
    if arch == "llama":  # the rotation and cache writes in the kernel too (no q/k norm)
        hf_static.FUSE_ROPE = True
        hf_static._DECODERS.clear()
        calls = []
        plain = decode_attention.decode_attention_rope
        decode_attention.decode_attention_rope = \
            lambda *a, **kw: calls.append(1) or plain(*a, **kw)
        fused = generate(policy, prompts, dataclasses.replace(cfg, backend="static"), seeds_B,
                         14, group_id_B=group_B, with_entropy=True, with_sum_p2=True)
        hf_static.FUSE_ROPE = False
        assert len(calls) == 13 * 2  # 13 decode positions x 2 layers
        t._assert_same(eager, fused)
        # the rotations read from the bucket's table (hf_static.ROPE_TABLE) at each row's
        # position, and the same values as computed every step
        bucket = next(iter(hf_static._DECODERS[policy][2].values()))
        assert bucket.rope_table is not None
        assert bucket.rope_table[0].shape == (bucket.k_cache[0].shape[1], bucket.weights.head_dim)
        hf_static.FUSE_ROPE, hf_static.ROPE_TABLE = True, False
        hf_static._DECODERS.clear()
        per_step = generate(policy, prompts, dataclasses.replace(cfg, backend="static"),
                            seeds_B, 14, group_id_B=group_B, with_entropy=True,
                            with_sum_p2=True)
        hf_static.FUSE_ROPE, hf_static.ROPE_TABLE = False, True
        assert next(iter(hf_static._DECODERS[policy][2].values())).rope_table is None
        t._assert_same(fused, per_step, atol=0.0)
        # the graphed flow (CUDA graphs stood in for by re-running the captured function):
        # the prefill's 3 groups padded to 8, the padding rewriting group 0's shared prompt
        replays = []

        class Replayed:
            def __init__(self, fn):
                self.fn = fn

            def replay(self):
                replays.append(1)
                self.fn()

        def fake_capture(fn):
            fn()
            return Replayed(fn)

        hf_static.can_capture, hf_static.capture = (lambda device: True), fake_capture
        hf_static._DECODERS.clear()
        graphed = generate(policy, prompts, dataclasses.replace(cfg, backend="static"),
                           seeds_B, 14, group_id_B=group_B, with_entropy=True,
                           with_sum_p2=True)
        bucket = next(iter(hf_static._DECODERS[policy][2].values()))
        assert list(bucket.prefills) == [8] and len(replays) > 2
        assert bucket.prefills[8][1]["rows"].tolist() == [0, 3, 6] + [0] * 5
        t._assert_same(eager, graphed)

# the gate/up and SiLU products as one kernel (hf_static.FUSED_GATE_UP) in every decode step
from rlscope.sampling.backends import gate_up

gate_up.ON_CPU = True
calls = []
plain_gu = gate_up.gate_up_silu
gate_up.gate_up_silu = lambda x, w: calls.append(x.shape[0]) or plain_gu(x, w)
policy = t._policy("llama")
eager, fast = eager_and_static(policy, SamplingConfig(stop_token_ids=t.STOPS))
bucket = next(iter(hf_static._DECODERS[policy][2].values()))
# every layer of every decode position (the stand-in capture runs a step too), never the
# prefill's rows
assert len(calls) >= 13 * 2 and len(calls) % 2 == 0 and set(calls) == {bucket.rows}
t._assert_same(eager, fast)
gate_up.ON_CPU, gate_up.gate_up_silu = False, plain_gu
hf_static._DECODERS.clear()

fused_draw.ON_CPU, fused_draw.MIN_VOCAB = True, 0
# in the static sampler (vocabulary 40: chunks of 16 columns, 3 per row)
fused_draw.CHUNK, fused_draw.BLOCK = 16, 8
calls = []
plain_fd = fused_draw.fused_draw
fused_draw.fused_draw = lambda *a, **kw: calls.append(1) or plain_fd(*a, **kw)
policy = t._policy("qwen2")
for cfg in (SamplingConfig(stop_token_ids=t.STOPS), SamplingConfig(temperature=0.8)):
    t._assert_same(*eager_and_static(policy, cfg))
assert len(calls) >= 2 * 14
print("triton sampler ok")
"""


def _interpreted(script: str) -> str:
    """Run ``script`` in a fresh process with Triton's CPU interpreter on (it must be on
    before Triton is imported); its stdout."""
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root),
                                          os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_triton_kernels_in_the_interpreter() -> None:
    """The Triton kernels in Triton's CPU interpreter, where Triton is installed:
    `decode_attention` against plain attention over each row's span (GQA groups of 7 as in the
    0.5B shape; spans shorter than, equal to and longer than a key block; spans starting
    mid-cache; prompts read from another row), and `fused_draw` against `draw` (temperatures 1
    and 0.7, a finished row, chunk boundaries), and `gate_up.gate_up_silu` against the unfused
    gate/up and SiLU products (tails in every dimension; bad shapes and dtypes refused)."""
    assert "triton kernels ok" in _interpreted(_TRITON_KERNELS)


@pytest.mark.slow
def test_triton_kernels_in_the_static_sampler_in_the_interpreter() -> None:
    """The static sampler on the Triton kernels in the interpreter (slow: every kernel call is
    interpreted): the eager path's tokens and log-probs (float32, ragged prompts, stops) with
    the decode attention, with the rotation fused into it, through the graphed flow (prompt
    groups padded to a power of two), with the fused gate/up kernel and with `fused_draw`."""
    assert "triton sampler ok" in _interpreted(_TRITON_SAMPLER)


def test_decode_kernels_need_left_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt mask with a hole (not left padding) keeps the mask form; CPU and float32
    always do."""
    policy = _policy("qwen2")
    prompts, seeds_B, group_B = _prompts(groups=2, group_size=1)
    mask_BP = prompts.attention_mask_BP
    assert mask_BP is not None
    holed_BP = mask_BP.clone()
    holed_BP[0, -2] = 0
    assert hf_static.left_padded(mask_BP.bool())
    assert not hf_static.left_padded(holed_BP.bool())
    assert hf_static.decode_attention_kind(torch.device("cpu"), torch.bfloat16, 64) == "mask"
    assert hf_static.decode_attention_kind(torch.device("cuda"), torch.float32, 64) == "mask"
    _use_kernel(monkeypatch, "flash")
    holed = dataclasses.replace(prompts, attention_mask_BP=holed_BP)
    generate(policy, holed, SamplingConfig(backend="static"), seeds_B, 4, group_id_B=group_B)
    assert [b.attention for b in hf_static._DECODERS[policy][2].values()] == ["mask"]
    from rlscope.sampling.backends import decode_attention

    assert decode_attention.available(64) == (importlib.util.find_spec("triton") is not None)
    assert not decode_attention.available(48)
