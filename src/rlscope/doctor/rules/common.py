"""Shared by the doctor's rules: the rule output type, evidence rounding, the checks that say
why a rule cannot run (`_need`, `_need_all`, `_why`) and what a log's config records about
the run (`_facts`, `_lr`, `_sampling_cause`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlscope.doctor.findings import Finding, Unavailable
from rlscope.doctor.table import MetricTable
from rlscope.results import finite

RuleOut = list[Finding] | Unavailable

CORRECTNESS_KEYS = ("acc", "correct", "pass@", "pass_rate", "test_error", "solved", "exact")
LENGTH_SCORED_TASKS = ("length_target",)
"""Our tasks whose reward depends on the response length by construction."""


def _r(x: float) -> float:
    """Round for evidence (4 significant digits)."""
    return float(f"{x:.4g}")


def _need(t: MetricTable, names: tuple[str, ...], min_steps: int = 1) -> str | Unavailable:
    """The first of ``names`` with at least ``min_steps`` points; else why not: too few steps
    (naming the metric that is there and its count) or the metrics missing."""
    name = t.first(*names)
    if name is None:
        return Unavailable(names)
    best = max((n for n in names if t.has(n)), key=lambda n: len(t.series(n)[0]))
    if t.has(best, min_steps):
        return next(n for n in names if t.has(n, min_steps))
    return Unavailable((best,), reason="too_few_steps",
                       detail=f"{best} has {len(t.series(best)[0])} logged steps, the check "
                              f"needs {min_steps}")


def _why(t: MetricTable, names: tuple[str, ...], min_steps: int) -> Unavailable:
    """Why none of ``names`` can be used (call when the rule cannot run)."""
    out = _need(t, names, min_steps)
    return out if isinstance(out, Unavailable) else Unavailable(names)


def _need_all(t: MetricTable, names: tuple[str, ...], min_steps: int = 1
              ) -> Unavailable | None:
    """None when every one of ``names`` has ``min_steps`` points; else the missing ones only
    (never a metric that is present), or too few steps."""
    missing = tuple(n for n in names if not t.has(n))
    if missing:
        return Unavailable(missing, all_of=len(missing) > 1)
    short = [n for n in names if not t.has(n, min_steps)]
    if short:
        return Unavailable(tuple(short), reason="too_few_steps", detail=", ".join(
            f"{n} has {len(t.series(n)[0])} logged steps" for n in short)
            + f"; the check needs {min_steps}")
    return None


def _lr(t: MetricTable) -> float | None:
    """The learning rate the log records (its median), or None."""
    if t.has("optim/lr"):
        return float(np.median(t.values("optim/lr")))
    lr = _section(t.config, "config", "optim").get("lr")
    return float(lr) if isinstance(lr, (int, float)) else None


def _section(config: Any, *keys: str) -> dict[str, Any]:
    """``config[keys[0]][keys[1]]...``; {} where a level is missing or not an object (a foreign
    log's config, or a hand-edited config.json, may hold anything under our keys)."""
    for key in keys:
        config = config.get(key) if isinstance(config, dict) else None
    return config if isinstance(config, dict) else {}


def _facts(t: MetricTable) -> dict[str, Any]:
    """What the log's config says about the run (empty for most foreign logs); a setting of
    the wrong type counts as not recorded."""
    cfg = _section(t.config, "config")
    run, sampling = _section(cfg, "run"), _section(cfg, "sampling")
    replay = _section(cfg, "replay")
    facts: dict[str, Any] = {}
    if run:
        facts["delay"] = run.get("delay", 0)
        facts["replay"] = (finite(replay.get("replay_capacity", 0)) or 0) > 0
        facts["on_policy"] = facts["delay"] == 0 and not facts["replay"]
        facts["grad_clip"] = finite(_section(cfg, "optim").get("grad_clip"))
    if sampling:
        facts["sampling"] = {k: sampling.get(k) for k in
                             ("temperature", "top_k", "top_p", "replay_sampling_mask")}
        facts["fixed_length"] = not sampling.get("stop_token_ids")
    task = cfg.get("task")
    if isinstance(task, str):
        facts["task"] = task
        facts["length_scored"] = task in LENGTH_SCORED_TASKS
    kl = _section(t.config, "method_spec", "kl")
    if kl:
        facts["kl_control"] = kl.get("control")
        facts["kl_target_value"] = finite(kl.get("target_value"))
    return facts


def _sampling_cause(facts: dict[str, Any]) -> str | None:
    """The recorded sampling config that makes the behaviour policy differ from the learner's
    distribution, or None when it records none (or nothing is recorded)."""
    s = facts.get("sampling")
    if not s:
        return None
    filtered = (finite(s.get("top_k")) or 0) > 0 or (finite(s.get("top_p")) or 1.0) < 1.0
    if filtered and not s.get("replay_sampling_mask", True):
        return (f"sampling filtered the distribution (top_k={s.get('top_k')}, "
                f"top_p={s.get('top_p')}) and the learner does not replay the kept set "
                "(replay_sampling_mask=False), so logprobs are not of the sampling "
                "distribution")
    return None
