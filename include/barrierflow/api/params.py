"""Typed pipeline parameters, set from the CLI (and later the Airflow form)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from barrierflow.core.errors import ParameterError

__all__ = ["Param", "REQUIRED", "parse_assignments", "placeholder", "resolve_params", "with_placeholders"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True)
class Param:
    """A declared pipeline parameter: name, type and default (or REQUIRED)."""

    name: str
    type: type
    default: Any = REQUIRED
    description: str = ""
    minimum: float | None = None
    choices: tuple[Any, ...] = ()  # when given, the only values allowed

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise ParameterError(f"parameter {self.name}: type must be one of str, int, float, bool")
        if self.choices and not self.required and self.default not in self.choices:
            raise ParameterError(f"parameter {self.name}: default {self.default!r} is not one of its choices")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def json_type(self) -> str:
        return _TYPES[self.type]

    def coerce(self, value: Any) -> Any:
        """Convert a CLI string (or a typed value) into this parameter's type."""
        try:
            if self.type is bool:
                out: Any = value if isinstance(value, bool) else _BOOLS[str(value).lower()]
            elif self.type is int and isinstance(value, (float, bool)):
                raise ValueError(value)
            else:
                out = self.type(value)
        except (KeyError, TypeError, ValueError):
            raise ParameterError(f"parameter {self.name!r} expects {self.json_type}, got {value!r}") from None
        if self.type is float and out != out:
            raise ParameterError(f"parameter {self.name!r} must be a number, got NaN")
        if self.minimum is not None and not out >= self.minimum:
            raise ParameterError(f"parameter {self.name!r} must be >= {self.minimum}, got {out!r}")
        if self.choices and out not in self.choices:
            raise ParameterError(
                f"parameter {self.name!r} must be one of {', '.join(repr(c) for c in self.choices)}, got {out!r}"
            )
        return out


def resolve_params(declared: tuple[Param, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``given`` against ``declared``: unknown names and missing required ones fail."""
    known = {p.name: p for p in declared}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ParameterError(f"unknown parameter(s) {', '.join(unknown)}; this pipeline accepts: {', '.join(known) or 'none'}")
    out: dict[str, Any] = {}
    for param in declared:
        if param.name in given:
            out[param.name] = param.coerce(given[param.name])
        elif param.required:
            raise ParameterError(
                f"missing required parameter {param.name!r} ({param.description or param.json_type}); "
                f"pass --param {param.name}=VALUE"
            )
        else:
            out[param.name] = param.default
    return out


def placeholder(param: Param) -> Any:
    """A stand-in value for a required parameter when a pipeline is only *built* (declared, never run: no input read)."""
    if param.type is str:
        return f"<{param.name}>"
    if param.type is bool:
        return False
    floor = param.minimum if param.minimum is not None else 0
    return math.ceil(floor) if param.type is int else float(floor)


def with_placeholders(declared: tuple[Param, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` plus a :func:`placeholder` for each required parameter it lacks (to build, not run, a pipeline)."""
    return {
        **{p.name: placeholder(p) for p in declared if p.required and given.get(p.name) is None},
        **{k: v for k, v in given.items() if v is not None},
    }


def parse_assignments(pairs: Sequence[str]) -> dict[str, str]:
    """``["name=value", ...]`` (as given on a command line) to a dict of strings."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ParameterError(f"--param expects NAME=VALUE, got {pair!r}")
        out[name.strip()] = value
    return out
