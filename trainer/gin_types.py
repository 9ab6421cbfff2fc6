"""Every value a gin configuration binds must have the type of the parameter it feeds.

gin passes any value to any parameter: `--gin.TRAIN_STEPS="'ten'"` reached the trainer and failed
deep inside it with a TypeError, and `--gin.TRAIN_STEPS=10.5` trained 10 steps. Once the
configuration is parsed, `check_bound_types` follows each parameter's binding through its macros
to the value and checks it against the parameter's annotation, where the annotation is made of
plain types only (`CHECKS`: int, float, bool, str and None, alone or in a union). Other
annotations (mappings, sequences, configs, paths) and values computed by a configurable
(`@recipes.finetune_steps()`) are left to the library's own checks. A value of the wrong type is a
`ConfigError` naming the macro or binding, where it was set (the flag or the file line), the value
and what the parameter allows.
"""

from __future__ import annotations

import inspect
import numbers
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin

from trainer import validation
from trainer.gin_checks import TextScan

# Plain type -> (whether a value is one, how a message names it). bool is not an int here, and
# an int is a float (gin reads `1` as an int).
CHECKS: dict[type, tuple[Callable[[Any], bool], str]] = {
    int: (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    bool: (lambda v: isinstance(v, bool), "True or False"),
    str: (lambda v: isinstance(v, str), "a quoted string"),
    type(None): (lambda v: v is None, "None"),
}
_MACRO = "gin.macro"  # the selector gin files a macro's value under
_UNIONS = (typing.Union, types.UnionType)
# The configuration gin locked last (`_remember`): {(scope, selector): {parameter: value}}.
_LOCKED: list[Mapping] = []


@gin.config.register_finalize_hook
def _remember(config):
    """Keeps the configuration `gin.finalize` locks, for `check_bound_types` (adds nothing)."""
    _LOCKED[:] = [config]


def plain_types(annotation: Any) -> tuple[type, ...] | None:
    """The plain types (`CHECKS`) an annotation allows, or None when it is not made of them
    only (the value is then not checked here)."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS else ()
    members = tuple(type(None) if m is None else m for m in members or (annotation,))
    return members if all(m in CHECKS for m in members) else None


def _annotations(selector: str) -> tuple[str, dict[str, Any]]:
    """The qualified name of configurable `selector` and its parameters' annotations ({} when
    they do not resolve: nothing is checked then)."""
    try:
        target = inspect.unwrap(gin.get_configurable(selector))
    except (KeyError, ValueError):
        return selector, {}
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', selector)}"
    try:
        return name, typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - an annotation naming what is not importable here
        return name, {}


def _resolved(value: Any, config: Mapping) -> tuple[str | None, Any] | None:
    """(the last macro `value` goes through, the value it ends at) when that is a literal;
    None when a configurable computes it (`@f()`, `%gin.REQUIRED`)."""
    macro = None
    for _ in range(len(config) + 1):  # a chain of macros, never a cycle
        if not isinstance(value, gin.config.ConfigurableReference):
            return macro, value
        scope, selector = value.config_key
        if selector != _MACRO or not value.evaluate or value.config_key not in config:
            return None
        macro, value = scope, config[value.config_key].get("value")
    return None


def _where(name: str, pairs: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """`name` as it was last written and where, from the scans' `(name, place)` pairs; a binding
    written with a shorter selector (`checkpoints.CheckpointConfig.period` for
    `trainer.checkpoints.CheckpointConfig.period`) counts."""
    found = [(n, p) for n, p in pairs if n == name or name.endswith(f".{n}")]
    return found[-1] if found else (name, "in the configuration")


def check_bound_types(scans: Sequence[TextScan]) -> None:
    """Checks every value bound to a parameter with a plain-typed annotation (see the module
    docstring), after `gin.finalize`.

    Args:
      scans: every text the job parsed (where each macro and binding was set, for messages).

    Raises:
      trainer.validation.ConfigError: one line per value of the wrong type (each macro once),
        naming the macro or binding, where it was set, the value, the parameter and what it
        allows.
    """
    config = _LOCKED[0] if _LOCKED else {}
    defined = [pair for scan in scans for pair in scan.defined]
    bound = [pair for scan in scans for pair in scan.bound]
    problems: dict[str, str] = {}
    for (scope, selector), params in list(config.items()):
        if selector == _MACRO:
            continue
        target, annotations = _annotations(selector)
        for param, value in params.items():
            allowed = plain_types(annotations.get(param, Any))
            found = None if allowed is None else _resolved(value, config)
            if found is None or any(CHECKS[t][0](found[1]) for t in allowed):
                continue
            macro, value = found
            if macro is not None:
                what = f"gin macro {macro} = {value!r} (set {_where(macro, defined)[1]})"
            else:
                key = f"{scope}/{selector}.{param}" if scope else f"{selector}.{param}"
                key, where = _where(key, bound)
                what = f"gin binding {key} = {value!r} (set {where})"
            problems.setdefault(
                macro or what,
                f"{what} does not fit parameter {param} of {target}; allowed: "
                + " or ".join(CHECKS[t][1] for t in allowed),
            )
    if problems:
        raise validation.ConfigError("\n".join(problems.values()))
