"""The packed learner (`rlscope.learner_packed`) and the chunked log-probs
(`rlscope.policy.chunked`) equal the padded, full-logits learner: fp64, 1e-10."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.config import LearnerConfig, RunConfig, TrainConfig
from rlscope.learner import (
    Denominators,
    LearnerInputs,
    UpdatePlan,
    micro_batch_loss,
    update,
)
from rlscope.learner_packed import (
    PackedLearner,
    pack_rows,
    resolve_learner,
    row_token_counts,
    token_budget_slices,
)
from rlscope.methods.configs import (
    AdvantageConfig,
    GateConfig,
    KLConfig,
    ObjectiveConfig,
    ValueConfig,
)
from rlscope.methods.objectives import OBJECTIVES
from rlscope.methods.spec import MethodSpec
from rlscope.policy import ModelConfig
from rlscope.policy.chunked import chunked_logp_entropy
from rlscope.policy.hf import HFPolicy, tiny_hf_model
from rlscope.policy.value_head import ValueHead
from rlscope.sampling import SamplingConfig
from rlscope.sampling.draw import assemble
from rlscope.sampling.processors import SampledDistribution
from rlscope.tasks import TaskConfig
from rlscope.train import train

F64 = torch.float64
V, B, P, T = 37, 6, 5, 7
TOL = 1e-10


def _policy(arch: str = "qwen2", attn: str = "sdpa") -> HFPolicy:
    """A tiny HF model in fp64. The padded reference runs SDPA: transformers' eager attention
    turns fully masked (left-padding) query rows into NaN in float64."""
    model = tiny_hf_model(arch, V, seed=3, hidden_size=32, num_heads=4, num_layers=2,
                          attn_implementation=attn)
    return HFPolicy(model).to(F64).train()


def _batch_inputs(seed: int = 0) -> tuple[RolloutBatch, LearnerInputs]:
    """Ragged left-padded prompts and ragged completions (one row without loss positions,
    one with a hole inside its loss mask)."""
    g = torch.Generator().manual_seed(seed)
    prompt_len_B = torch.tensor([5, 2, 3, 1, 4, 5])
    prompt_mask = (torch.arange(P)[None] >= (P - prompt_len_B)[:, None]).long()
    comp_len_B = torch.tensor([7, 3, 0, 5, 1, 6])
    mask = (torch.arange(T)[None] < comp_len_B[:, None]).to(F64)
    mask[5, 2] = 0.0
    tokens = torch.randint(0, V, (B, T), generator=g)
    logp_old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.5
    batch = RolloutBatch(
        prompt_tokens_BP=torch.randint(0, V, (B, P), generator=g) * prompt_mask,
        prompt_mask_BP=prompt_mask, completion_tokens_BT=tokens, completion_mask_BT=mask,
        logp_sampler_BT=logp_old, logp_raw_BT=logp_old,
        finished_by_stop_B=torch.zeros(B, dtype=torch.bool), group_id_B=torch.arange(B))
    inputs = LearnerInputs(
        adv_BT=torch.randn(B, T, generator=g, dtype=F64) * mask, mask_BT=mask,
        tokens_BT=tokens, logp_old_BT=logp_old,
        old_values_BT=torch.randn(B, T, generator=g, dtype=F64) * 0.1 * mask,
        returns_BT=torch.randn(B, T, generator=g, dtype=F64) * mask)
    return batch, inputs


def _spec(entropy_coef: float = 0.05, objective: str = "ppo_clip") -> MethodSpec:
    return MethodSpec(
        description="every per-token loss term", source="test", regime="test",
        advantage=AdvantageConfig("gae"), gate=GateConfig("delight", eta=0.7),
        objective=ObjectiveConfig(objective, clip_low=0.1, clip_high=0.15, dual_clip=2.0),
        kl=KLConfig(coef=0.1, estimator="k3", target="old"), entropy_coef=entropy_coef,
        value=ValueConfig(coef=0.5, clip=0.05))


def _run(policy: HFPolicy, value_head: ValueHead | None, spec: MethodSpec,
         packed: PackedLearner | None, temperature: float = 0.7
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    batch, inputs = _batch_inputs()
    den = Denominators(n_tokens=inputs.mask_BT.sum(), n_seqs=float(B), max_len=T)
    modules = [m for m in (policy, value_head) if m is not None]
    for m in modules:
        m.zero_grad(set_to_none=True)
    res = micro_batch_loss(spec, policy, value_head, batch, inputs, den, 0.1,
                           SampledDistribution(temperature, True), packed=packed)
    res.loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
             for m in modules for p in m.parameters()]
    return res.loss.detach(), res.logp_BT * inputs.mask_BT, res.entropy_BT * inputs.mask_BT, \
        grads


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> None:
    assert torch.allclose(a, b, rtol=0, atol=tol), (a - b).abs().max()


@pytest.mark.parametrize("packed", [PackedLearner(True, 3), PackedLearner(True, 0),
                                    PackedLearner(False, 4), PackedLearner(True, 5, True)],
                         ids=["packed-chunked", "packed-full", "padded-chunked",
                              "one-row-chunked"])
@pytest.mark.parametrize("arch,attn", [("qwen2", "sdpa"), ("llama", "eager")])
def test_packed_learner_equals_padded(packed: PackedLearner, arch: str, attn: str) -> None:
    """log-probs, entropy, loss and every parameter gradient (policy and value head) agree
    on ragged left-padded prompts and ragged completions, with an entropy bonus."""
    value_head = ValueHead(32).to(F64)
    torch.nn.init.normal_(value_head.linear.weight, std=0.1)
    spec = _spec()
    ref = _run(_policy(arch), value_head, spec, None)
    got = _run(_policy(arch, attn if packed.packing else "sdpa"), value_head, spec, packed)
    # eager attention takes its softmax in float32 even for a float64 model
    tol = TOL if attn == "sdpa" or not packed.packing else 1e-6
    for a, b in zip(ref[:3], got[:3], strict=True):
        _close(a, b, tol)
    assert len(ref[3]) == len(got[3]) > 10
    assert any(g.abs().sum() > 0 for g in ref[3][:-2])
    for a, b in zip(ref[3], got[3], strict=True):
        _close(a, b, tol)


def test_packed_learner_no_prompt_padding() -> None:
    """A batch without a prompt mask gives the padded learner's loss and gradients."""
    policy = _policy("qwen2")
    spec = _spec(entropy_coef=0.0)
    batch, inputs = _batch_inputs()
    batch = dataclasses.replace(batch, prompt_mask_BP=None)
    den = Denominators(n_tokens=inputs.mask_BT.sum(), n_seqs=float(B), max_len=T)
    out = []
    for packed in (None, PackedLearner(True, 5)):
        policy.zero_grad(set_to_none=True)
        res = micro_batch_loss(spec, policy, None, batch, inputs, den, 0.1,
                               SampledDistribution(1.0, True), packed=packed)
        res.loss.backward()
        out.append((res.loss.detach(), [p.grad.clone() for p in policy.parameters()]))
    _close(out[0][0], out[1][0])
    for a, b in zip(out[0][1], out[1][1], strict=True):
        _close(a, b)


def test_packed_forward_replays_kept_set() -> None:
    """With a replayed top-k kept set the chunked path does not apply; the packed forward
    keeps full logits at the packed positions and equals the padded learner."""
    policy = _policy()
    spec = _spec()
    batch, inputs = _batch_inputs()
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(B, T, V, generator=g) < 0.6
    keep.scatter_(-1, inputs.tokens_BT[..., None], True)
    batch = dataclasses.replace(batch, keep_mask_BTV=keep)
    den = Denominators(n_tokens=inputs.mask_BT.sum(), n_seqs=float(B), max_len=T)
    out = []
    for packed in (None, PackedLearner(True, 3)):
        policy.zero_grad(set_to_none=True)
        res = micro_batch_loss(spec, policy, None, batch, inputs, den, 0.1,
                               SampledDistribution(0.9, True), packed=packed)
        res.loss.backward()
        out.append((res.loss.detach(), res.entropy_BT * inputs.mask_BT,
                    [p.grad.clone() for p in policy.parameters()]))
    _close(out[0][0], out[1][0])
    _close(out[0][1], out[1][1])
    for a, b in zip(out[0][2], out[1][2], strict=True):
        _close(a, b)


@pytest.mark.parametrize("chunk", [1, 4, 7, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_logp_entropy_equals_full_logits(chunk: int, bias: bool) -> None:
    """Values and gradients (w.r.t. hidden, W and bias, through logp and entropy both) equal
    the full-logits computation; chunk sizes need not divide N."""
    g = torch.Generator().manual_seed(1)
    N, D, Vs, tau = 11, 6, 13, 0.8
    h = torch.randn(N, D, generator=g, dtype=F64, requires_grad=True)
    W = torch.randn(Vs, D, generator=g, dtype=F64, requires_grad=True)
    b = torch.randn(Vs, generator=g, dtype=F64, requires_grad=True) if bias else None
    y = torch.randint(0, Vs, (N,), generator=g)
    c_lp, c_ent = torch.randn(N, generator=g, dtype=F64), torch.randn(N, generator=g, dtype=F64)
    params = [h, W] + ([b] if b is not None else [])

    logits = h @ W.T + (b if b is not None else 0.0)
    logp_NV = (logits / tau).log_softmax(-1)
    ref_lp = logp_NV.gather(-1, y[:, None]).squeeze(-1)
    ref_ent = -(logp_NV.exp() * logp_NV).sum(-1)
    ref_grads = torch.autograd.grad((c_lp * ref_lp).sum() + (c_ent * ref_ent).sum(), params,
                                    retain_graph=True)

    lp, ent = chunked_logp_entropy(h, W, b, y, tau, chunk)
    grads = torch.autograd.grad((c_lp * lp).sum() + (c_ent * ent).sum(), params)
    assert lp.dtype == F64
    _close(lp, ref_lp)
    _close(ent, ref_ent)
    for a, r in zip(grads, ref_grads, strict=True):
        _close(a, r)
    # one output alone (the other's gradient is None in backward)
    g_h, = torch.autograd.grad(chunked_logp_entropy(h, W, b, y, tau, chunk)[0].sum(), [h])
    _close(g_h, torch.autograd.grad(ref_lp.sum(), [h])[0])


def test_chunked_kernels_trace_and_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk kernels as the CUDA path runs them (through ``torch.compile``; here its
    ``aot_eager`` backend, which traces without generating code) give the eager values and
    gradients; a kernel that fails sends the computation to the eager functions for good."""
    from rlscope.policy import chunked

    g = torch.Generator().manual_seed(3)
    N, D, Vs, tau = 9, 5, 17, 0.7
    h = torch.randn(N, D, generator=g, dtype=F64, requires_grad=True)
    W = torch.randn(Vs, D, generator=g, dtype=F64, requires_grad=True)
    y = torch.randint(0, Vs, (N,), generator=g)
    c = torch.randn(N, generator=g, dtype=F64)

    def loss() -> tuple[torch.Tensor, ...]:
        lp, ent = chunked_logp_entropy(h, W, None, y, tau, 4)
        return (lp, ent, *torch.autograd.grad((c * lp).sum() + (c * ent).sum(), [h, W]))

    eager = loss()
    traced = (torch.compile(chunked.forward_stats, backend="aot_eager"),
              torch.compile(chunked.score_grad, backend="aot_eager"))
    monkeypatch.setattr(chunked, "chunk_kernels", lambda device: traced)
    for a, b in zip(loss(), eager, strict=True):
        _close(a, b)

    def broken(*args: object) -> None:
        raise RuntimeError("no compiler")

    monkeypatch.setattr(chunked, "_COMPILED", {})
    monkeypatch.setattr(chunked, "chunk_kernels",
                        lambda device: (chunked.forward_stats, chunked.score_grad)
                        if chunked._COMPILED.get("failed") else (broken, broken))
    for a, b in zip(loss(), eager, strict=True):
        _close(a, b)
    assert chunked._COMPILED["failed"] is True


def test_chunked_upcasts_low_precision() -> None:
    """bf16 hidden states are computed in float32 and get a bf16 gradient."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(5, 4, generator=g).bfloat16().requires_grad_()
    W = torch.randn(9, 4, generator=g, requires_grad=True)
    y = torch.randint(0, 9, (5,), generator=g)
    lp, ent = chunked_logp_entropy(h, W, None, y, 1.0, 2)
    ref = (h.float() @ W.T).log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)
    assert lp.dtype == torch.float32
    assert torch.allclose(lp, ref, atol=1e-6)
    (lp.sum() + ent.sum()).backward()
    assert h.grad is not None and h.grad.dtype == torch.bfloat16


def test_chunked_rejects_bad_arguments() -> None:
    h, W, y = torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="chunk"):
        chunked_logp_entropy(h, W, None, y, 1.0, 0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logp_entropy(h, W, None, y, 0.0, 2)
    with pytest.raises(ValueError, match="tokens_N"):
        chunked_logp_entropy(h, W, None, y[:2], 1.0, 2)


def test_pack_rows_layouts() -> None:
    """First-fit decreasing into bins of the longest row, or one row for varlen kernels."""
    bins, starts, R, C = pack_rows([3, 5, 0, 2, 4, 1], one_row=False)
    assert (R, C) == (3, 5)
    # by length 5, 4, 3, 2, 1: [5], [4, 1], [3, 2]
    assert bins.tolist() == [2, 0, -1, 2, 1, 1] and starts.tolist() == [0, 0, 0, 3, 0, 4]
    bins, starts, R, C = pack_rows([3, 5, 0, 2], one_row=True)
    assert (R, C) == (1, 10)
    assert bins.tolist() == [0, 0, -1, 0] and starts.tolist() == [0, 3, 0, 8]


def test_row_token_counts_and_budget_slices() -> None:
    batch, inputs = _batch_inputs()
    counts = row_token_counts(batch, inputs.mask_BT)
    # prompt + completion up to the last loss position - 1; 0 without loss positions
    assert counts.tolist() == [5 + 6, 2 + 2, 0, 1 + 4, 4 + 0, 5 + 5]
    assert token_budget_slices(counts, 0, B, 12) == [slice(0, 1), slice(1, 4), slice(4, 5),
                                                     slice(5, 6)]
    assert token_budget_slices(counts, 0, B, 5) == [slice(0, 1), slice(1, 3), slice(3, 4),
                                                    slice(4, 5), slice(5, 6)]
    assert token_budget_slices(counts, 0, B, 100, unit=2) == [slice(0, 6)]
    assert token_budget_slices(counts, 2, 6, 10, unit=2) == [slice(2, 4), slice(4, 6)]


def test_token_budget_update_equals_one_big_batch() -> None:
    """Micro-batches sized by a token budget (packed) give the update of one padded batch."""
    batch, inputs = _batch_inputs()
    spec = _spec()
    params = {}
    for name, packed, budget in (("big", None, 0), ("budget", PackedLearner(True, 3), 9)):
        policy = _policy()
        opt = torch.optim.SGD(policy.parameters(), lr=0.5)
        plan = UpdatePlan(spec=spec, inner_epochs=1, num_minibatches=1, micro_batch_size=B,
                          max_len=T, grad_clip=0.0, dist=SampledDistribution(0.7, True),
                          packed=packed, token_budget=budget)
        result = update(plan, policy, None, opt, batch, inputs, 0.1)
        params[name] = ([p.detach().clone() for p in policy.parameters()], result)
    (big, r_big), (small, r_small) = params["big"], params["budget"]
    _close(r_big.grad_norms_S, r_small.grad_norms_S)
    _close(r_big.last.loss, r_small.last.loss)
    for a, b in zip(big, small, strict=True):
        _close(a, b)


def test_reads_distribution_flags_every_reader() -> None:
    """Every objective whose function reads ``logp_BTV`` is flagged, so the chunked path
    (which has none) never serves it; ``full`` KL in the loss counts too."""
    def reads(fn: object, seen: set[object]) -> bool:
        """The function's source, or that of a module-level function it calls, reads it."""
        seen.add(fn)
        if "logp_BTV" in inspect.getsource(fn):  # type: ignore[arg-type]
            return True
        called = (fn.__globals__.get(n) for n in fn.__code__.co_names)  # type: ignore[attr-defined]
        return any(reads(f, seen) for f in called if inspect.isfunction(f) and f not in seen)

    flagged = set()
    for name, comp in OBJECTIVES.items():
        assert comp.reads_distribution == reads(comp.fn, set()), name
        if comp.reads_distribution:
            flagged.add(name)
    assert {"tpo_full_action", "tpo_token", "self_distill"} <= flagged
    spec = _spec()
    assert not spec.reads_learner_distribution
    full = dataclasses.replace(spec, kl=KLConfig(coef=0.1, estimator="full", target="ref"))
    assert full.reads_learner_distribution
    assert dataclasses.replace(spec, objective=ObjectiveConfig("tpo_full_action")
                               ).reads_learner_distribution


def test_learner_config_resolution_and_validation() -> None:
    policy = _policy()
    assert resolve_learner(LearnerConfig(), policy) == PackedLearner(True, 1024, False)
    assert resolve_learner(LearnerConfig(packing="off", logprob_chunk=0), policy) is None
    assert resolve_learner(LearnerConfig(packing="off"), policy) == PackedLearner(False, 1024)
    from rlscope.policy.tiny import TinyConfig, TinyTransformer
    assert resolve_learner(LearnerConfig(), TinyTransformer(TinyConfig(V, P + T))) is None
    assert LearnerConfig().validate("tiny") == []
    errors = LearnerConfig(packing="on", token_budget=-1).validate("tiny")
    assert len(errors) == 2
    assert any("Hugging Face" in e for e in errors)


def test_train_grpo_packed_equals_padded(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A short grpo run of a tiny fp64 Qwen2 with ragged completions (a stop token): the
    packed learner (chunked log-probs, token-budget micro-batches) logs the metrics of the
    padded learner."""
    import rlscope.learner_packed as lp
    calls: list[int] = []

    def counting(*args: object) -> object:
        calls.append(1)
        return chunked_logp_entropy(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lp, "chunked_logp_entropy", counting)
    def run(learner: LearnerConfig, name: str) -> list[dict[str, float]]:
        cfg = TrainConfig(
            method="grpo", task="token_reversal",
            task_options=TaskConfig(seq_len=5, eval_batches=1, eval_batch_size=8),
            sampling=SamplingConfig(stop_token_ids=(2,)),
            model=ModelConfig(arch="qwen2", d_model=32, n_heads=4, n_layers=1,
                              dtype="float64", attn_implementation="sdpa"),
            learner=learner,
            run=RunConfig(num_steps=3, batch_size=16, inner_epochs=2, eval_every=0,
                          progress=False, device="cpu", doctor_every=0, name=name,
                          runs_dir=str(tmp_path), log_samples=0))
        result = train(cfg)
        assert result.status == "completed"
        return result.metrics

    padded = run(LearnerConfig(packing="off", logprob_chunk=0), "padded")
    assert not calls
    packed = run(LearnerConfig(logprob_chunk=5, token_budget=30), "packed")
    assert len(calls) > 2 * 3  # several token-budget micro-batches per pass
    assert len(padded) == len(packed) == 3
    assert any(m["length/mean"] < 5 for m in padded)  # ragged completions were trained
    for a, b in zip(padded, packed, strict=True):
        keys = {k for k in a if k.split("/")[0] in ("policy", "loss", "optim", "reward")}
        assert {"loss/total", "policy/entropy", "optim/grad_norm"} <= keys
        for k in keys:
            assert b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-12), k


def test_entropy_bonus_method_through_the_chunked_path() -> None:
    """grpo with an entropy bonus (``--entropy_coef``): the chunked path differentiates H
    like the full path, and the bonus changes the gradient (so it did flow)."""
    from rlscope.methods import MethodConfig, resolve_method

    spec = resolve_method("grpo", MethodConfig(entropy_coef=0.5))
    assert spec.uses_entropy_bonus and not spec.reads_learner_distribution
    ref = _run(_policy(), None, spec, None)
    got = _run(_policy(), None, spec, PackedLearner(True, 4))
    plain = _run(_policy(), None, resolve_method("grpo", MethodConfig()), PackedLearner(True, 4))
    _close(ref[0], got[0])
    for a, b in zip(ref[3], got[3], strict=True):
        _close(a, b)
    assert max((a - b).abs().max() for a, b in zip(got[3], plain[3], strict=True)) > 1e-4


def test_packed_learner_with_lora_adapters() -> None:
    """A PEFT (LoRA) policy: the packed forward runs the adapted decoder, and the adapters'
    gradients equal the padded learner's."""
    pytest.importorskip("peft")
    from rlscope.policy import ModelConfig as MC
    from rlscope.policy import add_lora

    policy = add_lora(_policy("llama"), MC(arch="llama", lora_rank=4))
    with torch.no_grad():  # move B off zero so the adapters change the function
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.linspace(-0.3, 0.3, p.numel(), dtype=F64).view_as(p))
    out = []
    for packed in (None, PackedLearner(True, 3)):
        loss, _, _, grads = _run(policy, None, _spec(), packed)
        names = [n for n, p in policy.named_parameters() if p.requires_grad]
        out.append((loss, grads, names))
    assert out[0][2] and all("lora_" in n for n in out[0][2])
    _close(out[0][0], out[1][0])
    for a, b in zip(out[0][1], out[1][1], strict=True):
        _close(a, b)


def test_setup_wires_the_learner_config(tmp_path: Path) -> None:
    """--activation_checkpointing turns on the HF model's checkpointing; the plan carries the
    resolved packed learner and the token budget; the tiny transformer keeps the padded one."""
    from rlscope.train import setup

    run = RunConfig(num_steps=1, batch_size=8, progress=False, device="cpu",
                    runs_dir=str(tmp_path))
    hf = setup(TrainConfig(model=ModelConfig(arch="qwen2", d_model=32, n_heads=4, n_layers=1),
                           learner=LearnerConfig(activation_checkpointing=True,
                                                 token_budget=64), run=run))
    assert hf.plan.packed == PackedLearner(True, 1024) and hf.plan.token_budget == 64
    model = hf.policy.unwrap()  # type: ignore[attr-defined]
    assert model.is_activation_checkpointing if hasattr(model, "is_activation_checkpointing") \
        else model.is_gradient_checkpointing
    tiny = setup(TrainConfig(run=run))
    assert tiny.plan.packed is None and tiny.plan.token_budget == 0


def test_prepare_packed_equals_padded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-grad forwards of `prepare` (critic values, a sequence-level correction, the
    reference's log-probs for the KL) give the padded learner's inputs and metrics."""
    import copy

    import rlscope.learner as learner
    import rlscope.learner_packed as learner_packed
    from rlscope.learner import prepare

    calls: list[object] = []

    def counting(pol: object, *args: object, **kwargs: object) -> object:
        calls.append(pol)
        return learner_packed.packed_forward(pol, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(learner, "packed_forward", counting)
    from rlscope.methods.corrections import CorrectionConfig

    policy = _policy()
    ref = copy.deepcopy(policy).requires_grad_(False).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(0.9)
    value_head = ValueHead(policy.hidden_size).to(F64)
    torch.nn.init.normal_(value_head.linear.weight, std=0.1)
    spec = dataclasses.replace(_spec(), kl=KLConfig(coef=0.1, estimator="k3", target="ref"),
                               correction=CorrectionConfig("sequence_truncate", cap=1.5))
    batch, _ = _batch_inputs()
    batch = dataclasses.replace(batch, rewards_B=torch.linspace(0, 1, B, dtype=F64))
    out = [prepare(spec, batch, policy, value_head, ref, 0.1, 1,
                   SampledDistribution(0.8, True), packed=packed)
           for packed in (None, PackedLearner(True, 4))]
    assert calls == [policy, ref]  # both forwards packed
    (a, m_a), (b, m_b) = out
    mask = a.mask_BT
    for name in ("adv_BT", "old_values_BT", "returns_BT", "ref_logp_BT", "is_weight_BT"):
        x, y = getattr(a, name), getattr(b, name)
        assert x is not None and y is not None, name
        _close(x * mask, y * mask)
    assert m_a.keys() == m_b.keys() and "policy/kl_ref_k3" in m_a
    for k in m_a:
        _close(m_a[k], m_b[k])


def test_chunked_bf16_matmul_matches_autocast_head() -> None:
    """``matmul_dtype=bf16`` (what --autocast bf16 uses) gives the log-probs and gradients of
    a bf16 head with float32 softmax, to bf16 rounding."""
    g = torch.Generator().manual_seed(4)
    h = torch.randn(9, 16, generator=g, requires_grad=True)
    W = (torch.randn(21, 16, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, 21, (9,), generator=g)
    logits = (h.bfloat16() @ W.bfloat16().T).float()
    ref = logits.log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)
    ref_g = torch.autograd.grad(ref.sum(), [h, W])
    lp, _ = chunked_logp_entropy(h, W, None, y, 1.0, 4, torch.bfloat16)
    got_g = torch.autograd.grad(lp.sum(), [h, W])
    assert lp.dtype == torch.float32
    assert torch.allclose(lp, ref, atol=1e-5)
    for a, b in zip(got_g, ref_g, strict=True):
        assert a.dtype == torch.float32
        assert torch.allclose(a, b, atol=2e-2, rtol=2e-2)
    full, _ = chunked_logp_entropy(h, W, None, y, 1.0, 4)
    assert 0 < (full - lp).abs().max() < 0.1  # bf16 rounding, not float32


def test_packed_learner_under_bf16_autocast() -> None:
    """With --autocast bf16 (float32 weights) the packed, chunked learner agrees with the
    padded one to bf16 rounding: log-probs, loss and gradients."""
    model = tiny_hf_model("qwen2", V, seed=3, hidden_size=32, num_heads=4, num_layers=2,
                          attn_implementation="sdpa")
    policy = HFPolicy(model).train()
    policy.autocast_dtype = torch.bfloat16
    batch, inputs = _batch_inputs()
    inputs = dataclasses.replace(inputs, adv_BT=inputs.adv_BT.float(),
                                 mask_BT=inputs.mask_BT.float(),
                                 logp_old_BT=inputs.logp_old_BT.float())
    den = Denominators(n_tokens=inputs.mask_BT.sum(), n_seqs=float(B), max_len=T)
    out = []
    for packed in (None, PackedLearner(True, 4)):
        policy.zero_grad(set_to_none=True)
        res = micro_batch_loss(_spec(entropy_coef=0.0), policy, None, batch, inputs, den, 0.1,
                               SampledDistribution(1.0, True), packed=packed)
        res.loss.backward()
        out.append((res.loss.detach(), res.logp_BT * inputs.mask_BT,
                    torch.cat([p.grad.flatten() for p in policy.parameters()])))
    assert abs(out[0][0] - out[1][0]) < 2e-2
    assert (out[0][1] - out[1][1]).abs().max() < 5e-2
    cos = torch.nn.functional.cosine_similarity(out[0][2], out[1][2], dim=0)
    assert cos > 0.99


def test_memory_estimate_counts_one_chunk_of_logits() -> None:
    """The pre-flight memory bound counts the learner's logits as one chunk with chunked
    log-probs (Hugging Face policies) and as the whole micro-batch without: here the learner's
    share drops below the sampler's."""
    from rlscope.checks import MemoryTerm
    from rlscope.config import step_memory, validate

    def peak(learner: LearnerConfig, arch: str = "qwen2") -> MemoryTerm:
        cfg = TrainConfig(model=ModelConfig(arch=arch), learner=learner,
                          task_options=TaskConfig(eval_batch_size=8),
                          run=RunConfig(batch_size=64, device="cpu"))
        _, task, d = validate(cfg)
        return step_memory(cfg, task, d)[1]

    full, chunked = peak(LearnerConfig(logprob_chunk=0)), peak(LearnerConfig(logprob_chunk=8))
    assert full.what.startswith("the learner") and chunked.what.startswith("the sampler")
    assert chunked.bytes < full.bytes
    assert peak(LearnerConfig(logprob_chunk=8), "tiny") == peak(LearnerConfig(logprob_chunk=0),
                                                                "tiny")


def test_no_packing_without_transformers_packed_masks(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """A transformers that cannot keep attention within packed rows gets no packing (auto:
    padded with chunked log-probs; on: a clear configuration error before the run)."""
    import rlscope.learner_packed as lp
    from rlscope.config import ConfigError
    from rlscope.train import setup

    monkeypatch.setattr(lp, "packed_positions_supported", lambda: False)
    policy = _policy()
    assert resolve_learner(LearnerConfig(), policy) == PackedLearner(False, 1024)
    with pytest.raises(ValueError, match="transformers"):
        resolve_learner(LearnerConfig(packing="on"), policy)
    cfg = TrainConfig(model=ModelConfig(arch="qwen2", d_model=32, n_heads=4, n_layers=1),
                      learner=LearnerConfig(packing="on"),
                      run=RunConfig(num_steps=1, batch_size=8, progress=False, device="cpu",
                                    runs_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="packing=on"):
        setup(cfg)
    assert not any(tmp_path.iterdir())


def test_packed_learner_with_activation_checkpointing() -> None:
    """Activation checkpointing (non-reentrant) under the packed learner: same gradients."""
    spec = _spec()
    ref = _run(_policy(), None, spec, None)
    policy = _policy()
    model = policy.unwrap()
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    got = _run(policy, None, spec, PackedLearner(True, 3))
    _close(ref[0], got[0])
    for a, b in zip(ref[3], got[3], strict=True):
        _close(a, b)


@pytest.mark.slow
def test_compiled_blocks_equal_eager_blocks() -> None:
    """`HFPolicy.compile_blocks` (``--compile_blocks``) compiles every decoder block and the
    packed learner gives the eager blocks' loss, log-probs and gradients over two packed
    layouts. To 1e-7, not float64's 1e-10: the blocks' RMSNorm computes in float32 by design
    (transformers upcasts to float32, not to the model's float64), and the fused kernels sum
    those float32 values in another order."""
    spec = _spec()
    ref = _run(_policy(), None, spec, PackedLearner(True, 3))
    compiled = _policy()
    assert compiled.compile_blocks() == 2
    got = _run(compiled, None, spec, PackedLearner(True, 3))
    for a, b in zip(ref[:3], got[:3], strict=True):
        _close(a, b, 1e-7)
    for a, b in zip(ref[3], got[3], strict=True):
        _close(a, b, 1e-7)
    again = _run(compiled, None, spec, PackedLearner(True, 5, True))  # another layout
    _close(again[0], ref[0], 1e-7)


def test_compile_blocks_is_refused_for_the_tiny_transformer() -> None:
    """The tiny transformer has no Hugging Face blocks: --compile_blocks is a config error."""
    errors = LearnerConfig(compile_blocks=True).validate("tiny")
    assert errors and "compile_blocks" in errors[0]


def test_packed_learner_honours_the_fp32_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """--fp32_head (`fp32_output_head`) reaches the packed learner, which applies the head
    weights itself: under bf16 autocast its chunked head multiplies in bf16 before the patch
    and in float32 (matmul dtype None) after it, and `head_dtype` says which."""
    import rlscope.learner_packed as lp
    from rlscope.policy.base import fp32_output_head, head_dtype

    policy = HFPolicy(tiny_hf_model("qwen2", V, seed=3, hidden_size=32, num_heads=4,
                                    num_layers=2, attn_implementation="sdpa"))
    policy.autocast_dtype = torch.bfloat16
    seen: list[torch.dtype | None] = []
    real = lp.chunked_logp_entropy

    def spy(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(args[-1])  # type: ignore[arg-type]
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lp, "chunked_logp_entropy", spy)
    batch, inputs = _batch_inputs()
    batch = dataclasses.replace(batch, logp_sampler_BT=batch.logp_sampler_BT.float())
    mask_BT = inputs.mask_BT.float()
    assert head_dtype(policy) is torch.bfloat16
    lp.packed_forward(policy, PackedLearner(True, 4), batch, inputs.tokens_BT, mask_BT,
                      batch.logp_sampler_BT, SampledDistribution(1.0, True), True)
    assert fp32_output_head(policy) and head_dtype(policy) is None
    lp.packed_forward(policy, PackedLearner(True, 4), batch, inputs.tokens_BT, mask_BT,
                      batch.logp_sampler_BT, SampledDistribution(1.0, True), True)
    assert seen == [torch.bfloat16, None]


def test_rows_without_loss_positions_are_not_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row with no loss position (row 2 of the fixture) puts no token into the packed
    forward: its packed length is 0, and every row's length is what `row_token_counts` (the
    token budget's cost) counts."""
    import rlscope.learner_packed as lp

    seen: list[list[int]] = []
    real = lp.pack_rows

    def spy(lengths: list[int], one_row: bool) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        seen.append(list(lengths))
        return real(lengths, one_row)

    monkeypatch.setattr(lp, "pack_rows", spy)
    batch, inputs = _batch_inputs()
    lp.packed_forward(_policy(), PackedLearner(True, 3), batch, inputs.tokens_BT,
                      inputs.mask_BT, batch.logp_sampler_BT, SampledDistribution(1.0, True),
                      True)
    assert seen[0][2] == 0 and all(n > 0 for i, n in enumerate(seen[0]) if i != 2)
    assert seen[0] == row_token_counts(batch, inputs.mask_BT).tolist()


def test_packed_forward_reads_the_callers_host_masks(monkeypatch: pytest.MonkeyPatch) -> None:
    """`update` hands each micro-batch its rows of one `host_masks` copy: the packed forward
    then reads no mask from the device and gives the same result as when it reads them."""
    import rlscope.learner_packed as lp

    policy = HFPolicy(tiny_hf_model("qwen2", 40, seed=0)).double()
    g = torch.Generator().manual_seed(5)
    prompts = PromptBatch.left_padded([torch.randint(3, 40, (n,), generator=g)
                                       for n in (2, 4, 3)])
    tokens_BT = torch.randint(3, 40, (3, 5), generator=g)
    mask_BT = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]],
                           dtype=torch.float64)
    batch = assemble(prompts, tokens_BT=tokens_BT, alive_BT=mask_BT.bool(),
                     logp_sampler_BT=-torch.rand(3, 5, generator=g, dtype=torch.float64),
                     logp_raw_BT=torch.zeros(3, 5, dtype=torch.float64), keep_BTV=None,
                     entropy_BT=None, finished_by_stop_B=torch.zeros(3, dtype=torch.bool),
                     group_id_B=None)
    dist = SampledDistribution(temperature=1.0, replay_keep=False)
    options = PackedLearner()
    masks_BL = lp.host_masks(batch, mask_BT)
    assert masks_BL.device.type == "cpu" and masks_BL.shape == (3, batch.prompt_len + 5)
    read = lp.packed_forward(policy, options, batch, tokens_BT, mask_BT,
                             batch.logp_sampler_BT, dist, True)
    calls: list[int] = []
    monkeypatch.setattr(lp, "host_masks", lambda *a: calls.append(1))
    given = lp.packed_forward(policy, options, batch, tokens_BT, mask_BT,
                              batch.logp_sampler_BT, dist, True, masks_BL=masks_BL)
    assert calls == [] and read is not None and given is not None
    assert torch.equal(read.logp_BT, given.logp_BT)
    assert torch.equal(read.entropy_BT, given.entropy_BT)
    with pytest.raises(ValueError, match="host_masks"):
        lp.packed_forward(policy, options, batch, tokens_BT, mask_BT, batch.logp_sampler_BT,
                          dist, True, masks_BL=masks_BL[:2])
