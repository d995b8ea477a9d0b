"""Name translators: every canonical name is ours, mappings round-trip, unknown names pass."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from doctor_fixtures import FIXTURES, generator

from rlscope.doctor.formats import STEP_KEYS
from rlscope.doctor.importers import load
from rlscope.doctor.naming import _bare
from rlscope.doctor.translate import (
    TRANSLATIONS,
    Translation,
    is_seconds,
    name_list,
    to_foreign,
    translate,
)
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


# --- name coverage as data (src/rlscope/doctor/names/*.toml) ---------------------------------

FRAMEWORKS = sorted(TRANSLATIONS)
VOCAB = {"population": {"tokens", "sequences", "groups", "steps", "prompts"},
         "reduction": {"token_mean", "seq_mean", "max", "min", "std", "sum", "value", "frac"},
         "timing": {"rollout", "first_pass", "last_pass", "update", "eval", "step"}}


@pytest.mark.parametrize(("framework", "name"), PAIRS)
def test_every_entry_says_population_reduction_sign_and_timing(framework: str,
                                                               name: str) -> None:
    r = TRANSLATIONS[framework][name].resolved()
    for field, allowed in VOCAB.items():
        assert r[field] in allowed, (field, r[field])
    assert r["sign"] in (1.0, -1.0)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_documented_name_is_translated_or_ignored_with_a_reason(framework: str) -> None:
    """The committed list of names the framework logs (read from its source, per file) has no
    name that is neither translated nor deliberately kept with a reason, and no stale ignore."""
    names = name_list(framework)
    assert names.framework == framework and re.fullmatch(r"[0-9a-f]{40}", names.commit)
    assert all(names.sources.values()) and len(names.names()) >= 30
    uncovered = [n for n in names.names()
                 if n not in TRANSLATIONS[framework] and not names.ignore_reason(n)]
    assert uncovered == [], f"{framework}: translate or ignore (with a reason) {uncovered}"
    both = [n for n in names.ignored if n in TRANSLATIONS[framework]]
    assert both == [], f"{framework}: translated names listed as ignored: {both}"
    stale = [n for n in names.ignored if n not in names.names()]
    assert stale == [], f"{framework}: ignored names that are not documented: {stale}"
    assert all(len(r) > 10 for r in [*names.ignored.values(), *names.ignored_patterns.values()])


def test_name_list_requires_a_known_framework() -> None:
    with pytest.raises(ValueError, match="no name list"):
        name_list("deepspeed_chat")


def test_wandb_bookkeeping_columns_are_step_keys_or_ignored() -> None:
    names = name_list("wandb")
    assert {"_step", "Step", "train/global_step"} <= set(names.names())
    assert all(n in STEP_KEYS or names.ignore_reason(n) for n in names.names())


@pytest.mark.parametrize(("framework", "foreign", "canonical"), [
    ("verl", "actor/ppo_kl", "policy/kl_behaviour_k1"),
    ("verl", "rollout_corr/kl", "policy/kl_behaviour_k1_first"),
    ("trl", "ppo/policy/policykl", "policy/kl_behaviour_k1"),
    ("tinker", "optim/kl_sample_train_v1", "policy/kl_behaviour_k1_first"),
    ("openrlhf", "ppo_kl", "policy/kl_behaviour_k1"),
    ("openrlhf", "vllm_kl", "policy/kl_behaviour_k1_first"),
])
def test_opposite_sign_conventions_are_recorded(framework: str, foreign: str,
                                                canonical: str) -> None:
    t = TRANSLATIONS[framework][foreign]
    assert (t.canonical, t.sign) == (canonical, -1.0)
    assert "sign flipped" in t.note


@pytest.mark.parametrize(("name", "seconds"), [
    ("timing_s/gen", True), ("timing_s/update_actor", True), ("time/step", True),
    ("timing_s/agent_loop/tool_calls/max", True), ("time/trajectory_group_worker:total", True),
    ("timing_s/agent_loop/slowest/response_length", False),
    ("timing_s/agent_loop/slowest/prompt_length", False),
    ("timing_s/agent_loop/num_preempted/mean", False),
    ("time/trajectory_group_worker:count", False), ("timing_s/", False),
])
def test_is_seconds(name: str, seconds: bool) -> None:
    assert is_seconds(name) is seconds


NAME_GEN = generator("make_name_fixtures")


@pytest.mark.parametrize("fixture", sorted(NAME_GEN.WRITERS))
def test_each_translator_on_a_log_holding_every_name_it_documents(fixture: str) -> None:
    """Every documented name of the framework, in the format its users have (verl console log,
    TRL W&B history export, cookbook metrics.jsonl, OpenRLHF W&B chart export): each translated
    name lands on its canonical name with its exact values (sign applied) unless the
    framework's preferred name for that quantity is in the same file, in which case it is kept
    under its own name and the import notes say so; every other name is kept as the
    framework documents it (without W&B's ``train/`` prefix, which the rules do not read)."""
    framework = NAME_GEN.FRAMEWORK[fixture]
    prefix = NAME_GEN.PREFIX[framework]
    (table,) = load(FIXTURES / fixture).tables
    assert table.framework == framework and table.problems == []
    notes = "\n".join(table.import_notes)
    documented = NAME_GEN.names(framework)
    claimed = {_bare(f): c for c, f in table.original.items()}
    for i, name in enumerate(documented, 1):
        expected = [NAME_GEN.value(i, s) for s in NAME_GEN.STEPS]
        t = TRANSLATIONS[framework].get(name)
        if t is None or (t.canonical == name and name not in table.original):
            # untranslated, or a name that is already ours: kept under the framework's own
            # name, without the logger's train/ prefix
            stored = name
        elif claimed.get(name) == t.canonical:
            stored = t.canonical
            expected = [t.sign * v for v in expected]
            preferred = next(f for f, u in TRANSLATIONS[framework].items()
                             if u.canonical == t.canonical and f in documented)
            assert preferred == name  # the framework's preferred name wins
            if t.sign != 1.0:
                assert f"{prefix}{name} is stored as {t.canonical} with its sign flipped" in notes
        else:
            assert f"{prefix}{name} kept" in notes
            stored = next(n for n in (prefix + name, f"{prefix}{name} (as logged)")
                          if table.has(n))
        steps, values = table.series(stored)
        assert steps.tolist() == list(map(float, NAME_GEN.STEPS)), name
        assert values.tolist() == pytest.approx(expected, rel=1e-12), name
    assert len(table.original) >= 10
