"""Names that become one directory below a parent (a run, a sweep): checked so that nothing is
written outside that parent. No torch import, so the sweep manifest and the CLI can use it."""

from __future__ import annotations

import os


def check_name_component(value: str, field: str) -> str | None:
    """Why ``value`` cannot be one path component below a parent directory (``None`` when it
    can): it must be non-empty, hold no ``/`` (nor ``\\`` or the platform's separators), no NUL
    and no control character, and be neither ``.`` nor ``..``, so ``parent / value`` stays
    inside ``parent``. ``field`` names the option in the message (e.g. ``--name``)."""
    if not value:
        return f"{field}: empty name; give a plain directory name such as my_run"
    separators = {"/", "\\", os.sep, *([os.altsep] if os.altsep else [])}
    problem = None
    if "\0" in value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        problem = "holds a NUL or control character"
    elif any(s in value for s in separators):
        problem = "holds a path separator"
    elif value in (".", ".."):
        problem = "is a relative directory reference"
    elif value != value.strip():
        problem = "starts or ends with whitespace"
    if problem is None:
        return None
    return (f"{field} {value!r} {problem}: give a single directory name (letters, digits, "
            "'_', '-', '.'), which is created inside the parent directory")
