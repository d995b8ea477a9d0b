"""Name translators: every canonical name is ours, mappings round-trip, unknown names pass."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlscope.doctor.translate import TRANSLATIONS, Translation, to_foreign, translate
from rlscope.metrics.schema import metric_def

PAIRS = [(fw, name) for fw, table in TRANSLATIONS.items() for name in table]


def test_frameworks() -> None:
    assert set(TRANSLATIONS) == {"verl", "trl", "tinker", "openrlhf"}


@pytest.mark.parametrize(("framework", "name"), PAIRS)
def test_every_canonical_is_in_the_schema(framework: str, name: str) -> None:
    canonical = TRANSLATIONS[framework][name].canonical
    assert metric_def(canonical).name == canonical  # metric_def raises for unknown names


@pytest.mark.parametrize(("framework", "name"), PAIRS)
def test_round_trip_through_to_foreign(framework: str, name: str) -> None:
    canonical, _ = translate(framework, name)
    familiar = to_foreign(framework, canonical)
    assert familiar is not None
    assert translate(framework, familiar)[0] == canonical
    names_for_canonical = [n for n, t in TRANSLATIONS[framework].items()
                           if t.canonical == canonical]
    assert familiar == names_for_canonical[0]
    if len(names_for_canonical) == 1:
        assert familiar == name


@pytest.mark.parametrize("framework", sorted(TRANSLATIONS))
def test_unknown_names_pass_through(framework: str) -> None:
    for name in ("made/up_metric", "val-core/openai/gsm8k/acc/mean@8", "", "step"):
        assert translate(framework, name) == (name, "")
    assert to_foreign(framework, "replay/age_hist_0") is None


def test_unknown_framework_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown framework"):
        translate("deepspeed_chat", "policy_loss")
    with pytest.raises(ValueError, match="unknown framework"):
        to_foreign("deepspeed_chat", "loss/policy")


@pytest.mark.parametrize(("framework", "foreign", "canonical"), [
    ("verl", "actor/entropy", "policy/entropy"),
    ("verl", "actor/pg_loss", "loss/policy"),
    ("verl", "actor/pg_clipfrac", "policy/clipfrac_region"),
    ("verl", "actor/pg_clipfrac_lower", "policy/clipfrac_dual"),
    ("verl", "response_length/clip_ratio", "length/clip_ratio"),
    ("verl", "critic/score/mean", "reward/mean"),
    ("verl", "timing_s/gen", "time/sample"),
    ("trl", "grad_norm", "optim/grad_norm"),
    ("trl", "entropy", "policy/entropy"),
    ("trl", "kl", "policy/kl_ref_k3"),
    ("trl", "reward_std", "adv/group_std_mean"),
    ("trl", "completions/clipped_ratio", "length/clip_ratio"),
    ("trl", "policy/approxkl_avg", "policy/approx_kl"),
    ("trl", "objective/kl", "policy/kl_ref_seq_k1"),
    ("tinker", "env/all/reward/total", "reward/mean"),
    ("tinker", "optim/entropy", "policy/entropy_sampled"),
    ("tinker", "optim/kl_sample_train_v2", "policy/kl_behaviour_k2_first"),
    ("tinker", "time/total", "time/step"),
])
def test_specific_mappings(framework: str, foreign: str, canonical: str) -> None:
    assert translate(framework, foreign)[0] == canonical


def test_notes_state_the_differences() -> None:
    assert "summed" in translate("verl", "actor/pg_loss")[1]
    assert "padded response width" in translate("verl", "response_length/clip_ratio")[1]
    assert "pre-clip" in translate("trl", "grad_norm")[1]
    assert "token mean" in translate("trl", "entropy")[1]
    assert "dual-clip" in translate("verl", "actor/pg_clipfrac_lower")[1]


@pytest.mark.parametrize(("framework", "name"), [
    ("verl", "training/rollout_probs_diff_mean"),  # |p − p'| in probability space
    ("verl", "perf/max_memory_allocated_gb"),    # GB, ours is MB
    ("trl", "frac_reward_zero_std"),             # 1 − group/mixed_rate
    ("trl", "objective/entropy"),                # sequence sum, ours is a token mean
])
def test_not_equivalent_names_stay_unmapped(framework: str, name: str) -> None:
    assert translate(framework, name) == (name, "")


def test_translation_is_frozen() -> None:
    t = Translation("reward/mean")
    assert t.note == ""
    with pytest.raises(AttributeError):
        t.canonical = "reward/std"  # type: ignore[misc]


def test_doctor_translate_does_not_import_torch() -> None:
    code = ("import sys, rlscope.doctor.translate; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
