"""CUDA correctness: the same identities as on CPU, on a GPU. Skipped cleanly without one."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.bench import BenchConfig, bench_sampler
from rlscope.config import RunConfig, TrainConfig
from rlscope.learner import UpdatePlan, prepare, update
from rlscope.learner_graphs import GraphedUpdate
from rlscope.methods import MethodConfig, resolve_method
from rlscope.methods.selection import mixed_groups
from rlscope.policy import ModelConfig
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.policy.value_head import ValueHead
from rlscope.sampling import SamplingConfig, generate
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TaskConfig, make_task
from rlscope.train import train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cached_decode_equals_full_forward_on_cuda() -> None:
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=5, max_len=32)).cuda().eval()
    tokens_BT = torch.randint(0, 5, (4, 12), device="cuda")
    mask_BT = torch.ones_like(tokens_BT)
    mask_BT[0, :3] = 0
    mask_BT[2, :5] = 0
    with torch.no_grad():
        full_BTV, _ = policy(tokens_BT, mask_BT)
        cache = policy.init_cache(4, 12)
        logits = [policy.prefill(tokens_BT[:, :6], mask_BT[:, :6], cache)]
        logits += [policy.decode_step(tokens_BT[:, t], cache) for t in range(6, 11)]
    cached_BTV = torch.stack(logits, 1)
    torch.testing.assert_close(cached_BTV, full_BTV[:, 5:11], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.7,
                                                                       top_p=0.9)])
def test_on_policy_first_pass_on_cuda(tmp_path, sampling: SamplingConfig) -> None:
    cfg = TrainConfig(method="grpo", sampling=sampling,
                      task_options=TaskConfig(seq_len=6, eval_batches=1, eval_batch_size=16),
                      run=RunConfig(num_steps=2, batch_size=32, inner_epochs=2, eval_every=0,
                                    device="cuda", progress=False, runs_dir=str(tmp_path)))
    first = train(cfg).metrics[0]
    assert abs(first["policy/ratio_mean_first"] - 1.0) < 1e-5
    assert first["policy/clipfrac_region_first"] == 0.0
    assert first["sampler/logp_diff_max"] < 1e-4


def test_prompt_batch_moves_to_cuda() -> None:
    batch = PromptBatch(tokens_BP=torch.zeros(2, 3, dtype=torch.long)).to("cuda")
    assert batch.tokens_BP.device.type == "cuda"


# --- CUDA graphs: the graphed sampler and learner compute what the eager paths compute ---

def _assert_same_rollout(graphed: RolloutBatch, eager: RolloutBatch) -> None:
    """Same tokens, masks and kept sets; log-probs within 1e-6 (absolute + relative).

    The paths multiply in different orders (cuBLAS picks other kernels for the graphed
    step), so logits differ by float32 rounding, ~1e-7 relative; a temperature of 0.7 and the
    top-p renormalisation scale that by ~3 in the log-probs.
    """
    for f in dataclasses.fields(eager):
        a, b = getattr(graphed, f.name), getattr(eager, f.name)
        assert (a is None) == (b is None), f.name
        if a is None:
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, f.name
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=lambda m, n=f.name:
                                       f"{n}: {m}")
        else:
            assert torch.equal(a, b), f.name


@pytest.mark.parametrize("cfg", [
    SamplingConfig(),
    SamplingConfig(temperature=0.7, top_k=4, top_p=0.9),
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.3, stop_token_ids=(2, 3)),
])
@pytest.mark.parametrize("padded", [False, True])
def test_graphed_sampler_equals_eager(cfg: SamplingConfig, padded: bool) -> None:
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=6, max_len=40)).cuda().eval()
    g = torch.Generator().manual_seed(1)
    eager_cfg = dataclasses.replace(cfg, decode_graphs=False)
    lengths = []
    for _ in range(3):  # the first call captures, the next ones replay
        tokens_BP = torch.randint(0, 6, (64, 9), generator=g)
        mask_BP = torch.ones_like(tokens_BP)
        if padded:
            mask_BP[::3, :4] = 0
        prompts = PromptBatch(tokens_BP, mask_BP if padded else None).to("cuda")
        seeds_B = torch.randint(0, 2**62, (64,), generator=g).cuda()
        out = generate(policy, prompts, cfg, seeds_B, 30, with_entropy=True, with_sum_p2=True)
        _assert_same_rollout(out, generate(policy, prompts, eager_cfg, seeds_B, 30,
                                           with_entropy=True, with_sum_p2=True))
        assert out.sum_p2_sampler_BT is not None
        lengths.append(out.completion_tokens_BT.shape[1])
        with torch.no_grad():  # graphs read the parameters in place: they see updates
            for p in policy.parameters():
                p.add_(0.05 * torch.randn_like(p))
    if cfg.stop_token_ids:  # calls ended early, when every row had stopped
        assert max(lengths) < 30


def test_graphed_sampler_recaptures_when_parameters_move() -> None:
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=5, max_len=24)).cuda().eval()
    prompts = PromptBatch(torch.randint(0, 5, (16, 8))).to("cuda")
    seeds_B = torch.arange(16, device="cuda")
    generate(policy, prompts, SamplingConfig(), seeds_B, 10)
    policy = policy.double()  # new parameter tensors
    _assert_same_rollout(generate(policy, prompts, SamplingConfig(), seeds_B, 10),
                         generate(policy, prompts, SamplingConfig(decode_graphs=False), seeds_B,
                                  10))


def test_kv_cache_beats_recompute_at_128_tokens() -> None:
    """The issue's bar: the cached (graphed) sampler is >= 5x full recompute at 128 tokens."""
    bench = BenchConfig(device="cuda", new_tokens=(128,), repeats=3, skip_loop=True)
    result = bench_sampler(bench, torch.device("cuda"))
    assert result["sampler_cache_speedup@128"] >= 5.0, result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("method", "run_kw", "selection"), [
    ("grpo", {"micro_batch_size": 12}, "mixed_groups"),  # padded rows, accumulation
    ("grpo", {"num_minibatches": 2}, "none"),             # two graphs per pass
    ("ppo", {}, None),                                    # value head, reference, adaptive β
    ("tpo", {"micro_batch_size": 12, "group_size": 4}, "mixed_groups"),  # groups coupled
])
def test_graphed_learner_equals_eager(method: str, run_kw: dict[str, Any],
                                      selection: str | None, dtype: torch.dtype) -> None:
    """`GraphedUpdate` against `learner.update` on the same batches, parameters compared.

    Both use capturable AdamW: the default AdamW computes its bias correction in float64 on the
    host, the capturable one in float32 on the device (relative 1e-5 for 1 − β2^t), a
    difference of PyTorch's two optimizers, not of the graphs. In float64 the two agree to
    rounding. In float32 the padded steps sum over more rows, so rounding differs, and Adam
    turns the pure-rounding gradient of the key bias (softmax ignores a shift of every key)
    into steps of up to lr·noise/eps: those parameters drift apart by ~1e-5 per step while the
    function stays the same, hence the looser parameter tolerance.
    """
    spec = resolve_method(method, MethodConfig(selection=selection))
    task = make_task("token_reversal", TaskConfig(seq_len=6))
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=3, max_len=13)).cuda().to(dtype)
    value_head = ValueHead(policy.hidden_size).cuda().to(dtype) if spec.needs_value else None
    twin = copy.deepcopy(policy), copy.deepcopy(value_head)
    params = [p for m in (policy, value_head) if m is not None for p in m.parameters()]
    twin_params = [p for m in twin if m is not None for p in m.parameters()]
    eager_opt = torch.optim.AdamW(params, lr=1e-3, capturable=True)
    graph_opt = torch.optim.AdamW(twin_params, lr=1e-3, capturable=True)
    plan = UpdatePlan(spec=spec, inner_epochs=3, num_minibatches=run_kw.get("num_minibatches", 1),
                      micro_batch_size=run_kw.get("micro_batch_size", 48), max_len=6,
                      grad_clip=1.0, dist=SampledDistribution(1.0, True),
                      group_size=run_kw.get("group_size", 1))
    graphed = GraphedUpdate(plan, twin[0], twin[1], graph_opt, rows=48)
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else \
        {"atol": 1e-10, "rtol": 1e-8}
    param_tol = {"atol": 3e-4, "rtol": 1e-3} if dtype == torch.float32 else tol
    g = torch.Generator().manual_seed(1)
    kept = set()
    for step in range(5):
        prompts = task.sample_prompts(g, 12).repeat_interleave(4).to("cuda")
        seeds_B = torch.randint(0, 2**62, (48,), generator=g).cuda()
        batch = generate(policy, prompts, SamplingConfig(decode_graphs=False), seeds_B, 6)
        rewards_B = task.score(batch).rewards_B
        batch = dataclasses.replace(batch, rewards_B=rewards_B, raw_rewards_B=rewards_B)
        if spec.selection == "mixed_groups":
            batch = batch.select(mixed_groups(rewards_B, 4)[0])
        if spec.needs_whole_groups and step % 2:  # a dropped group: padded rows every other step
            batch = batch.select(torch.arange(4, batch.batch_size, device="cuda"))
        kept.add(batch.batch_size)
        inputs, _ = prepare(spec, batch, policy, value_head, None, 0.04, 4,
                            SampledDistribution(1.0, True))
        a = update(plan, policy, value_head, eager_opt, batch, inputs, 0.04)
        b = graphed(batch, inputs, 0.04)
        for x, y in ((a.first.logp_BT, b.first.logp_BT), (a.last.logp_BT, b.last.logp_BT),
                     (a.grad_norms_S, b.grad_norms_S), (a.last.loss, b.last.loss)):
            torch.testing.assert_close(y, x, **tol)
        for name in a.last.stats:
            torch.testing.assert_close(b.last.stats[name], a.last.stats[name], **tol)
        for x, y in zip(params, twin_params, strict=True):
            torch.testing.assert_close(y, x, **param_tol)
    if spec.selection == "mixed_groups":
        assert min(kept) < 48, "no step exercised the padded rows"
    assert len(graphed.layouts) == 1


@pytest.mark.parametrize("method", ["grpo", "tpo", "tpo_token", "self_distill_dg"])
def test_train_with_and_without_graphs_agree(tmp_path, method: str) -> None:
    """Whole runs, graphs on and off, float64: the same rollouts and (up to capturable AdamW's
    float32 bias correction) the same parameters. tpo couples a group's rows, tpo_token reads
    candidates and self_distill_dg labels from the learner inputs the graphs copy."""
    def run(graphs: bool) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
        cfg = TrainConfig(method=method, task_options=TaskConfig(seq_len=6, eval_batches=1,
                                                                 eval_batch_size=16),
                          model=ModelConfig(dtype="float64"),
                          run=RunConfig(num_steps=2, batch_size=32, inner_epochs=2,
                                        eval_every=1, device="cuda", progress=False,
                                        runs_dir=str(tmp_path), cuda_graphs=graphs,
                                        name=f"{method}_{graphs}"))
        result = train(cfg)
        payload = torch.load(result.run_dir / "checkpoints" / "step_2.pt", weights_only=True)
        return payload["policy"], result.metrics

    (graphed, m_graphed), (eager, m_eager) = run(True), run(False)
    for name, value in eager.items():
        torch.testing.assert_close(graphed[name], value, atol=1e-6, rtol=1e-5, msg=name)
    for a, b in zip(m_graphed, m_eager, strict=True):
        assert a["reward/mean"] == b["reward/mean"] and a["length/mean"] == b["length/mean"]
        assert abs(a["loss/total"] - b["loss/total"]) < 1e-6


def test_graphed_learner_reads_changing_coefficients_and_full_kl() -> None:
    """The KL β (warm-up: 0, then β_after) and the adaptive entropy coefficient c change
    between updates; the graphs read both from device tensors filled before each replay, so
    they must match eager `learner.update` with the same values (a baked-in first value would
    not). The full KL term reads the stored reference distribution. float64, capturable AdamW
    on both sides."""
    spec = resolve_method("reinforce", MethodConfig(kl_coef=0.1, kl_target="ref",
                                                    kl_estimator="full",
                                                    entropy_control="adaptive"))
    task = make_task("token_reversal", TaskConfig(seq_len=6))
    torch.manual_seed(0)
    policy = TinyTransformer(TinyConfig(vocab_size=3, max_len=13)).cuda().double()
    torch.manual_seed(1)
    ref = TinyTransformer(TinyConfig(vocab_size=3, max_len=13)).cuda().double().eval()
    twin = copy.deepcopy(policy)
    eager_opt = torch.optim.AdamW(policy.parameters(), lr=1e-3, capturable=True)
    graph_opt = torch.optim.AdamW(twin.parameters(), lr=1e-3, capturable=True)
    plan = UpdatePlan(spec=spec, inner_epochs=2, num_minibatches=1, micro_batch_size=16,
                      max_len=6, grad_clip=1.0, dist=SampledDistribution(1.0, True))
    graphed = GraphedUpdate(plan, twin, None, graph_opt, rows=32)
    tol = {"atol": 1e-10, "rtol": 1e-8}
    g = torch.Generator().manual_seed(2)
    for beta, coef in ((0.0, 0.0), (0.0, 0.01), (0.1, 0.02), (0.1, 0.005)):
        prompts = task.sample_prompts(g, 32).to("cuda")
        seeds_B = torch.randint(0, 2**62, (32,), generator=g).cuda()
        batch = generate(policy, prompts, SamplingConfig(top_k=2, decode_graphs=False), seeds_B,
                         6)
        rewards_B = task.score(batch).rewards_B
        batch = dataclasses.replace(batch, rewards_B=rewards_B, raw_rewards_B=rewards_B)
        inputs, _ = prepare(spec, batch, policy, None, ref, beta, 1, SampledDistribution(1.0, True))
        assert inputs.ref_logp_BTV is not None
        a = update(plan, policy, None, eager_opt, batch, inputs, beta, coef)
        b = graphed(batch, inputs, beta, coef)
        torch.testing.assert_close(b.last.loss, a.last.loss, **tol)
        for key in ("loss/kl", "loss/entropy"):
            torch.testing.assert_close(b.last.parts[key], a.last.parts[key], **tol)
        for x, y in zip(policy.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(y, x, **tol)
    assert len(graphed.layouts) == 1  # one capture served every coefficient


@pytest.mark.parametrize("arch", ["tiny", "qwen2"])
def test_bf16_autocast_keeps_float32_master_weights_on_cuda(tmp_path, arch: str) -> None:
    """--autocast bf16 on CUDA: weights and optimizer state stay float32, the first pass is
    on-policy up to bf16 rounding (the sampler's cached decode and the learner's full forward
    run different kernels), and the CUDA-graphed run agrees with the eager one."""
    def run(graphs: bool) -> Any:
        cfg = TrainConfig(method="grpo", task_options=TaskConfig(seq_len=6, eval_batches=1,
                                                                 eval_batch_size=16),
                          model=ModelConfig(arch=arch, autocast="bf16"),
                          run=RunConfig(num_steps=3, batch_size=32, eval_every=0,
                                        device="cuda", progress=False, doctor_every=0,
                                        runs_dir=str(tmp_path), cuda_graphs=graphs,
                                        name=f"{arch}_{graphs}"))
        return train(cfg)

    graphed, eager = run(True), run(False)
    payload = torch.load(graphed.run_dir / "checkpoints" / "step_3.pt", weights_only=True)
    assert {v.dtype for v in payload["policy"].values() if v.is_floating_point()} \
        == {torch.float32}
    first = graphed.metrics[0]
    assert abs(first["policy/ratio_mean_first"] - 1.0) < 0.02
    assert first["sampler/logp_diff_max"] < 0.1
    # same seed and precision: the rollouts of the first step are the same token ids
    assert graphed.metrics[0]["reward/mean"] == eager.metrics[0]["reward/mean"]
    for a, b in zip(graphed.metrics, eager.metrics, strict=True):
        assert abs(a["policy/entropy"] - b["policy/entropy"]) < 0.05


def test_bf16_autocast_matches_float32_logits_on_cuda() -> None:
    from rlscope.policy import build_policy

    torch.manual_seed(0)
    policy = build_policy(ModelConfig(arch="qwen2", d_model=256, n_heads=4, n_layers=4,
                                      autocast="bf16"), 256, 64).cuda().eval()
    tokens_BT = torch.randint(0, 256, (8, 48), device="cuda")
    with torch.no_grad():
        bf16_BTV, _ = policy(tokens_BT)
        policy.autocast_dtype = None
        fp32_BTV, _ = policy(tokens_BT)
    assert bf16_BTV.dtype == torch.float32
    gap = (bf16_BTV.log_softmax(-1) - fp32_BTV.log_softmax(-1)).abs()
    assert 0 < gap.max().item() < 0.1 and gap.mean().item() < 0.01


def _hf_static_case(arch: str, autocast: torch.dtype | None = None,
                    **shape: int) -> tuple[Any, ...]:
    """A tiny HF policy on CUDA (``shape``: `tiny_hf_model`'s sizes) and ragged left-padded
    grouped prompts with stop tokens."""
    from rlscope.policy.hf import HFPolicy, tiny_hf_model

    policy = HFPolicy(tiny_hf_model(arch, 40, seed=0, **shape)).cuda().eval()
    policy.autocast_dtype = autocast
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(12, 40, (3 + 4 * i,), generator=g) for i in range(3)]
    prompts = PromptBatch.left_padded(rows).repeat_interleave(3).to(torch.device("cuda"))
    seeds_B = torch.randint(0, 2**62, (9,), generator=g).cuda()
    group_B = torch.arange(3).repeat_interleave(3).cuda()
    return policy, prompts, seeds_B, group_B


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("cfg", [SamplingConfig(stop_token_ids=(3, 5, 7, 11)),
                                 SamplingConfig(temperature=0.7, top_k=10, top_p=0.9,
                                                stop_token_ids=(3, 5, 7, 11))])
def test_graphed_hf_sampler_equals_eager_in_fp32(arch: str, cfg: SamplingConfig) -> None:
    from rlscope.sampling.backends import hf_static

    policy, prompts, seeds_B, group_B = _hf_static_case(arch)
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 24,
                     group_id_B=group_B, with_entropy=True)
    static = generate(policy, prompts, dataclasses.replace(cfg, backend="static"), seeds_B, 24,
                      group_id_B=group_B, with_entropy=True)
    buckets = hf_static._DECODERS[policy][2]
    assert all(b.graph is not None for b in buckets.values())  # the decode step was graphed
    assert bool(eager.finished_by_stop_B.any())
    assert torch.equal(static.completion_tokens_BT, eager.completion_tokens_BT)
    assert torch.equal(static.completion_mask_BT, eager.completion_mask_BT)
    for name in ("logp_sampler_BT", "logp_raw_BT", "entropy_BT"):
        torch.testing.assert_close(getattr(static, name), getattr(eager, name), atol=1e-4,
                                   rtol=0)
    again = generate(policy, prompts, dataclasses.replace(cfg, backend="static"), seeds_B, 24,
                     group_id_B=group_B, with_entropy=True)  # graph replayed, not recaptured
    assert torch.equal(again.completion_tokens_BT, static.completion_tokens_BT)


def test_graphed_hf_sampler_sees_an_optimizer_step() -> None:
    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2")
    cfg = SamplingConfig(backend="static", stop_token_ids=(3, 5))
    before = generate(policy, prompts, cfg, seeds_B, 16, group_id_B=group_B)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    logits_BTV, _ = policy(prompts.tokens_BP, prompts.attention_mask_BP)
    logits_BTV.logsumexp(-1).mean().backward()
    optimizer.step()
    after = generate(policy, prompts, cfg, seeds_B, 16, group_id_B=group_B)
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 16,
                     group_id_B=group_B)
    assert not torch.equal(before.logp_raw_BT, after.logp_raw_BT)
    assert torch.equal(after.completion_tokens_BT, eager.completion_tokens_BT)
    torch.testing.assert_close(after.logp_raw_BT, eager.logp_raw_BT, atol=1e-4, rtol=0)


def test_graphed_hf_sampler_under_bf16_autocast() -> None:
    """bf16 sampler weights: log-probs within bf16 tolerance of the learner's teacher-forced
    forward (bf16 autocast) on the sampled tokens, and the first tokens the eager path's."""
    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2", torch.bfloat16)
    cfg = SamplingConfig(stop_token_ids=(3, 5, 7, 11))
    static = generate(policy, prompts, dataclasses.replace(cfg, backend="static"), seeds_B, 24,
                      group_id_B=group_B)
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 24,
                     group_id_B=group_B)
    seq_BT = torch.cat([prompts.tokens_BP, static.completion_tokens_BT], 1)
    assert prompts.attention_mask_BP is not None
    mask_BT = torch.cat([prompts.attention_mask_BP, torch.ones_like(
        static.completion_tokens_BT)], 1)
    with torch.no_grad():
        logits_BTV, _ = policy(seq_BT, mask_BT)
    P, T = prompts.tokens_BP.shape[1], static.completion_tokens_BT.shape[1]
    learner_BT = logits_BTV[:, P - 1:P - 1 + T].log_softmax(-1).gather(
        -1, static.completion_tokens_BT[..., None])[..., 0] * static.completion_mask_BT
    gap = (learner_BT - static.logp_raw_BT).abs()
    assert gap.max().item() < 0.1 and gap.mean().item() < 0.01
    same_first = (static.completion_tokens_BT[:, 0] == eager.completion_tokens_BT[:, 0])
    assert same_first.float().mean().item() >= 0.8


def test_compiled_graphed_hf_sampler_equals_eager() -> None:
    """``compile_sampler``: the inductor-compiled decode step, captured in a CUDA graph."""
    policy, prompts, seeds_B, group_B = _hf_static_case("llama")
    cfg = SamplingConfig(stop_token_ids=(3, 5, 7, 11))
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 16,
                     group_id_B=group_B)
    compiled = generate(policy, prompts, dataclasses.replace(cfg, backend="static",
                                                             compile_sampler=True),
                        seeds_B, 16, group_id_B=group_B)
    assert torch.equal(compiled.completion_tokens_BT, eager.completion_tokens_BT)
    torch.testing.assert_close(compiled.logp_raw_BT, eager.logp_raw_BT, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_draw_equals_draw_on_cuda(temperature: float) -> None:
    """`fused_draw` on bf16 logits at Qwen2.5-0.5B's vocabulary: `draw`'s tokens (same
    noise), its log-probs, entropy and Σp² to float32 rounding; dead rows emit the pad token."""
    pytest.importorskip("triton")
    from rlscope.sampling.backends import fused_draw
    from rlscope.sampling.draw import draw
    from rlscope.sampling.processors import gumbel_offsets

    g = torch.Generator().manual_seed(0)
    logits_BV = (torch.randn(64, 151936, generator=g) * 4).cuda().bfloat16()
    seeds_B = torch.randint(0, 2**62, (64,), generator=g).cuda()
    alive_B = torch.rand(64, generator=g).cuda() > 0.1
    cfg = SamplingConfig(temperature=temperature)
    assert fused_draw.applies(cfg, 151936, logits_BV.device)
    for step in (0, 1, 200):
        step_t = torch.tensor(step, device="cuda")
        want = draw(logits_BV, alive_B, gumbel_offsets(seeds_B, step, 151936), cfg, 0, True,
                    True)
        got = fused_draw.fused_draw(logits_BV, alive_B, seeds_B, step_t, cfg, 0, True, True)
        assert torch.equal(got.token_B, want.token_B)
        for name in ("logp_sampler_B", "logp_raw_B", "entropy_B", "sum_p2_B"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-4,
                                       rtol=1e-5)


@pytest.mark.parametrize("compiled", [False, True])
def test_static_sampler_with_the_fused_draw_equals_eager(monkeypatch: pytest.MonkeyPatch,
                                                         compiled: bool) -> None:
    """The static sampler drawing through `fused_draw` (forced on at a 40-token vocabulary),
    graphed and compiled: the eager path's tokens and log-probs in float32. (Calls are
    counted only uncompiled: a counter mutated inside the compiled step would change its
    guards and recompile it during the graph capture.)"""
    pytest.importorskip("triton")
    from rlscope.sampling.backends import fused_draw, hf_static

    monkeypatch.setattr(fused_draw, "MIN_VOCAB", 0)
    monkeypatch.setattr(fused_draw, "CHUNK", 16)
    monkeypatch.setattr(fused_draw, "BLOCK", 16)
    calls: list[int] = []
    if not compiled:
        plain = fused_draw.fused_draw
        monkeypatch.setattr(fused_draw, "fused_draw",
                            lambda *a, **kw: calls.append(1) or plain(*a, **kw))
    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2")
    cfg = SamplingConfig(stop_token_ids=(3, 5, 7, 11), temperature=0.9)
    assert fused_draw.applies(cfg, 40, torch.device("cuda"))
    eager = generate(policy, prompts, dataclasses.replace(cfg, backend="eager"), seeds_B, 20,
                     group_id_B=group_B, with_entropy=True)
    hf_static._DECODERS.clear()
    static = generate(policy, prompts, dataclasses.replace(cfg, backend="static",
                                                           compile_sampler=compiled),
                      seeds_B, 20, group_id_B=group_B, with_entropy=True)
    assert compiled or len(calls) >= 2  # the prefill's graph and the decode step's
    assert torch.equal(static.completion_tokens_BT, eager.completion_tokens_BT)
    for name in ("logp_sampler_BT", "logp_raw_BT", "entropy_BT"):
        torch.testing.assert_close(getattr(static, name), getattr(eager, name), atol=1e-4,
                                   rtol=0)


@pytest.mark.parametrize("setting,probe", [("SPLIT_K_DOWN", "_split_down"),
                                           ("SPLIT_K_OUT", "_split_out")])
def test_split_k_projections_on_cuda(monkeypatch: pytest.MonkeyPatch, setting: str,
                                     probe: str) -> None:
    """`hf_static.split_k_linear` equals the float32 product of the bf16 operands, and the
    compiled, graphed sampler with `hf_static.SPLIT_K_DOWN` (the down projection) or
    `hf_static.SPLIT_K_OUT` (the output projection), the only step each applies to, keeps its
    log-probs as close to the learner's teacher-forced forward as without it (bf16), starting
    from a fresh process state (the Triton kernels loaded by the bucket, not lazily inside
    the compiled step, which recompiled it inside the graph capture)."""
    from rlscope.sampling.backends import hf_static

    g = torch.Generator().manual_seed(0)
    x_NI = torch.randn(256, 1, 3072, generator=g).cuda().bfloat16()
    w_OI = (torch.randn(768, 3072, generator=g) * 0.02).cuda().bfloat16()
    got = hf_static.split_k_linear(x_NI, w_OI, 4)
    assert got.dtype == torch.float32 and got.shape == (256, 1, 768)
    torch.testing.assert_close(got, x_NI.float() @ w_OI.float().T, atol=1e-3, rtol=1e-3)
    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2", torch.bfloat16)
    cfg = SamplingConfig(backend="static", stop_token_ids=(3, 5, 7, 11), compile_sampler=True)
    weights = hf_static.HFStaticWeights(policy.unwrap(), torch.bfloat16)
    x_B1D = torch.zeros(4, 1, 8, device="cuda")
    monkeypatch.setattr(hf_static, setting, 4)

    def split_count(x: torch.Tensor) -> torch.Tensor:
        return x + getattr(weights, probe)(x)

    assert split_count(x_B1D).max().item() == 0  # eager (graphed, not compiled): no split
    assert torch.compile(split_count)(x_B1D).min().item() == 4  # traced by torch.compile
    if setting == "SPLIT_K_OUT":  # a bias of the output projection is added in float32
        weights.refresh()
        x_B1D = torch.randn(4, 1, weights.embed.shape[1], generator=g).cuda()
        attn_B1E = torch.randn(4, 1, weights.w_o[0].shape[1], generator=g).cuda().bfloat16()
        plain = weights._finish_layer(0, x_B1D, attn_B1E)
        bias = torch.randn(weights.w_o[0].shape[0], generator=g).cuda().bfloat16()
        weights.b_o[0] = bias  # this test's own copy of the weights
        split = weights._finish_layer(0, x_B1D, attn_B1E, split_out=4)
        biased = weights._finish_layer(0, x_B1D, attn_B1E)
        torch.testing.assert_close(split, biased, atol=5e-2, rtol=5e-2)
        assert not torch.allclose(split, plain, atol=5e-2, rtol=5e-2)  # the bias was added
    gaps = {}
    for split in (4, 0):
        _forget_kernels(monkeypatch)
        monkeypatch.setattr(hf_static, setting, split)
        hf_static._DECODERS.clear()
        out = generate(policy, prompts, cfg, seeds_B, 24, group_id_B=group_B)
        gaps[split] = _learner_gap(policy, prompts, out)
    assert gaps[4].max().item() < 0.1
    assert gaps[4].mean().item() < 2 * gaps[0].mean().item() + 1e-3


def _forget_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a fresh process: no Triton kernel module imported yet, no compiled step."""
    from rlscope.sampling.backends import decode_attention, fused_draw, gate_up, triton_layers

    monkeypatch.setattr(decode_attention, "_KERNELS", {})
    monkeypatch.setattr(fused_draw, "_KERNELS", {})
    monkeypatch.setattr(gate_up, "_KERNELS", {})
    monkeypatch.setattr(triton_layers, "_KERNELS", {})
    torch._dynamo.reset()


def test_triton_layer_kernels_on_cuda() -> None:
    """`triton_layers`' kernels in bf16 at the 104M shape (256 rows): each equals its torch
    reference to bf16 rounding, and launched with programmatic dependent launch from a CUDA
    graph (where the card has it) each gives the same bits as launched plainly."""
    from rlscope.sampling.backends import triton_layers as tl_

    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).cuda()

    M, D, X, inter = 256, 768, 1280, 3072
    h = rnd(M, D).bfloat16()
    w_qkv, b_qkv = rnd(X, D, scale=D ** -0.5).bfloat16(), rnd(X).bfloat16()
    w_o = rnd(D, D, scale=D ** -0.5).bfloat16()
    w_gu, w_down = rnd(2 * inter, D, scale=D ** -0.5).bfloat16(), \
        rnd(D, inter, scale=inter ** -0.5).bfloat16()
    act = rnd(M, inter).bfloat16()
    norm_g, x0 = rnd(D), rnd(M, D)
    pdl = tl_.supports_pdl(torch.device("cuda"))

    def chain(pdl: bool) -> dict[str, torch.Tensor]:
        out = {"qkv": torch.empty(M, X, dtype=torch.bfloat16, device="cuda"),
               "o": torch.empty(4, M, D, device="cuda"),
               "gu": torch.empty(M, inter, dtype=torch.bfloat16, device="cuda"),
               "down": torch.empty(4, M, D, device="cuda"), "x": x0.clone(),
               "h": torch.empty(M, D, dtype=torch.bfloat16, device="cuda")}
        tl_.linear(h, w_qkv, b_qkv, out["qkv"], tl_.TILES["qkv"], pdl)
        tl_.split_k(out["qkv"][:, :D], w_o, out["o"], tl_.TILES["out"], pdl)
        tl_.gate_up_silu(h, w_gu, out["gu"], tl_.TILES["gate_up"], pdl)
        tl_.split_k(act, w_down, out["down"], tl_.TILES["down"], pdl)
        tl_.add_norm(out["x"], out["down"], b_qkv[:D], norm_g, out["h"], 1e-6, pdl)
        return out

    plain = chain(False)
    F = torch.nn.functional
    torch.testing.assert_close(plain["qkv"], F.linear(h, w_qkv, b_qkv), atol=2e-2, rtol=2e-2)
    for name, a, w in (("o", plain["qkv"][:, :D], w_o), ("down", act, w_down)):
        S, width = 4, a.shape[1] // 4
        want = torch.stack([a[:, s * width:(s + 1) * width].float()
                            @ w[:, s * width:(s + 1) * width].float().T for s in range(S)])
        torch.testing.assert_close(plain[name], want, atol=1e-3, rtol=1e-3)
    gate, up = F.linear(h, w_gu).split(inter, -1)
    torch.testing.assert_close(plain["gu"], F.silu(gate) * up, atol=2e-2, rtol=2e-2)
    x1 = x0 + (plain["down"].sum(0) + b_qkv[:D].float())
    torch.testing.assert_close(plain["x"], x1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain["h"].float(), F.rms_norm(x1, (D,), norm_g, 1e-6),
                               atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    chain(pdl)  # compiles the PDL variants outside the capture
    with torch.cuda.graph(graph):
        graphed = chain(pdl)
    graph.replay()
    torch.cuda.synchronize()
    for name, value in plain.items():
        assert torch.equal(graphed[name], value), name


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_triton_layers_in_the_sampler_on_cuda(monkeypatch: pytest.MonkeyPatch,
                                              compiled: bool, wide: bool) -> None:
    """The graphed sampler with `hf_static.TRITON_LAYERS` (every decode layer as Triton
    kernels with PDL) keeps its log-probs as close to the learner's teacher-forced forward as
    the step's own layers do (bf16, ragged left-padded prompts, stops), compiled or not, from
    a fresh process state; the captured decode step ran `triton_layers.run`; with
    `triton_layers.PDL` off the same kernels give the same bits. ``wide``: hidden 256 (head
    dim 64, MLP 512), which the default tiles fit; else the tiny model's widths (64, 128) with
    smaller tiles."""
    from rlscope.sampling.backends import hf_static, triton_layers

    shape = {"hidden_size": 256, "num_heads": 4} if wide else {}
    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2", torch.bfloat16, **shape)
    cfg = SamplingConfig(backend="static", stop_token_ids=(3, 5, 7, 11),
                         compile_sampler=compiled)
    monkeypatch.setattr(hf_static, "decode_attention_kind", lambda *a: "triton")
    if not wide:
        monkeypatch.setattr(triton_layers, "TILES", {k: (64, 32, 16, 4, 2)
                                                     for k in triton_layers.TILES})
    calls: list[int] = []
    plain_run = hf_static._run_triton_layers
    monkeypatch.setattr(hf_static, "_run_triton_layers",
                        lambda *a: calls.append(1) or plain_run(*a))
    gaps, outs = {}, {}
    for on, pdl in ((True, True), (False, True), (True, False)):
        _forget_kernels(monkeypatch)
        monkeypatch.setattr(hf_static, "TRITON_LAYERS", on)
        monkeypatch.setattr(triton_layers, "PDL", pdl)
        hf_static._DECODERS.clear()
        before = len(calls)
        outs[on, pdl] = out = generate(policy, prompts, cfg, seeds_B, 24, group_id_B=group_B)
        gaps[on] = _learner_gap(policy, prompts, out)
        # the captured step ran the layers (the graph replays their kernels without Python)
        assert (len(calls) > before) == on
    assert gaps[True].max().item() < 0.1
    assert gaps[True].mean().item() < 2 * gaps[False].mean().item() + 1e-3
    # PDL changes when kernels start, not what they compute: the same bits with it off
    with_pdl, plain = outs[True, True], outs[True, False]
    assert torch.equal(with_pdl.completion_tokens_BT, plain.completion_tokens_BT)
    assert torch.equal(with_pdl.logp_raw_BT, plain.logp_raw_BT)


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_gate_up_on_cuda(monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    """`gate_up.gate_up_silu` equals the unfused bf16 steps (cuBLAS product, then
    ``F.silu(gate).mul_(up)``) to bf16 rounding at the 104M shape and on tails; the graphed
    sampler with `hf_static.FUSED_GATE_UP` keeps its log-probs as close to the learner's
    teacher-forced forward as without it (bf16, ragged prompts, stops), uncompiled and
    compiled, starting from a fresh process state."""
    pytest.importorskip("triton")
    from rlscope.sampling.backends import gate_up, hf_static

    g = torch.Generator().manual_seed(0)
    for M, D, n_in in ((256, 768, 3072), (37, 96, 100)):
        x_MD = torch.randn(M, D, generator=g).cuda().bfloat16()
        w_JD = (torch.randn(2 * n_in, D, generator=g) * 0.05).cuda().bfloat16()
        gate, up = torch.nn.functional.linear(x_MD, w_JD).split(n_in, -1)
        want = torch.nn.functional.silu(gate).mul_(up)
        got = gate_up.gate_up_silu(x_MD, w_JD)
        assert got.dtype == torch.bfloat16 and got.shape == (M, n_in)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2", torch.bfloat16)
    cfg = SamplingConfig(backend="static", stop_token_ids=(3, 5, 7, 11),
                         compile_sampler=compiled)
    calls: list[int] = []
    plain = gate_up.gate_up_silu
    monkeypatch.setattr(gate_up, "gate_up_silu", lambda *a: calls.append(1) or plain(*a))
    gaps = {}
    for fused in (True, False):
        _forget_kernels(monkeypatch)
        monkeypatch.setattr(hf_static, "FUSED_GATE_UP", fused)
        hf_static._DECODERS.clear()
        out = generate(policy, prompts, cfg, seeds_B, 24, group_id_B=group_B)
        assert bool(calls) == fused  # traced (compiled) or run (eager) only where it is on
        calls.clear()
        gaps[fused] = _learner_gap(policy, prompts, out)
    assert gaps[True].max().item() < 0.1
    assert gaps[True].mean().item() < 2 * gaps[False].mean().item() + 1e-3


def test_compiled_gumbel_offsets_equal_the_eager_ones() -> None:
    """The static sampler's compiled noise (`hf_static.COMPILE_NOISE`) is bit for bit the
    eager `gumbel_offsets`, so it draws the eager path's tokens."""
    from rlscope.sampling.backends.hf_static import _compiled_noise
    from rlscope.sampling.processors import column_keys, gumbel_offsets

    seeds_B = torch.randint(0, 2**62, (64,), generator=torch.Generator().manual_seed(0)).cuda()
    compiled = _compiled_noise()
    keys_V = column_keys(151936, torch.device("cuda"))
    for step in (0, 1, 200):
        step_t = torch.tensor(step, device="cuda")
        assert torch.equal(compiled(seeds_B, step_t, keys_V),
                           gumbel_offsets(seeds_B, step, 151936))


def _learner_gap(policy: Any, prompts: PromptBatch, out: Any) -> torch.Tensor:
    """``|learner - sampler|`` raw log-probs ``[B, T]`` of ``out``'s completions: the
    learner's teacher-forced forward of prompt + completion against the sampler's record."""
    seq_BT = torch.cat([prompts.tokens_BP, out.completion_tokens_BT], 1)
    assert prompts.attention_mask_BP is not None
    mask_BT = torch.cat([prompts.attention_mask_BP,
                         torch.ones_like(out.completion_tokens_BT)], 1)
    with torch.no_grad():
        logits_BTV, _ = policy(seq_BT, mask_BT)
    P, T = prompts.tokens_BP.shape[1], out.completion_tokens_BT.shape[1]
    learner_BT = logits_BTV[:, P - 1:P - 1 + T].log_softmax(-1).gather(
        -1, out.completion_tokens_BT[..., None])[..., 0] * out.completion_mask_BT
    return (learner_BT - out.logp_raw_BT).abs()


@pytest.mark.parametrize("compiled", [False, True])
def test_decode_kernels_under_bf16(monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    """bf16 on CUDA: the decode attention on the Triton kernel and on torch's flash kernel
    (per-row key lengths) gives log-probs as close to the learner's teacher-forced forward as
    the additive-mask form does, on ragged left-padded prompts with stops; also with the
    decode step compiled (``compile_sampler``)."""
    from rlscope.sampling.backends import hf_static

    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2", torch.bfloat16)
    cfg = SamplingConfig(backend="static", stop_token_ids=(3, 5, 7, 11),
                         compile_sampler=compiled)
    gaps = {}
    for kind in ("triton", "flash", "mask"):
        monkeypatch.setattr(hf_static, "DECODE_KERNEL", kind)
        out = generate(policy, prompts, cfg, seeds_B, 24, group_id_B=group_B)
        assert kind in [b.attention for b in hf_static._DECODERS[policy][2].values()]
        gaps[kind] = _learner_gap(policy, prompts, out)
    for kind in ("triton", "flash"):
        assert gaps[kind].max().item() < 0.1 and gaps[kind].mean().item() < 0.01
        assert gaps[kind].mean().item() < 2 * gaps["mask"].mean().item() + 1e-3


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_rope_decode_kernel_under_bf16(monkeypatch: pytest.MonkeyPatch,
                                             compiled: bool) -> None:
    """`hf_static.FUSE_ROPE` (rotation, cache writes and attention in one Triton kernel) gives
    the unfused Triton path's log-probs to bf16 rounding and mostly its tokens, on ragged
    left-padded prompts with stops; also compiled."""
    pytest.importorskip("triton")
    from rlscope.sampling.backends import hf_static

    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2", torch.bfloat16)
    cfg = SamplingConfig(backend="static", stop_token_ids=(3, 5, 7, 11),
                         compile_sampler=compiled)
    monkeypatch.setattr(hf_static, "DECODE_KERNEL", "triton")
    outs = []
    for fuse in (False, True):
        monkeypatch.setattr(hf_static, "FUSE_ROPE", fuse)
        hf_static._DECODERS.clear()
        outs.append(generate(policy, prompts, cfg, seeds_B, 24, group_id_B=group_B))
    plain, fused = outs
    same_BT = (plain.completion_tokens_BT[:, :4] == fused.completion_tokens_BT[:, :4])
    assert same_BT.float().mean().item() > 0.9
    first_B = plain.completion_tokens_BT[:, 0] == fused.completion_tokens_BT[:, 0]
    assert bool(first_B.all())  # the prefill is shared: the first draw is identical
    gap_B = (plain.logp_raw_BT[:, 1] - fused.logp_raw_BT[:, 1]).abs()
    assert gap_B[plain.completion_tokens_BT[:, 1] == fused.completion_tokens_BT[:, 1]].max() < 0.05


@pytest.mark.parametrize("compiled", [False, True])
def test_rope_table_equals_per_step_rotation_on_cuda(monkeypatch: pytest.MonkeyPatch,
                                                     compiled: bool) -> None:
    """`hf_static.ROPE_TABLE` (each bucket's table of every position's rotation, read by the
    fused kernel) against the rotation computed every step, bf16 on ragged left-padded prompts
    with stops: identical uncompiled (the same function of the position); compiled, where the
    step's own rotation is inductor's arithmetic and the table is eager, the tokens of the
    first positions and the log-probs to bf16 rounding."""
    pytest.importorskip("triton")
    from rlscope.sampling.backends import hf_static

    policy, prompts, seeds_B, group_B = _hf_static_case("qwen2", torch.bfloat16)
    cfg = SamplingConfig(backend="static", stop_token_ids=(3, 5, 7, 11),
                         compile_sampler=compiled)
    monkeypatch.setattr(hf_static, "DECODE_KERNEL", "triton")
    monkeypatch.setattr(hf_static, "FUSE_ROPE", True)
    outs = []
    for table in (False, True):
        monkeypatch.setattr(hf_static, "ROPE_TABLE", table)
        hf_static._DECODERS.clear()
        outs.append(generate(policy, prompts, cfg, seeds_B, 24, group_id_B=group_B))
        bucket = next(iter(hf_static._DECODERS[policy][2].values()))
        assert (bucket.rope_table is not None) == table
    per_step, tabled = outs
    if not compiled:
        assert torch.equal(per_step.completion_tokens_BT, tabled.completion_tokens_BT)
        assert torch.equal(per_step.logp_sampler_BT, tabled.logp_sampler_BT)
        return
    same_BT = per_step.completion_tokens_BT[:, :4] == tabled.completion_tokens_BT[:, :4]
    assert same_BT.float().mean().item() > 0.9
    same_B = per_step.completion_tokens_BT[:, 1] == tabled.completion_tokens_BT[:, 1]
    gap_B = (per_step.logp_raw_BT[:, 1] - tabled.logp_raw_BT[:, 1]).abs()
    assert gap_B[same_B].max() < 0.05


def test_triton_decode_attention_equals_flash_on_cuda() -> None:
    """The Triton decode kernel and torch's flash kernel on the same bf16 cache spans: equal
    to bf16 rounding (0.5B shape: 14 query heads over 2 kv heads, head dim 64)."""
    from rlscope.sampling.backends import decode_attention, hf_static

    g = torch.Generator().manual_seed(0)
    B, H, K, D, L = 64, 14, 2, 64, 200
    q_BHD = torch.randn(B, H, D, generator=g).cuda().bfloat16()
    k_BLKD, v_BLKD = torch.randn(2, B, L, K, D, generator=g).cuda().bfloat16()
    start_B = torch.randint(0, 60, (B,), generator=g).int().cuda()
    used_B = torch.randint(1, 140, (B,), generator=g).int().cuda()
    tri_BHD = decode_attention.decode_attention(q_BHD, k_BLKD, v_BLKD, start_B, used_B, 0.125)
    keys = hf_static.DecodeKeys(B, K, H, L, torch.bfloat16, torch.device("cuda"), "flash")
    keys.start_B.copy_(start_B)
    keys.cu_k[:B].copy_(torch.arange(B, device="cuda", dtype=torch.int32) * L + start_B)
    keys.used_B.copy_(used_B)
    flash_BE = keys.attend(q_BHD, k_BLKD, v_BLKD, 0.125)
    torch.testing.assert_close(tri_BHD.reshape(B, -1).float(), flash_BE.float(), atol=2e-2,
                               rtol=2e-2)


def test_compiled_chunk_kernels_equal_eager_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed learner's chunked log-prob/entropy with its compiled kernels
    (`chunked.COMPILE_CHUNKS`) equals the eager computation: values and gradients, float32
    softmax over bf16 logits, a last chunk shorter than the others."""
    from rlscope.policy import chunked

    g = torch.Generator().manual_seed(0)
    N, D, V = 300, 64, 5000
    h0 = torch.randn(N, D, generator=g).cuda()
    W0 = (torch.randn(V, D, generator=g) * 0.2).cuda()
    y = torch.randint(0, V, (N,), generator=g).cuda()
    c = torch.randn(N, generator=g).cuda()
    out = {}
    for compiled in (True, False):
        monkeypatch.setattr(chunked, "COMPILE_CHUNKS", compiled)
        h, W = h0.clone().requires_grad_(), W0.clone().requires_grad_()
        lp, ent = chunked.chunked_logp_entropy(h, W, None, y, 0.9, 128, torch.bfloat16)
        ((c * lp).sum() + (c * ent).sum()).backward()
        out[compiled] = (lp, ent, h.grad, W.grad)
    assert chunked._COMPILED.get("forward") is not None and not chunked._COMPILED.get("failed")
    for a, b in zip(out[True], out[False], strict=True):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-2)
