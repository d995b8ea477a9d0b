"""OPD from a built-in teacher (COMPANIONS.md §1): the teachers' distributions, the exact and
top-k reverse KL with their gradients, the supports with ties, the warm-up switch, the
``teacher_logratio`` advantage, the evaluation diagnostics, every rejection, and short runs.

Every expected number is computed by hand in the test (the arithmetic is written out)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlscope.config import ConfigError, ReplayConfig, RunConfig, TrainConfig, validate
from rlscope.methods import MethodConfig
from rlscope.methods.advantages import AdvantageInputs, teacher_logratio
from rlscope.methods.configs import AdvantageConfig, ObjectiveConfig
from rlscope.methods.opd import (
    opd_diagnostics,
    opd_reverse_kl,
    opd_topk_reverse_kl,
    support_mask_BTV,
    topk_mask_BTV,
)
from rlscope.methods.teacher import TeacherConfig, oracle_logp_BTV, soft_logp_BTV
from rlscope.methods.terms import PolicyTerms
from rlscope.tasks import TaskConfig
from rlscope.train import train

SMALL = TaskConfig(vocab=4, seq_len=3)


def _terms(student_BTV: torch.Tensor, teacher_BTV: torch.Tensor,
           step: int | None = None) -> PolicyTerms:
    B, T, _ = student_BTV.shape
    zeros_BT = torch.zeros(B, T)
    return PolicyTerms(logp_BT=zeros_BT, logp_old_BT=zeros_BT, weight_BT=zeros_BT,
                       mask_BT=torch.ones(B, T), logp_BTV=student_BTV,
                       teacher_logp_BTV=teacher_BTV,
                       step=None if step is None else torch.tensor(step))


def _log(p: list[float]) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64).log()[None, None]


# ----------------------------------------------------------------------------- teachers


def test_oracle_teacher_puts_one_minus_epsilon_on_the_target() -> None:
    # A = 5, ε = 1e-3, y = 2: π_T = (ε/4, ε/4, 1 − ε, ε/4, ε/4) = (2.5e-4, 2.5e-4, 0.999, ...)
    p = oracle_logp_BTV(torch.tensor([[2]]), 5, 1e-3).exp()[0, 0]
    assert torch.allclose(p, torch.tensor([2.5e-4, 2.5e-4, 0.999, 2.5e-4, 2.5e-4]), atol=1e-7)


def test_soft_teacher_weights_on_a_small_example() -> None:
    # V = 4 content ids, A = 5 (SEP = 4), y = 1, T = 1, special weight 0.02. Cyclic distances
    # d(a, 1) = (1, 0, 1, 2); tie factors 1 + 1e-3·(V − 1 − a)/V = (1.00075, 1.0005, 1.00025, 1).
    w = [math.exp(-1) * 1.00075, 1.0005, math.exp(-1) * 1.00025, math.exp(-2) * 1.0, 0.02]
    expected = torch.tensor([x / sum(w) for x in w])
    p = soft_logp_BTV(torch.tensor([[1]]), 5, 4, 1.0, 0.02).exp()[0, 0]
    assert torch.allclose(p, expected.float(), atol=1e-6)
    # the tie factor breaks the distance-1 tie (a = 0 and a = 2) toward the lower id
    assert p[0] > p[2]
    # T = 0.5 sharpens: w = (e^-2·1.00075, 1.0005, e^-2·1.00025, e^-4, 0.02)
    w = [math.exp(-2) * 1.00075, 1.0005, math.exp(-2) * 1.00025, math.exp(-4), 0.02]
    p = soft_logp_BTV(torch.tensor([[1]]), 5, 4, 0.5, 0.02).exp()[0, 0]
    assert torch.allclose(p, torch.tensor([x / sum(w) for x in w]).float(), atol=1e-6)


# ------------------------------------------------------------------- full reverse KL


def test_full_vocabulary_reverse_kl_equals_the_brute_force_sum_and_its_gradient() -> None:
    # π = (0.5, 0.25, 0.25), π_T = (0.7, 0.15, 0.15):
    # KL = 0.5·ln(0.5/0.7) + 2·0.25·ln(0.25/0.15) = −0.168236 + 0.255413 = 0.087177
    pi, pt = [0.5, 0.25, 0.25], [0.7, 0.15, 0.15]
    kl = sum(a * math.log(a / b) for a, b in zip(pi, pt, strict=True))
    assert kl == pytest.approx(0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.25 / 0.15))
    logits = torch.tensor(pi, dtype=torch.float64).log().requires_grad_(True)
    loss_BT, stats = opd_reverse_kl(_terms(logits.log_softmax(-1)[None, None], _log(pt)),
                                    ObjectiveConfig("opd_reverse_kl"))
    assert loss_BT.item() == pytest.approx(kl, abs=1e-12)
    assert stats["opd/reverse_kl"].item() == pytest.approx(kl, abs=1e-12)
    # ∂KL/∂z_j = π_j (ln π_j − ln π_T,j − KL): j = 0: 0.5·(ln(0.5/0.7) − KL), j = 1, 2: 0.25·(...)
    loss_BT.sum().backward()
    expected = [p * (math.log(p / q) - kl) for p, q in zip(pi, pt, strict=True)]
    assert logits.grad is not None
    assert torch.allclose(logits.grad, torch.tensor(expected, dtype=torch.float64), atol=1e-12)


# ------------------------------------------------------------------------ top-k supports


def test_topk_support_sets_break_ties_toward_the_lower_id() -> None:
    # student (0.4, 0.2, 0.2, 0.2), k = 2: 0, then the tie 1/2/3 goes to 1 → {0, 1}
    # teacher (0.1, 0.3, 0.3, 0.3), k = 2: the tie 1/2/3 → {1, 2}; intersection {1}
    s, t = _log([0.4, 0.2, 0.2, 0.2]), _log([0.1, 0.3, 0.3, 0.3])
    assert topk_mask_BTV(s, 2)[0, 0].tolist() == [1, 1, 0, 0]
    assert support_mask_BTV(s, t, 2, "student")[0, 0].tolist() == [1, 1, 0, 0]
    assert support_mask_BTV(s, t, 2, "teacher")[0, 0].tolist() == [0, 1, 1, 0]
    assert support_mask_BTV(s, t, 2, "intersection")[0, 0].tolist() == [0, 1, 0, 0]
    # disjoint top-1s: the intersection is empty and its loss 0
    assert support_mask_BTV(s, t, 1, "intersection").sum() == 0


@pytest.mark.parametrize(("support", "ids"), [("student", (0, 1)), ("teacher", (1, 2)),
                                               ("intersection", (1,))])
def test_topk_reverse_kl_is_the_unrenormalised_sum_over_the_support(support: str,
                                                                   ids: tuple[int, ...]) -> None:
    pi, pt = [0.4, 0.2, 0.2, 0.2], [0.1, 0.3, 0.3, 0.3]
    # Σ_{a∈S} π(a) ln(π(a)/π_T(a)); terms: a=0: 0.4 ln 4 = 0.554518, a=1,2: 0.2 ln(2/3) = −0.081093
    expected = sum(pi[a] * math.log(pi[a] / pt[a]) for a in ids)
    logits = _log(pi).requires_grad_(True)
    cfg = ObjectiveConfig("opd_topk_reverse_kl", opd_top_k=2, opd_support=support)
    loss_BT, stats = opd_topk_reverse_kl(_terms(logits.log_softmax(-1), _log(pt)), cfg)
    assert loss_BT.item() == pytest.approx(expected, abs=1e-12)
    assert stats["opd/student_topk_mass"].item() == pytest.approx(sum(pi[a] for a in ids))
    assert stats["opd/teacher_topk_mass"].item() == pytest.approx(sum(pt[a] for a in ids))
    assert stats["opd/topk_support_size"].item() == len(ids)
    assert stats["opd/top1_agreement"].item() == 0.0  # argmax π = 0, argmax π_T = 1 (tie → 1)
    # gradient of Σ_S π_a (ln π_a − ln π_T,a) w.r.t. logit z_j:
    # Σ_{a∈S} π_a (δ_aj − π_j)(ln(π_a/π_T,a) + 1)
    loss_BT.sum().backward()
    c = {a: math.log(pi[a] / pt[a]) + 1 for a in ids}
    grad = [sum(pi[a] * ((a == j) - pi[j]) * c[a] for a in ids) for j in range(4)]
    assert logits.grad is not None
    assert torch.allclose(logits.grad[0, 0], torch.tensor(grad, dtype=torch.float64),
                          atol=1e-12)


@pytest.mark.parametrize("support", ["student", "teacher", "intersection"])
def test_topk_with_k_equal_to_the_vocabulary_is_the_full_reverse_kl(support: str) -> None:
    g = torch.Generator().manual_seed(0)
    student = torch.randn(3, 4, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    teacher_BTV = soft_logp_BTV(torch.randint(0, 5, (3, 4), generator=g), 6, 5, 0.7,
                                0.02).double()
    full_BT, _ = opd_reverse_kl(_terms(student.log_softmax(-1), teacher_BTV),
                                ObjectiveConfig("opd_reverse_kl"))
    (g_full,) = torch.autograd.grad(full_BT.sum(), student)
    topk_BT, stats = opd_topk_reverse_kl(
        _terms(student.log_softmax(-1), teacher_BTV),
        ObjectiveConfig("opd_topk_reverse_kl", opd_top_k=6, opd_support=support))
    (g_topk,) = torch.autograd.grad(topk_BT.sum(), student)
    assert torch.allclose(topk_BT, full_BT, atol=1e-12)
    assert torch.allclose(g_topk, g_full, atol=1e-12)
    assert torch.all(stats["opd/topk_support_size"] == 6)


def test_the_warmup_switch_uses_the_full_loss_before_step_w() -> None:
    pi, pt = [0.4, 0.2, 0.2, 0.2], [0.1, 0.3, 0.3, 0.3]
    full = sum(a * math.log(a / b) for a, b in zip(pi, pt, strict=True))
    topk = 0.4 * math.log(4) + 0.2 * math.log(2 / 3)  # student top-2 = {0, 1}
    cfg = ObjectiveConfig("opd_topk_reverse_kl", opd_top_k=2, opd_warmup_steps=3)
    for step, expected in ((0, full), (2, full), (3, topk), (10, topk)):
        loss_BT, _ = opd_topk_reverse_kl(_terms(_log(pi), _log(pt), step), cfg)
        assert loss_BT.item() == pytest.approx(expected, abs=1e-12), step


# ----------------------------------------------------------------------------- opd_pg


def test_teacher_logratio_advantage_is_the_detached_sampled_log_ratio() -> None:
    # A_t = log π_T(a_t) − ℓ_μ,t, masked: (ln 0.7 − ln 0.5, ln 0.1 − ln 0.2, 0 on the pad)
    teacher_BT = torch.tensor([[0.7, 0.1, 0.3]]).log()
    behaviour_BT = torch.tensor([[0.5, 0.2, 0.9]]).log()
    x = AdvantageInputs(rewards_B=torch.zeros(1), mask_BT=torch.tensor([[1.0, 1.0, 0.0]]),
                        group_size=1, teacher_logp_BT=teacher_BT,
                        behaviour_logp_BT=behaviour_BT)
    adv_BT = teacher_logratio(x, AdvantageConfig("teacher_logratio"))
    expected = torch.tensor([[math.log(0.7 / 0.5), math.log(0.1 / 0.2), 0.0]])
    assert torch.allclose(adv_BT, expected, atol=1e-6)


# ------------------------------------------------------------------------- diagnostics


def test_opd_diagnostics_on_one_position() -> None:
    pi, pt = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    s, t = _log(pi), _log(pt)
    out = opd_diagnostics(s, t, torch.tensor([[1]]), torch.ones(1, 1), overlap_k=2,
                          support_k=1, support="student")
    rkl = 0.5 * math.log(0.5 / 0.2) + 0.2 * math.log(0.2 / 0.5)  # the 0.3 terms are 0
    h_s = -sum(p * math.log(p) for p in pi)
    assert out["eval/opd_reverse_kl"].item() == pytest.approx(rkl)
    assert out["eval/opd_forward_kl"].item() == pytest.approx(rkl)  # symmetric here: −(−rkl)
    assert out["eval/opd_sampled_reverse_kl"].item() == pytest.approx(0.0)  # ln(0.3/0.3)
    assert out["eval/student_entropy"].item() == pytest.approx(h_s)
    assert out["eval/entropy_gap"].item() == pytest.approx(0.0)  # a permutation: same entropy
    assert out["eval/top1_agreement"].item() == 0.0
    assert out["eval/overlap_at_k"].item() == pytest.approx(0.5)  # {0, 1} ∩ {2, 1} = {1}
    assert out["eval/student_topk_mass"].item() == pytest.approx(0.5)  # S = {0}
    assert out["eval/teacher_topk_mass"].item() == pytest.approx(0.2)
    assert out["eval/topk_support_size"].item() == 1.0


# ------------------------------------------------------------------------- validation


def _cfg(tmp: Path, method: str = "opd_topk_reverse_kl", task: str = "token_reversal",
         teacher: TeacherConfig | None = None, components: MethodConfig | None = None,
         task_options: TaskConfig = SMALL, **run: Any) -> TrainConfig:
    run = {"batch_size": 8, "num_steps": 4, "eval_every": 2, "runs_dir": str(tmp),
           "progress": False, "device": "cpu", **run}
    return TrainConfig(method=method, task=task, task_options=task_options,
                       components=components or MethodConfig(),
                       teacher_options=teacher or TeacherConfig(), run=RunConfig(**run))


MC, TC = MethodConfig, TeacherConfig
REJECTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "top_k_zero": ({"components": MC(opd_top_k=0)}, r"opd_top_k=0 must be >= 1"),
    "top_k_above_A": ({"components": MC(opd_top_k=6)},
                      r"opd_top_k=6 must lie in \[1, 5\]"),
    "support": ({"components": MC(opd_support="both")}, r"opd_support='both' is unknown"),
    "overlap_k": ({"teacher": TC(overlap_k=6)}, r"overlap_k=6 must lie in \[1, 5\]"),
    "epsilon_0": ({"teacher": TC(teacher_epsilon=0.0)},
                  r"teacher_epsilon=0.0 must lie in \(0, 1\)"),
    "epsilon_1": ({"teacher": TC(teacher_epsilon=1.0)}, r"teacher_epsilon=1.0 must lie"),
    "temperature": ({"teacher": TC(teacher_temperature=0.0)},
                    r"teacher_temperature=0.0 must be > 0"),
    "special": ({"teacher": TC(special_token_weight=-1.0)},
                r"special_token_weight=-1.0 must be > 0"),
    "unknown_teacher": ({"teacher": TC(teacher="gold")}, r"teacher.teacher='gold' is unknown"),
    "soft_off_reversal": ({"teacher": TC(teacher="soft"), "task": "format_answer",
                           "task_options": TaskConfig()},
                          r"teacher='soft' is defined on token_reversal"),
    "warmup_ge_steps": ({"components": MC(opd_warmup_steps=4)},
                        r"opd_warmup_steps=4 must be below run.num_steps=4"),
    "warmup_negative": ({"components": MC(opd_warmup_steps=-1)},
                        r"opd_warmup_steps=-1 must be >= 0"),
    "warmup_wrong_preset": ({"method": "opd_reverse_kl", "components": MC(opd_warmup_steps=1)},
                            r"needs --method opd_topk_reverse_kl"),
    "teacher_path": ({"teacher": TC(teacher_path="x")}, r"drop --teacher_path"),
    "clip": ({"method": "opd_pg", "components": MC(clip_low=0.0)},
             r"clip_low=0.0 .* must be > 0"),
    "no_targets": ({"method": "opd_reverse_kl", "task": "digits_bandit",
                    "task_options": TaskConfig()},
                   r"method 'opd_reverse_kl' trains on the task's per-token labels"),
    "delay": ({"delay": 1}, r"is defined on-policy"),
    "replay": ({"method": "opd_pg", "replay_capacity": 4}, r"is defined on-policy"),
    "noise": ({"task_options": dataclasses.replace(SMALL, reward_noise=0.1)},
              r"needs clean rewards"),
    "opd_flag_on_grpo": ({"method": "grpo", "teacher": TC(teacher="soft")},
                         r"--teacher: set, but method 'grpo' reads no built-in teacher"),
    "topk_flags_on_grpo": ({"method": "grpo", "components": MC(opd_top_k=3, opd_support="teacher")},
                           r"--opd_top_k, --opd_support: set, but method 'grpo' reads no"),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_each_opd_rejection_says_what_to_change(tmp_path: Path, case: str) -> None:
    kw, message = REJECTIONS[case]
    kw = dict(kw)
    if "replay_capacity" in kw:
        cfg = _cfg(tmp_path, **{k: v for k, v in kw.items() if k != "replay_capacity"})
        cfg = dataclasses.replace(cfg, replay=ReplayConfig(replay_capacity=kw["replay_capacity"]))
    else:
        cfg = _cfg(tmp_path, **kw)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_valid_opd_configurations_pass(tmp_path: Path) -> None:
    validate(_cfg(tmp_path, components=MethodConfig(opd_top_k=5, opd_support="intersection",
                                                    opd_warmup_steps=3),
                  teacher=TeacherConfig(teacher="soft", overlap_k=5)))
    validate(_cfg(tmp_path, method="OPDPG", task="format_answer", task_options=TaskConfig()))


# ------------------------------------------------------------------------------- runs


@pytest.mark.parametrize(("method", "teacher", "components"), [
    ("opd_reverse_kl", TeacherConfig(), None),
    ("opd_topk_reverse_kl", TeacherConfig(teacher="soft", teacher_temperature=0.5),
     MethodConfig(opd_support="teacher")),
    ("opd_pg", TeacherConfig(), None),
])
def test_every_opd_preset_runs_with_finite_metrics(tmp_path: Path, method: str,
                                                   teacher: TeacherConfig,
                                                   components: MethodConfig | None) -> None:
    result = train(_cfg(tmp_path, method, teacher=teacher, components=components))
    assert result.status == "completed" and len(result.metrics) == 4
    for row in result.metrics + result.evals:
        bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
        assert not bad, (method, bad)
    assert [e["step"] for e in result.evals] == [0, 2, 4]
    assert 0 <= result.evals[-1]["eval/overlap_at_k"] <= 1
    assert result.evals[-1]["eval/opd_reverse_kl"] >= 0


def test_the_warmup_switch_adds_a_switch_row_at_step_w(tmp_path: Path) -> None:
    result = train(_cfg(tmp_path, components=MethodConfig(opd_warmup_steps=3),
                        output=str(tmp_path / "rows.csv"), micro_batch_size=4))
    evals = [json.loads(line) for line in (result.run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(e["step"], e.get("phase")) for e in evals] == [(0, None), (2, None), (3, "switch"),
                                                             (4, None)]
    assert "phase" in (tmp_path / "rows.csv").read_text().splitlines()[0]
    # W on an evaluation step: the same row, tagged
    result = train(_cfg(tmp_path, components=MethodConfig(opd_warmup_steps=2), name="w2"))
    assert [(e["step"], e.get("phase")) for e in result.evals] == [(0, None), (2, "switch"),
                                                                    (4, None)]


# --------------------------------------------------------------------------- manifests

OPD_MANIFESTS = {"opd_compare": 2, "opd_topk_stability": 5, "opd_topk_cold_start": 7,
                 "opd_topk_warmup": 13, "opd_soft_teacher": 26}
"""Ids of each builtin OPD manifest: baselines + grid points (COMPANIONS.md §1, Experiments)."""


@pytest.mark.parametrize("name", sorted(OPD_MANIFESTS))
def test_builtin_opd_manifests_validate(capsys: pytest.CaptureFixture[str], name: str) -> None:
    from rlscope.cli import main

    assert main(["sweep", "--builtin", name, "--dry_run"]) == 0
    out = capsys.readouterr().out
    ids = OPD_MANIFESTS[name]
    assert out.startswith(f"sweep {name}: {ids * 3} runs ({ids} ids × 3 seeds)")
    assert "--method opd_reverse_kl" in out  # every OPD experiment has the exact baseline
    if name != "opd_compare":
        assert "--vocab 8 --seq_len 8" in out or ("--vocab 8" in out and "--seq_len 8" in out)
        assert "--overlap_k 4" in out


@pytest.mark.slow
def test_an_opd_warmup_manifest_smoke_run_writes_its_csv_and_switch_table(tmp_path: Path
                                                                           ) -> None:
    """opd_topk_cold_start shrunk to 2 steps, one seed, k = 2, W in {0, 1} (3 runs, each a
    process of its own: ~20 s): every run completes, the results CSV holds every id, and
    switch.md has the W = 1 row only."""
    from importlib.resources import files

    from rlscope.cli import main

    text = (files("rlscope.sweep") / "builtin" / "opd_topk_cold_start.toml").read_text()
    text = (text.replace("seeds = [0, 1, 2]", "seeds = [0]")
            .replace("num_steps = 300", "num_steps = 2")
            .replace("eval_every = 20", "eval_every = 1")
            .replace("batch_size = 64", "batch_size = 8")
            .replace("opd_top_k = [1, 2, 4], opd_warmup_steps = [0, 100]",
                     "opd_top_k = [2], opd_warmup_steps = [0, 1]"))
    manifest = tmp_path / "smoke.toml"
    manifest.write_text(text)
    out_dir = tmp_path / "sweep"
    assert main(["sweep", str(manifest), "--output", str(out_dir)]) == 0
    results = (out_dir / "results.csv").read_text()
    for run_id in ("opd_reverse_kl_s0", "topk-opd_top_k=2-opd_warmup_steps=0_s0",
                   "topk-opd_top_k=2-opd_warmup_steps=1_s0"):
        assert run_id in results
    switch = (out_dir / "switch.md").read_text()
    assert "| topk-opd_top_k=2-opd_warmup_steps=1 | 1 | 1 ± nan |" in switch
    assert "opd_warmup_steps=0" not in switch


def _smoke_manifest(name: str) -> str:
    """Builtin manifest ``name`` shrunk to a smoke run: one seed, 2 steps, evaluation every
    step, batch 8, every warm-up grid W ∈ {0, 1}."""
    import re
    from importlib.resources import files

    text = (files("rlscope.sweep") / "builtin" / f"{name}.toml").read_text()
    text = text.replace("seeds = [0, 1, 2]", "seeds = [0]")
    text = re.sub(r"num_steps = \d+", "num_steps = 2", text)
    text = re.sub(r"eval_every = \d+", "eval_every = 1", text)
    text = text.replace("batch_size = 64", "batch_size = 8")
    return re.sub(r"opd_warmup_steps = \[[0-9, ]+\]", "opd_warmup_steps = [0, 1]", text)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPD_MANIFESTS))
def test_every_opd_manifest_smoke_run_writes_its_csv(tmp_path: Path, name: str) -> None:
    """Each OPD manifest at 2 steps (`_smoke_manifest`; one process per run, up to ~2 min):
    every run completes and results.csv names every id; switch.md exists exactly where the
    manifest has a warm-up grid."""
    from rlscope.cli import main
    from rlscope.sweep.manifest import parse_manifest

    text = _smoke_manifest(name)
    (tmp_path / "smoke.toml").write_text(text)
    out_dir = tmp_path / "sweep"
    ids = {r.id for r in parse_manifest(text, output=out_dir).runs}
    assert main(["sweep", str(tmp_path / "smoke.toml"), "--output", str(out_dir)]) == 0
    results = (out_dir / "results.csv").read_text()
    assert all(f"{run_id}_s0" in results for run_id in ids)
    assert (out_dir / "switch.md").exists() == ("opd_warmup_steps = [0, 1]" in text)


def test_switch_markdown_is_mean_and_sd_of_the_switch_rows(tmp_path: Path) -> None:
    """Two seeds of one id with switch rows (test_error 0.5 and 0.3 at the switch, 0.2 and
    0.2 at the end) and one id without: mean 0.4 ± sd 0.1414 (√((0.1² + 0.1²)/1)), final −
    switch = (−0.3, −0.1) → −0.2 ± 0.1414; the id without a switch row is absent."""
    from rlscope.sweep.aggregate import switch_markdown

    def run(name: str, rows: list[dict[str, Any]]) -> None:
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "eval.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))

    run("warm_s0", [{"step": 0, "eval/test_error": 0.9},
                    {"step": 5, "phase": "switch", "eval/test_error": 0.5},
                    {"step": 10, "eval/test_error": 0.2}])
    run("warm_s1", [{"step": 5, "phase": "switch", "eval/test_error": 0.3},
                    {"step": 10, "eval/test_error": 0.2}])
    run("cold_s0", [{"step": 10, "eval/test_error": 0.1}])
    table = switch_markdown(tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| warm |"))
    assert row.startswith("| warm | 2 | 5 ± 0 | 0.4 ± 0.1414 |")
    assert row.endswith("| -0.2 ± 0.1414 |")
    assert "cold" not in table
    assert switch_markdown(tmp_path / "runs" / "cold_s0") == ""


# ------------------------------------------------------------------------------ probe


def test_loglog_slope_of_a_power_law_is_its_exponent() -> None:
    from rlscope.probes.opd_variance import loglog_slope, variance

    # Var = 3·H² at H = 2, 4, 8: log Var = log 3 + 2 log H → slope 2
    assert loglog_slope([2, 4, 8], [12.0, 48.0, 192.0]) == pytest.approx(2.0)
    # population variance of (1, 2, 3, 6): mean 3, ((−2)² + (−1)² + 0 + 3²)/4 = 3.5
    assert variance([1.0, 2.0, 3.0, 6.0]) == pytest.approx(3.5)


def test_opd_variance_probe_writes_its_csv_and_summary(tmp_path: Path) -> None:
    from rlscope.cli import main

    out = tmp_path / "probe"
    assert main(["probe", "opd_variance", "--horizons", "2", "4", "--num_batches", "3",
                 "--batch_size", "4", "--num_seeds", "2", "--out_dir", str(out)]) == 0
    rows = (out / "opd_variance.csv").read_text().splitlines()
    assert rows[0].startswith("seed,horizon,estimator,variance")
    assert len(rows) == 1 + 2 * 2 * 3  # seeds × horizons × estimators
    variances = [float(r.split(",")[3]) for r in rows[1:]]
    assert all(v >= 0 and math.isfinite(v) for v in variances)
    assert any(v > 0 for v in variances)
    summary = (out / "summary.md").read_text()
    for name in ("sequence_pg", "token_pg", "full_vocab_rkl"):
        assert f"| {name} |" in summary
    assert main(["probe", "opd_variance", "--num_batches", "1", "--out_dir", str(out)]) == 2
    assert main(["probe", "nope"]) == 2


def test_the_opd_diagnostics_leave_the_training_stream_untouched(tmp_path: Path) -> None:
    """The same run with and without evaluations (each drawing a fresh diagnostic batch from
    the evaluation stream) trains on the same batches: equal losses at every step."""
    def losses(eval_every: int, name: str) -> list[float]:
        result = train(_cfg(tmp_path, "opd_reverse_kl", eval_every=eval_every, name=name))
        return [row["loss/policy"] for row in result.metrics]

    assert losses(1, "with") == losses(0, "without")


# ------------------------------------------------------------------ std ribbons ([sweep] band)


def test_curves_carry_the_sample_sd_and_the_std_band_uses_it(tmp_path: Path) -> None:
    """Two seeds logging 1 and 3 at step 0: mean 2, sd √((1 + 1)/1) = 1.4142, SEM sd/√2 = 1;
    the std ribbon is ±1.4142, the default ±1."""
    pytest.importorskip("matplotlib")
    from rlscope.report.build import sweep_band
    from rlscope.report.figures import Style, _band_S, plot_metric
    from rlscope.results import TidyRow, curves

    rows = [TidyRow(f"a_s{s}", "a", "m", s, "eval", 0, "eval/x", v)
            for s, v in ((0, 1.0), (1, 3.0))]
    c = curves(rows, "eval/x")["a"]
    assert c.mean_S[0] == pytest.approx(2.0)
    assert c.sd_S is not None and c.sd_S[0] == pytest.approx(math.sqrt(2.0))
    assert c.sem_S[0] == pytest.approx(1.0)
    assert _band_S(c, "std")[0] == pytest.approx(math.sqrt(2.0))
    assert _band_S(c, "sem")[0] == pytest.approx(1.0)
    fig = plot_metric("eval/x", {"a": c}, {"a": Style("C0", "-")}, band="std")
    assert fig.axes[0].get_title() == "eval/x: mean ± SD across seeds"
    (tmp_path / "manifest.toml").write_text('[sweep]\nname = "s"\nband = "std"\n')
    assert sweep_band(tmp_path) == "std"
    assert sweep_band(tmp_path / "nowhere") == "sem"


def test_a_manifest_band_other_than_sem_or_std_is_rejected(tmp_path: Path) -> None:
    from rlscope.sweep.manifest import ManifestError, load_manifest

    path = tmp_path / "m.toml"
    path.write_text('[sweep]\nname = "s"\nband = "iqr"\n\n[runs.a]\nmethod = "grpo"\n')
    with pytest.raises(ManifestError, match=r"band = 'iqr': use \"sem\""):
        load_manifest(path)
