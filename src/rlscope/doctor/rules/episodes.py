"""Multi-turn rules (issue 20): environment tokens inside the loss mask, episodes running out
of their budget (turns, tokens per turn, tokens per episode), environments dominating the step.

They read the ``episode/`` and ``env/`` metrics of an interactive task's run
(`rlscope.sampling.episodes`). A run that logs none of them is single-turn: the rules do not
apply and report nothing (an empty table still says what they need).
"""

from __future__ import annotations

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.common import RuleOut, _need_all, _r
from rlscope.doctor.stats import aligned, window_size
from rlscope.doctor.table import MetricTable

EPISODE_PREFIX = "episode/"
BUDGETS = ("episode/truncated_frac/max_turns", "episode/truncated_frac/max_turn_tokens",
           "episode/truncated_frac/max_episode_tokens")
"""The truncated fractions, one per budget (`rlscope.envs.TRUNCATION_REASONS`)."""


def _single_turn(t: MetricTable) -> bool:
    """The log has metrics, none of them an episode's: the multi-turn rules do not apply."""
    names = t.names()
    return bool(names) and not any(n.startswith(EPISODE_PREFIX) for n in names)


def env_tokens_in_loss(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """``episode/env_tokens_in_loss`` above env_tokens_in_loss (0: none) at any step: the
    learner's loss mask covers tokens the environment wrote, so the policy is trained to
    predict (and is credited or blamed for) the environment's answers. Critical: the gradient
    is wrong at every such step. Reports the first step and the largest fraction."""
    if _single_turn(t):
        return []
    name = "episode/env_tokens_in_loss"
    if not t.has(name):
        return Unavailable((name,))
    steps, frac = t.series(name)
    bad = frac > c.env_tokens_in_loss
    if not bad.any():
        return []
    first = float(steps[np.argmax(bad)])
    return [Finding(
        "env_tokens_in_loss", "critical",
        f"environment tokens are inside the loss mask ({frac.max():.0%} of them at worst, "
        f"from step {first:g})",
        {"metric": name, "max": _r(float(frac.max())), "first_step": first,
         "frac_steps": _r(float(bad.mean()))},
        "The loss trains the policy on the log-probabilities of tokens it did not choose: the "
        "environment's observations get advantages and gradients as if the policy had written "
        "them, which teaches it to imitate the environment and biases every update.",
        ("mask the environment's tokens out of the loss (the completion mask must be 1 on "
         "policy tokens only)",), 0.95, step=first)]


def turn_budget_exhaustion(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Episodes cut by a budget (``episode/truncated_frac/<reason>`` summed over max_turns,
    max_turn_tokens and max_episode_tokens) above turn_budget_frac in the last window: the
    policy runs out of turns (or tokens) before the environment ends the episode, so those
    episodes score as unfinished whatever they were about to do. Names the budget that cuts
    most and its option."""
    if _single_turn(t):
        return []
    present = [n for n in BUDGETS if t.has(n)]
    if not present:
        return Unavailable(BUDGETS)
    steps, total = t.series(present[0])
    for name in present[1:]:
        steps, total, other = aligned((steps, total), t.series(name))
        total = total + other
    w = window_size(len(total))
    last = float(total[-w:].mean())
    if last <= c.turn_budget_frac:
        return []
    by_reason = {n.rsplit("/", 1)[1]: _r(float(t.values(n)[-w:].mean())) for n in present}
    worst = max(by_reason, key=lambda k: by_reason[k])
    evidence = {"last_window_mean": _r(last), "by_reason": by_reason, "budget": worst,
                "first_window_mean": _r(float(total[:w].mean()))}
    if t.has("episode/turns"):
        turns = t.values("episode/turns")
        evidence["turns_last_window"] = _r(float(turns[-window_size(len(turns)):].mean()))
    return [Finding(
        "turn_budget_exhaustion", "warning",
        f"{last:.0%} of episodes are cut by their budget before the environment ends them "
        f"(mostly {worst})", evidence,
        "An episode cut by a budget gets the return of an unfinished one: if the policy needs "
        "more turns than it is allowed, most groups hold only failures and the advantages carry "
        "little signal; if it dawdles, nothing teaches it to finish sooner.",
        (f"raise --{worst}",
         "reward finishing in fewer turns (a per-turn cost or --turn_discount below 1)"),
        0.7, step=float(steps[-w]))]


def env_time_dominates(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The environments' seconds (``env/time``) above env_time_share of the step
    (``time/step``) in the median step: the run waits on the environments, not on the model."""
    if _single_turn(t):
        return []
    missing = _need_all(t, ("env/time", "time/step"))
    if missing is not None:
        return missing
    _, env_s, step_s = aligned(t.series("env/time"), t.series("time/step"))
    share = env_s / np.maximum(step_s, 1e-12)
    median = float(np.median(share))
    if median <= c.env_time_share:
        return []
    return [Finding(
        "env_time_dominates", "warning",
        f"the environments take {median:.0%} of the step (median over {len(share)} steps)",
        {"median_share": _r(median), "max_share": _r(float(share.max())),
         "env_seconds_median": _r(float(np.median(env_s)))},
        "Environments step synchronously between decoding positions, so their time adds to "
        "every step: a slow environment (a sandbox, a remote tool) starves the GPU.",
        ("make the environment faster (cache, smaller sandbox limits)",
         "run slow environments in worker processes so they overlap with decoding"),
        0.7)]
