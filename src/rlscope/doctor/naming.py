"""Which framework a log comes from, and its metric names translated to ours while a file is read.

`guess_framework` names the framework from the metric names; `_renamer` translates each name as it
is read (never merging two series into one); `_finish` gives each canonical name to the
framework's preferred foreign name, applies sign conventions and notes duplicated steps.
"""

from __future__ import annotations

from collections.abc import Callable

from rlscope.doctor.table import MetricTable
from rlscope.doctor.translate import TRANSLATIONS, translate
from rlscope.metrics.schema import is_registered

# Name prefixes that identify a framework's metrics in a generic file.
FRAMEWORK_MARKERS = {
    "verl": ("actor/", "critic/", "timing_s/", "response_length/", "val-core/", "rollout_corr/"),
    "tinker": ("env/all/", "optim/kl_sample_train", "progress/", "time/total"),
    "trl": ("completions/", "frac_reward_zero_std", "clip_ratio/", "rewards/", "objective/",
            "policy/approxkl_avg", "ppo/loss/", "ppo/policy/", "ppo/mean_scores",
            "env/reward_mean", "tokens/responses_len"),
    "openrlhf": ("ppo_clip_ratio", "ppo_kl", "actor_lr", "actor_grad_norm", "rollout/reward_mean",
                 "timing/make_experience", "timing/ppo_train", "critic_loss"),
}


def _bare(name: str) -> str:
    """A name without the ``train/`` prefix that W&B and TensorBoard loggers add (TRL through
    transformers' callbacks, OpenRLHF's loggers)."""
    return name.removeprefix("train/")


PREFIXED = ("trl", "openrlhf")
"""Frameworks whose W&B and TensorBoard loggers prefix every training metric with ``train/``
(transformers' callbacks, OpenRLHF's ``logging_utils``)."""


def _renamer(table: MetricTable, framework: str | None) -> Callable[[str], str]:
    """Translate names of ``framework`` (recording the original name and the note).

    A canonical name is claimed by the first foreign name that maps to it; another foreign name
    mapping to the same canonical name is kept under its own name (two series are never merged
    into one) and `_finish` later gives the canonical name to the framework's preferred one.
    An untranslated name of a `PREFIXED` framework loses its logger's ``train/`` prefix (TRL's
    ``train/frac_reward_zero_std`` is read as ``frac_reward_zero_std``, the name the framework
    documents and the rules read) unless the bare name is taken.
    """
    cache: dict[str, str] = {}
    given: set[str] = set()  # cache's values: a set, so each new name is O(1), not O(names)
    table.framework = framework

    def rename(name: str) -> str:
        hit = cache.get(name)
        if hit is not None:
            return hit
        canonical, note = translate(framework, name) if framework else (name, "")
        if framework and canonical == name and name != _bare(name):
            canonical, note = translate(framework, _bare(name))
            canonical = name if canonical == _bare(name) else canonical
        if framework in PREFIXED and canonical == name and name != _bare(name) \
                and _bare(name) not in given and _bare(name) not in table.original:
            canonical = _bare(name)  # the logger's prefix, not part of the framework's name
        elif canonical == name and (name in table.original or name in given):
            # our name, already taken by a translated one (or by a prefixed one stripped)
            canonical = f"{name} (as logged)"
            taken_by = table.original.get(name) or next(k for k, v in cache.items() if v == name)
            table.import_notes.append(f"{name} kept as {canonical!r}: {name} comes from "
                                      f"{taken_by}")
        elif canonical != name:
            if canonical in table.original or canonical in cache:
                canonical = name  # taken by another foreign name, or logged as such
            else:
                table.original[canonical] = name
                if note:
                    table.notes[canonical] = note
        cache[name] = canonical
        given.add(canonical)
        return canonical

    return rename


def _finish(table: MetricTable, framework: str | None) -> None:
    """After reading: give each canonical name to the framework's preferred foreign name (the
    first in its translation table that the file has), apply sign conventions, and note
    duplicated steps (`MetricTable.series` keeps the last value logged for a step)."""
    if framework:
        translations = TRANSLATIONS[framework]
        present = {_bare(n.removesuffix(" (as logged)")): n for n in table.names()
                   if n not in table.original}
        present |= {_bare(f): c for c, f in table.original.items()}
        for canonical, claimer in list(table.original.items()):
            preferred = next(f for f, t in translations.items() if t.canonical == canonical
                             and f in present)
            if preferred == _bare(claimer):
                continue
            stored = present[preferred]  # the preferred series, still under its own name
            if table.has(canonical):  # not when the claimer logged only non-finite values
                table.move(canonical, claimer)
            table.move(stored, canonical)
            table.original[canonical] = stored.removesuffix(" (as logged)")
            table.notes[canonical] = translations[preferred].note
            table.import_notes[:] = [n for n in table.import_notes if repr(stored) not in n]
        for canonical, foreign in sorted(table.original.items()):
            t = translations[_bare(foreign)]
            if t.sign != 1.0 and table.has(canonical):
                table.scale(canonical, t.sign)
                table.import_notes.append(f"{foreign} is stored as {canonical} with its sign "
                                          "flipped (its convention is the opposite of ours)")
        shadowed = sorted(n for n in table.names() if n not in table.original.values()
                          and translate(framework, _bare(n))[0] != _bare(n))
        for name in shadowed:
            target = translate(framework, _bare(name))[0]
            table.import_notes.append(f"{name} kept under its own name: {target} comes from "
                                      f"{table.original.get(target, target)}")
    duplicated = table.duplicated_steps()
    if duplicated:
        steps = sorted({s for v in duplicated.values() for s in v})
        shown = ", ".join(f"{s:g}" for s in steps[:8]) + (", ..." if len(steps) > 8 else "")
        table.import_notes.append(
            f"{len(steps)} step(s) logged more than once ({shown}; {len(duplicated)} metric(s)): "
            "the last value logged for a step is used (a resumed or restarted run rewrites "
            "them)")


def guess_framework(names: list[str]) -> str | None:
    """The framework whose metric names these are: by characteristic prefixes, else the one
    with the most exact name matches (at least two; a ``train/`` prefix, as W&B shows TRL's
    and OpenRLHF's metrics, is ignored)."""
    bare = {_bare(n) for n in names}
    if bare and 2 * sum(map(is_registered, bare)) > len(bare):
        return None  # our own names (an rlscope run logged to TensorBoard or W&B)
    for framework, markers in FRAMEWORK_MARKERS.items():
        if any(n.startswith(markers) for n in bare):
            return framework
    counts = {fw: len(bare & set(table)) for fw, table in TRANSLATIONS.items()}
    best = max(counts, key=lambda fw: counts[fw])
    return best if counts[best] >= 2 else None

