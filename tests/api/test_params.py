"""barrierflow.api.params: typed parameters and their resolution."""

from __future__ import annotations

import pytest

from barrierflow.api.params import REQUIRED, Param, resolve_params
from barrierflow.core.errors import BarrierflowError, ParameterError


@pytest.mark.parametrize(
    ("ptype", "given", "expected"),
    [
        (str, "abc", "abc"),
        (str, 5, "5"),
        (int, "42", 42),
        (int, "-3", -3),
        (int, 7, 7),
        (float, "1.5", 1.5),
        (float, "2", 2.0),
        (float, 3, 3.0),
        (bool, True, True),
        (bool, False, False),
        (bool, "true", True),
        (bool, "TRUE", True),
        (bool, "1", True),
        (bool, "yes", True),
        (bool, "On", True),
        (bool, "false", False),
        (bool, "0", False),
        (bool, "No", False),
        (bool, "off", False),
        (bool, 1, True),
        (bool, 0, False),
    ],
)
def test_coerce_converts_to_the_declared_type(ptype: type, given: object, expected: object) -> None:
    out = Param("p", ptype).coerce(given)
    assert out == expected
    assert type(out) is ptype


@pytest.mark.parametrize(
    ("ptype", "given", "json_type"),
    [
        (int, "4.2", "integer"),
        (int, "abc", "integer"),
        (int, "", "integer"),
        (int, 4.0, "integer"),  # a float is never silently truncated
        (int, None, "integer"),
        (float, "fast", "number"),
        (float, None, "number"),
        (bool, "maybe", "boolean"),
        (bool, "", "boolean"),
        (bool, 2, "boolean"),
    ],
)
def test_coerce_rejects_wrong_values_naming_the_parameter(ptype: type, given: object, json_type: str) -> None:
    with pytest.raises(ParameterError) as info:
        Param("batch_size", ptype).coerce(given)
    message = str(info.value)
    assert "'batch_size'" in message
    assert json_type in message
    assert repr(given) in message


def test_parameter_error_is_a_barrierflow_error() -> None:
    assert issubclass(ParameterError, BarrierflowError)


def test_minimum_is_inclusive() -> None:
    param = Param("parallelism", int, 2, minimum=1)
    assert param.coerce("1") == 1
    assert param.coerce(1000) == 1000


@pytest.mark.parametrize("given", ["0", -5, "-1"])
def test_minimum_rejects_smaller_values(given: object) -> None:
    with pytest.raises(ParameterError, match=r"'parallelism' must be >= 1"):
        Param("parallelism", int, 2, minimum=1).coerce(given)


def test_minimum_applies_to_floats() -> None:
    param = Param("ratio", float, minimum=0.5)
    assert param.coerce("0.5") == 0.5
    with pytest.raises(ParameterError, match="'ratio' must be >= 0.5"):
        param.coerce("0.49")


def test_choices_allow_only_their_values() -> None:
    param = Param("late_files", str, "next_epoch", choices=("next_epoch", "refuse"))
    assert param.coerce("refuse") == "refuse"
    with pytest.raises(ParameterError, match="'late_files' must be one of 'next_epoch', 'refuse', got 'skip'"):
        param.coerce("skip")
    with pytest.raises(ParameterError, match="default 'skip' is not one of its choices"):
        Param("late_files", str, "skip", choices=("next_epoch",))


def test_unsupported_type_is_refused_at_declaration() -> None:
    with pytest.raises(ParameterError, match="parameter things: type must be one of"):
        Param("things", list)


def test_required_and_json_type() -> None:
    assert Param("a", str).required
    assert Param("a", str).default is REQUIRED
    assert not Param("a", str, "x").required
    assert not Param("a", int, None).required  # None is a real default, not "required"
    assert [Param("a", t).json_type for t in (str, int, float, bool)] == ["string", "integer", "number", "boolean"]


# -- resolve_params ---------------------------------------------------------

DECLARED = (
    Param("landing_dir", str, description="directory where files land"),
    Param("max_files", int, 10, minimum=1),
    Param("ratio", float, 0.5),
    Param("verbose", bool, False),
)


def test_resolve_fills_defaults_and_coerces_given_values() -> None:
    out = resolve_params(DECLARED, {"landing_dir": "/data", "max_files": "3", "verbose": "yes"})
    assert out == {"landing_dir": "/data", "max_files": 3, "ratio": 0.5, "verbose": True}


def test_resolve_returns_every_declared_parameter_in_declaration_order() -> None:
    out = resolve_params(DECLARED, {"landing_dir": "/d"})
    assert list(out) == ["landing_dir", "max_files", "ratio", "verbose"]


def test_resolve_rejects_unknown_parameters_listing_them_and_the_accepted_ones() -> None:
    with pytest.raises(ParameterError) as info:
        resolve_params(DECLARED, {"landing_dir": "/d", "zeta": "1", "alpha": "2"})
    message = str(info.value)
    assert "unknown parameter(s) alpha, zeta" in message
    assert "accepts: landing_dir, max_files, ratio, verbose" in message


def test_resolve_unknown_parameter_when_none_is_accepted() -> None:
    with pytest.raises(ParameterError, match="unknown parameter.*foo.*accepts: none"):
        resolve_params((), {"foo": "1"})


def test_resolve_missing_required_parameter_says_how_to_pass_it() -> None:
    with pytest.raises(ParameterError) as info:
        resolve_params(DECLARED, {"max_files": "2"})
    message = str(info.value)
    assert "missing required parameter 'landing_dir'" in message
    assert "directory where files land" in message
    assert "--param landing_dir=VALUE" in message


def test_resolve_missing_required_without_description_mentions_the_type() -> None:
    with pytest.raises(ParameterError, match=r"'count' \(integer\)"):
        resolve_params((Param("count", int),), {})


def test_resolve_propagates_coercion_errors_with_the_name() -> None:
    with pytest.raises(ParameterError, match="'max_files' must be >= 1"):
        resolve_params(DECLARED, {"landing_dir": "/d", "max_files": "0"})
    with pytest.raises(ParameterError, match="'ratio' expects number"):
        resolve_params(DECLARED, {"landing_dir": "/d", "ratio": "half"})


def test_resolve_does_not_mutate_the_given_mapping() -> None:
    given = {"landing_dir": "/d", "max_files": "4"}
    resolve_params(DECLARED, given)
    assert given == {"landing_dir": "/d", "max_files": "4"}


def test_minimum_rejects_nan() -> None:
    param = Param("ratio", float, minimum=0.0)
    try:
        out = param.coerce("nan")
    except ParameterError:
        return
    raise AssertionError(f"coerce('nan') returned {out!r} instead of raising ParameterError")


def test_parse_assignments_splits_on_the_first_equals_sign() -> None:
    from barrierflow.api.params import parse_assignments

    assert parse_assignments(["a=1", "dir=/x=y", " b =", "c=2"]) == {"a": "1", "dir": "/x=y", "b": "", "c": "2"}
    with pytest.raises(ParameterError, match="NAME=VALUE"):
        parse_assignments(["novalue"])
    with pytest.raises(ParameterError, match="NAME=VALUE"):
        parse_assignments(["=1"])
