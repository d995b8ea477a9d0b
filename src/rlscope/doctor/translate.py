"""Placeholder: foreign metric names → canonical ones (replaced by the full translators)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Translation:
    canonical: str
    note: str = ""


TRANSLATIONS: dict[str, dict[str, Translation]] = {"verl": {}, "trl": {}, "tinker": {}}


def translate(framework: str, name: str) -> tuple[str, str]:
    t = TRANSLATIONS.get(framework, {}).get(name)
    return (t.canonical, t.note) if t else (name, "")


def to_foreign(framework: str, canonical: str) -> str | None:
    for foreign, t in TRANSLATIONS.get(framework, {}).items():
        if t.canonical == canonical:
            return foreign
    return None
