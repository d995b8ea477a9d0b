"""The component records: every setting reachable from a flag, no name tests in the loop.

Each registry entry is a `rlscope.methods.component.Component` that lists the config fields its
function reads; `rlscope.methods.resolve.FLAGS` maps each flag to the one setting it overrides.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rlscope.cli import _tyro_parse
from rlscope.config import RunConfig, TrainConfig, validate
from rlscope.methods import METHODS, MethodConfig, resolve_method, validate_method
from rlscope.methods.advantages import ADVANTAGES
from rlscope.methods.aggregation import AGGREGATIONS
from rlscope.methods.component import Component
from rlscope.methods.corrections import CORRECTIONS
from rlscope.methods.gates import GATES
from rlscope.methods.objectives import OBJECTIVES
from rlscope.methods.regularizers import KL_ESTIMATORS
from rlscope.methods.resolve import FLAGS, INTERNAL, SET_ELSEWHERE
from rlscope.methods.selection import OVERLONG, SELECTIONS
from rlscope.methods.spec import MethodSpec
from rlscope.replay import ReplayConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "rlscope"

# registry, and the MethodSpec attribute holding its config ("" = the spec's own fields)
REGISTRIES: dict[str, tuple[dict[str, Component[Any, Any]], str]] = {
    "advantage": (ADVANTAGES, "advantage"),
    "gate": (GATES, "gate"),
    "objective": (OBJECTIVES, "objective"),
    "correction": (CORRECTIONS, "correction"),
    "selection": (SELECTIONS, ""),
    "overlong": (OVERLONG, "overlong"),
}
AXES = ("advantage", "gate", "objective", "kl", "entropy", "value", "overlong", "correction")
PRESET_ONLY = {"description", "source", "regime", "grouped", "requires", "step", "two_view"}
"""`MethodSpec` fields that are what a preset *is* (text, declared needs), not settings."""
REACHABLE = set(FLAGS.values()) | set(SET_ELSEWHERE) | INTERNAL


def _path(axis: str, field: str) -> str:
    return f"{axis}.{field}" if axis else field


def _get(spec: MethodSpec, path: str) -> object:
    value: object = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_every_component_setting_has_a_flag_or_is_marked_internal() -> None:
    for registry_name, (registry, axis) in REGISTRIES.items():
        config = getattr(METHODS["grpo"], axis) if axis else METHODS["grpo"]
        for name, component in registry.items():
            for field in component.settings:
                assert hasattr(config, field), f"{registry_name} {name!r} reads {field!r}, " \
                    "which its config does not have"
                assert _path(axis, field) in REACHABLE, \
                    f"{registry_name} {name!r}: setting {field!r} has no flag"


def test_every_config_field_has_a_flag_or_is_marked_internal() -> None:
    spec = METHODS["grpo"]
    paths = {_path(axis, f.name) for axis in AXES
             for f in dataclasses.fields(getattr(spec, axis))}
    paths |= {f.name for f in dataclasses.fields(MethodSpec)
              if f.name not in PRESET_ONLY and f.name not in AXES}
    assert paths - REACHABLE == set()
    assert REACHABLE - paths == set(), "a flag maps to a setting that does not exist"
    assert len(set(FLAGS.values())) == len(FLAGS), "two flags set one setting"
    assert {f.name for f in dataclasses.fields(MethodConfig)} == set(FLAGS)


def _other(registry_or_value: object, current: object) -> object:
    """A value of the same type as ``current`` that differs from it."""
    if isinstance(current, bool):
        return not current
    if isinstance(current, int):
        return current + 1
    if isinstance(current, float):
        return current + 0.25
    assert isinstance(current, str)
    names = [n for n in (registry_or_value or ()) if n != current]  # type: ignore[attr-defined]
    return names[0] if names else current + "_x"


def _choices(path: str) -> object:
    """The valid names of a setting that names a component (None for other settings)."""
    if path == "agg":
        return AGGREGATIONS
    if path == "selection":
        return SELECTIONS
    axis, _, field = path.rpartition(".")
    if field == "name":
        return next(registry for registry, a in REGISTRIES.values() if a == axis)
    return None


def test_every_flag_parses_and_changes_the_resolved_spec() -> None:
    """One `rlscope train` command line setting every method flag to a value unlike the
    preset's: each reaches exactly its setting."""
    preset = METHODS["grpo"]
    wanted = {flag: _other(_choices(path), _get(preset, path)) for flag, path in FLAGS.items()}
    args = ["--method", "grpo"]
    for flag, value in wanted.items():
        args += [f"--{flag}", str(value)]
    cfg = _tyro_parse(TrainConfig, args, "rlscope train")
    assert isinstance(cfg, TrainConfig)
    spec = resolve_method(cfg.method, cfg.components)
    for flag, path in FLAGS.items():
        assert _get(spec, path) == wanted[flag] != _get(preset, path), flag


def test_settings_set_elsewhere_reach_the_spec() -> None:
    assert SET_ELSEWHERE == {"gate.gate_age_decay": "replay_age_decay"}
    cfg = _tyro_parse(TrainConfig, ["--method", "fresh_dg", "--delay", "1",
                                    "--replay_age_decay", "0.3"], "rlscope train")
    assert isinstance(cfg, TrainConfig) and cfg.replay.replay_age_decay == 0.3
    spec, _, _ = validate(TrainConfig(method="fresh_dg", run=RunConfig(delay=1),
                                      replay=ReplayConfig(replay_age_decay=0.3)))
    assert spec.gate.gate_age_decay == 0.3


@pytest.mark.parametrize(("flag", "value"), [("sapo_tau_pos", 0.0), ("sapo_tau_neg", -1.0),
                                             ("pmd_tau", 0.0)])
def test_new_flags_are_validated(flag: str, value: float) -> None:
    spec = resolve_method("sapo", MethodConfig(**{flag: value}))
    assert any(flag in e and "> 0" in e for e in validate_method(spec, 8, 16))


def _string_constants(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


@pytest.mark.parametrize("module", ["train.py", "learner.py", "learner_graphs.py"])
def test_the_loop_never_names_a_preset_or_component(module: str) -> None:
    """What a method needs is declared on its records; the loop reads the records."""
    names = set(METHODS) | set(AGGREGATIONS) | set(KL_ESTIMATORS)
    for registry, _ in REGISTRIES.values():
        names |= set(registry)
    assert _string_constants(SRC / module) & names == set()


def test_needs_come_from_the_records() -> None:
    """A spot check that the spec's needs are the records' (not a second list of names)."""
    assert [n for n, s in METHODS.items() if s.needs_value] == ["ppo", "vapo"]
    assert {n for n, s in METHODS.items() if s.needs_candidates} == {"tpo_token", "grpo_token"}
    assert {n for n, s in METHODS.items() if s.needs_labels} == {"ce"}
    assert {n for n, s in METHODS.items() if s.needs_behaviour_sum_p2} == {"kondo"}
    assert {n for n, s in METHODS.items() if s.needs_greedy_baseline} == {"remax"}
    assert {n for n, c in SELECTIONS.items() if c.drops_groups} == {"mixed_groups"}
    assert {n for n, s in METHODS.items() if s.needs_token_labels} == {"self_distill_dg",
                                                                        "scope_lite"}
    assert {n for n, s in METHODS.items() if s.needs_whole_groups} == {"tpo", "tpo_no_anchor",
                                                                        "group_pg"}
    assert {n for n, s in METHODS.items()
            if s.objective_component.own_credit} == {"ce", "pmd_mean", "tpo", "tpo_no_anchor",
                                                     "group_pg", "tpo_full_action",
                                                     "tpo_token", "grpo_token"}
    unknown = dataclasses.replace(METHODS["grpo"], advantage=dataclasses.replace(
        METHODS["grpo"].advantage, name="nope"))
    assert not unknown.needs_value
    assert any("method.advantage='nope' is unknown" in e
               for e in validate_method(unknown, 8, 16))
