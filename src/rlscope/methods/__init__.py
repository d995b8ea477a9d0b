"""Update rules as data: the literal preset registry `METHODS` and component overrides.

A preset is a `MethodSpec` (one component per axis), held in `rlscope.methods.presets`.
``resolve_method(name, MethodConfig)`` looks a preset up (case-insensitive; CamelCase aliases
such as ``DrGRPO`` work) and applies command-line overrides (``--method grpo --advantage
group_center`` is the Dr. GRPO ablation); ``validate_method`` rejects configurations outside a
method's valid regime (both in `rlscope.methods.resolve`). Each component is a record next to
its function (`rlscope.methods.component.Component`) that says what it reads and needs.
"""

from __future__ import annotations

from rlscope.methods.presets import METHODS, canonical_method_name
from rlscope.methods.resolve import MethodConfig, resolve_method, validate_method
from rlscope.methods.spec import MethodSpec

__all__ = [
    "METHODS",
    "MethodConfig",
    "MethodSpec",
    "canonical_method_name",
    "resolve_method",
    "validate_method",
]
