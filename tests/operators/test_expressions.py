"""barrierflow's evaluator of Spark SQL expressions on Arrow: every supported construct, its type, nulls and errors.

Expected values are worked out by hand from Spark's documented semantics
(ANSI mode, its default in Spark 4; session time zone UTC), never taken from
the evaluator's own output.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

import barrierflow as bf
from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError
from barrierflow.operators.expressions import check_expression, compile_expression, declared_name

UTC = timezone.utc
NAN = float("nan")


def _ts(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


TABLE = pa.table(
    {
        "i": pa.array([1, -2, None, 7], pa.int32()),
        "l": pa.array([10, 0, 3, None], pa.int64()),
        "d": pa.array([1.5, -0.5, None, NAN], pa.float64()),
        "s": pa.array(["a b", "", None, "Hé"], pa.string()),
        "b": pa.array([True, False, None, True]),
        "t": pa.array(
            [_ts(2024, 1, 31, 12, 0, 0), _ts(1969, 12, 31, 23, 59, 59, 500000), None, _ts(2024, 2, 29, 1, 2, 3)],
            pa.timestamp("us", tz="UTC"),
        ),
        "day": pa.array([date(2024, 1, 31), date(2000, 2, 29), None, date(1970, 1, 1)], pa.date32()),
        "_seq": pa.array([1, 2, 3, 4], pa.int64()),
    }
)


def ev(expression: str, table: pa.Table = TABLE) -> tuple[list[Any], pa.DataType]:
    """The expression's values over ``table`` and its type (checked the same before and after evaluation)."""
    check_expression("op", expression)
    compiled = compile_expression("op", expression, table.schema)
    values = compiled.evaluate(table)
    assert values.type == compiled.type and len(values) == table.num_rows
    return values.to_pylist(), compiled.type


def same(got: list[Any], expected: list[Any]) -> bool:
    """Equal, NaN equal to NaN."""
    return len(got) == len(expected) and all(
        (isinstance(g, float) and isinstance(e, float) and math.isnan(g) and math.isnan(e)) or g == e
        for g, e in zip(got, expected)
    )


def one(expression: str) -> Any:
    """A constant expression's value (evaluated for one row)."""
    values, _ = ev(expression, pa.table({"x": [0]}))
    return values[0]


def refused_at_declaration(expression: str, match: str) -> None:
    with pytest.raises(PipelineDefinitionError, match=match):
        check_expression("op", expression)


def refused_at_planning(expression: str, match: str, table: pa.Table = TABLE) -> None:
    check_expression("op", expression)
    with pytest.raises(PipelineDefinitionError, match=match):
        compile_expression("op", expression, table.schema)


def fails_at_run(expression: str, match: str, table: pa.Table = TABLE) -> None:
    compiled = compile_expression("map-1", expression, table.schema)
    with pytest.raises(UserFunctionError, match=rf"^map-1: expression {re.escape(repr(expression))} failed: .*{match}"):
        compiled.evaluate(table)


# -- columns and literals -------------------------------------------------------------------------


def test_columns_resolve_case_insensitively_keeping_their_field() -> None:
    compiled = compile_expression("op", "I", TABLE.schema)
    assert (compiled.column, compiled.name, compiled.type) == ("i", "i", pa.int32())
    assert compiled.evaluate(TABLE).to_pylist() == [1, -2, None, 7]
    assert ev("`s`")[0] == ["a b", "", None, "Hé"]
    renamed = compile_expression("op", "i AS n", TABLE.schema)
    assert (renamed.column, renamed.name) == ("i", "n")
    refused_at_planning("nope + 1", r"op: in 'nope \+ 1', column 'nope' does not exist \(columns: \['i', 'l', 'd'")
    refused_at_planning("_seq + 1", r"column '_seq' is the engine's")
    both = pa.table({"a": [1], "A": [2]})
    refused_at_planning("upper(a)", "does not exist", pa.table({"b": ["x"]}))
    assert ev("a + 1", both)[0] == [2]  # the exact spelling first
    refused_at_planning("upper(B)", "does not exist", both)


@pytest.mark.parametrize(
    "literal, value, type_",
    [
        ("7", 7, pa.int32()),
        ("2147483647", 2147483647, pa.int32()),
        ("2147483648", 2147483648, pa.int64()),
        ("100L", 100, pa.int64()),
        ("-5", -5, pa.int32()),
        ("1.5", 1.5, pa.float64()),  # Spark: decimal(2,1); barrierflow: double
        ("1e3", 1000.0, pa.float64()),
        ("'web'", "web", pa.string()),
        ('"web"', "web", pa.string()),
        ("true", True, pa.bool_()),
        ("FALSE", False, pa.bool_()),
        ("null", None, pa.null()),
        ("date'2024-01-31'", date(2024, 1, 31), pa.date32()),
        ("timestamp'2024-01-31 12:00:00'", _ts(2024, 1, 31, 12), pa.timestamp("us", tz="UTC")),
    ],
)
def test_literals_and_their_types(literal: str, value: Any, type_: pa.DataType) -> None:
    values, got_type = ev(literal)
    assert got_type == type_ and values == [value] * 4


# -- arithmetic ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected, type_",
    [
        ("i + 1", [2, -1, None, 8], pa.int32()),
        ("i + l", [11, -2, None, None], pa.int64()),
        ("l - i", [9, 2, None, None], pa.int64()),
        ("i * 2", [2, -4, None, 14], pa.int32()),
        ("i * 1.5", [1.5, -3.0, None, 10.5], pa.float64()),
        ("d * 2", [3.0, -1.0, None, NAN], pa.float64()),
        ("i / 2", [0.5, -1.0, None, 3.5], pa.float64()),  # / always gives a double
        ("7 / 2", [3.5] * 4, pa.float64()),
        ("i % 3", [1, -2, None, 1], pa.int32()),  # the dividend's sign, as Java
        ("-7 % 3", [-1] * 4, pa.int32()),
        ("7 % -3", [1] * 4, pa.int32()),
        ("d % 1", [0.5, -0.5, None, NAN], pa.float64()),
        ("i div 2", [0, -1, None, 3], pa.int64()),  # truncated toward zero
        ("-i", [-1, 2, None, -7], pa.int32()),
        ("negative(l)", [-10, 0, -3, None], pa.int64()),
        ("cast(i as float) + 1", [2.0, -1.0, None, 8.0], pa.float32()),
        ("null + 1", [None] * 4, pa.int32()),
        ("(i + 1) * (l - 1)", [18, 1, None, None], pa.int64()),
    ],
)
def test_arithmetic_values_and_types(expression: str, expected: list[Any], type_: pa.DataType) -> None:
    values, got_type = ev(expression)
    assert got_type == type_ and same(values, expected)


def test_integer_overflow_fails_the_epoch_naming_the_operator_and_the_expression() -> None:
    big = pa.table({"n": pa.array([2147483647, None], pa.int32()), "m": pa.array([9223372036854775807, 1], pa.int64())})
    fails_at_run("n + 1", r"n \+ 1: integer overflow", big)
    fails_at_run("n * 2", "integer overflow", big)
    fails_at_run("m + 1", "integer overflow", big)
    fails_at_run("-m - 2", "integer overflow", big)
    fails_at_run("cast(m as int)", "not in range", big)
    assert ev("cast(n as bigint) + 1", big)[0] == [2147483648, None]  # widened first: no overflow
    assert ev("n + 1.0", big)[0] == [2147483648.0, None]


def test_division_by_zero_fails_but_a_null_operand_gives_null() -> None:
    fails_at_run("i / 0", r"i / 0: division by zero .*\(3 record\(s\)\)")  # 3 non-null dividends
    fails_at_run("d / 0.0", "division by zero")
    fails_at_run("i % l", "division by zero")  # -2 % 0
    fails_at_run("l div 0", "division by zero")
    assert ev("i / null")[0] == [None] * 4
    assert ev("i / cast(null as int)")[0] == [None] * 4
    nulls = pa.table({"x": pa.array([None, None], pa.int32())})
    assert ev("x / 0", nulls)[0] == [None, None]  # a null dividend: null, as Spark


def test_a_guarded_division_never_divides_by_zero() -> None:
    """As Spark, a branch is computed only for the records that take it, and AND/OR only where the left side does not decide."""
    assert ev("case when l <> 0 then 100 / l else -1 end")[0] == [10.0, -1.0, 100 / 3, -1.0]
    assert ev("if(l = 0, null, 100 div l)")[0] == [10, None, 33, None]
    assert ev("l <> 0 and 100 / l > 5")[0] == [True, False, True, None]
    assert ev("l = 0 or 100 / l > 20")[0] == [False, True, True, None]
    assert ev("coalesce(nullif(l, 0), 1) * 2")[0] == [20, 2, 6, 2]


# -- comparisons and logic ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("i = 1", [True, False, None, False]),
        ("i == 1", [True, False, None, False]),
        ("i <> 1", [False, True, None, True]),
        ("i != 1", [False, True, None, True]),
        ("i < l", [True, True, None, None]),
        ("i <= -2", [False, True, None, False]),
        ("i > 1.5", [False, False, None, True]),
        ("i >= 7", [False, False, None, True]),
        ("s = 'a b'", [True, False, None, False]),
        ("s < 'b'", [True, True, None, True]),
        ("i = '7'", [False, False, None, True]),  # a string literal read as the number it compares with
        ("day = '2024-01-31'", [True, False, None, False]),
        ("t >= '2024-01-31 12:00:00'", [True, False, None, True]),
        ("t < date'2024-01-31'", [False, True, None, False]),  # a date meets a timestamp at midnight UTC
        ("b = true", [True, False, None, True]),
        ("i <=> 1", [True, False, False, False]),
        ("i <=> null", [False, False, True, False]),
        ("null = null", [None] * 4),
    ],
)
def test_comparisons(expression: str, expected: list[Any]) -> None:
    values, type_ = ev(expression)
    assert type_ == pa.bool_() and values == expected


def test_floating_point_comparisons_follow_spark_nan_is_equal_to_itself_and_greatest() -> None:
    x = pa.table({"x": [NAN, 1.0, NAN, None], "y": [NAN, NAN, 2.0, NAN]})
    assert ev("x = y", x)[0] == [True, False, False, None]
    assert ev("x <> y", x)[0] == [False, True, True, None]
    assert ev("x < y", x)[0] == [False, True, False, None]
    assert ev("x > y", x)[0] == [False, False, True, None]
    assert ev("x >= y", x)[0] == [True, False, True, None]
    assert ev("x <= y", x)[0] == [True, True, False, None]
    assert ev("x > 1e308", x)[0] == [True, False, True, None]
    assert ev("x in (cast('NaN' as double))", x)[0] == [True, False, True, None]


def test_three_valued_logic() -> None:
    values = [True, False, None]
    pairs = pa.table({"a": [a for a in values for _ in values], "b": [b for _ in values for b in values]})

    def kleene_and(a: bool | None, b: bool | None) -> bool | None:
        return False if a is False or b is False else (None if a is None or b is None else True)

    def kleene_or(a: bool | None, b: bool | None) -> bool | None:
        return True if a is True or b is True else (None if a is None or b is None else False)

    rows = list(zip(pairs["a"].to_pylist(), pairs["b"].to_pylist()))
    assert ev("a AND b", pairs)[0] == [kleene_and(a, b) for a, b in rows]
    assert ev("a OR b", pairs)[0] == [kleene_or(a, b) for a, b in rows]
    assert ev("NOT a", pairs)[0] == [None if a is None else not a for a, _ in rows]
    assert ev("!a", pairs)[0] == [None if a is None else not a for a, _ in rows]
    assert ev("a is true", pairs)[0] == [a is True for a, _ in rows]
    assert ev("a is not true", pairs)[0] == [a is not True for a, _ in rows]
    assert ev("a is false", pairs)[0] == [a is False for a, _ in rows]
    assert ev("a is not false", pairs)[0] == [a is not False for a, _ in rows]
    assert ev("null and false", pairs)[0] == [False] * 9 and ev("null or true", pairs)[0] == [True] * 9


def test_null_tests() -> None:
    assert ev("s is null")[0] == [False, False, True, False]
    assert ev("s is not null")[0] == [True, True, False, True]
    assert ev("isnull(i)")[0] == [False, False, True, False]
    assert ev("isnotnull(i)")[0] == [True, True, False, True]
    assert ev("d is null")[0] == [False, False, True, False]  # NaN is not null


def test_in_and_between() -> None:
    assert ev("i in (1, 7)")[0] == [True, False, None, True]
    assert ev("i in (1, null)")[0] == [True, None, None, None]  # no match but a null met: unknown
    assert ev("i not in (1, null)")[0] == [False, None, None, None]
    assert ev("i not in (1, 5)")[0] == [False, True, None, True]
    assert ev("s in ('a b', '')")[0] == [True, True, None, False]
    assert ev("i in (l, 7)")[0] == [False, False, None, True]
    assert ev("i in ('1', 2)")[0] == [True, False, None, False]
    assert ev("i between -2 and 1")[0] == [True, True, None, False]
    assert ev("i not between -2 and 1")[0] == [False, False, None, True]
    assert ev("i between l and 100")[0] == [False, False, None, None]
    assert ev("day between '2000-01-01' and '2024-01-31'")[0] == [True, True, None, False]


def test_like_ilike_and_rlike() -> None:
    words = pa.table({"w": ["abc", "a_c", "A%C", "a\nc", None, "ab\\c"]})
    assert ev("w like 'a%'", words)[0] == [True, True, False, True, None, True]
    assert ev("w like 'a_c'", words)[0] == [True, True, False, True, None, False]  # _ is any character, a newline too
    assert ev("w like 'a\\\\_c'", words)[0] == [False, True, False, False, None, False]  # a backslash escapes _
    assert ev("w like 'a!_c' escape '!'", words)[0] == [False, True, False, False, None, False]
    assert ev("w like 'ab\\\\\\\\c'", words)[0] == [False, False, False, False, None, True]  # an escaped backslash
    assert ev("w not like 'a%'", words)[0] == [False, False, True, False, None, False]
    assert ev("w ilike 'a%c'", words)[0] == [True, True, True, True, None, True]
    assert ev("w rlike '^a.c$'", words)[0] == [True, True, False, False, None, False]  # . is not a newline (Java)
    assert ev("w rlike 'b'", words)[0] == [True, False, False, False, None, True]  # found anywhere
    assert ev("regexp(w, '[A-Z]')", words)[0] == [False, False, True, False, None, False]
    assert ev("regexp_like(w, 'c$')", words)[0] == [True, True, False, True, None, True]
    assert ev("i like '%7'")[0] == [False, False, None, True]  # a number is read as its string


# -- conditionals ----------------------------------------------------------------------------------------


def test_case_if_coalesce_nullif() -> None:
    assert ev("case when i > 0 then 'pos' when i < 0 then 'neg' else 'none' end")[0] == ["pos", "neg", "none", "pos"]
    assert ev("case when i > 5 then 'big' end")[0] == [None, None, None, "big"]  # no ELSE: null
    assert ev("case i when 1 then 'one' when 7 then 'seven' else 'other' end")[0] == ["one", "other", "other", "seven"]
    values, type_ = ev("case when b then i else d end")  # int and double meet in double
    assert type_ == pa.float64() and same(values, [1.0, -0.5, None, 7.0])
    assert ev("case when b then l end")[1] == pa.int64()
    assert ev("if(b, 'yes', 'no')")[0] == ["yes", "no", "no", "yes"]  # a null condition takes the else branch
    values, type_ = ev("coalesce(i, l, 0)")
    assert type_ == pa.int64() and values == [1, -2, 3, 7]
    assert ev("nvl(s, '?')")[0] == ["a b", "", "?", "Hé"]
    assert ev("ifnull(l, 99)")[0] == [10, 0, 3, 99]
    assert ev("coalesce(null, null)")[0] == [None] * 4
    values, type_ = ev("nullif(l, 0)")
    assert type_ == pa.int64() and values == [10, None, 3, None]
    refused_at_planning("case when i then 1 end", r"a WHEN condition must be a boolean, not i \(int\)")
    refused_at_planning("if(b, 1, 'x')", "the types do not meet")


# -- casts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("cast(i as string)", ["1", "-2", None, "7"]),
        ("cast(b as string)", ["true", "false", None, "true"]),
        ("cast(day as string)", ["2024-01-31", "2000-02-29", None, "1970-01-01"]),
        ("cast(t as string)", ["2024-01-31 12:00:00", "1969-12-31 23:59:59.5", None, "2024-02-29 01:02:03"]),
        ("cast(d as string)", ["1.5", "-0.5", None, "NaN"]),
    ],
)
def test_casts_to_string_print_as_spark_prints(expression: str, expected: list[Any]) -> None:
    values, type_ = ev(expression)
    assert type_ == pa.string() and values == expected


@pytest.mark.parametrize(
    "number, text",
    [
        (0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (100.0, "100.0"), (0.001, "0.001"), (0.0001, "1.0E-4"),
        (1234567.0, "1234567.0"), (1e7, "1.0E7"), (12345678.9, "1.23456789E7"), (-1.5e-5, "-1.5E-5"), (1e20, "1.0E20"),
        (0.1 + 0.2, "0.30000000000000004"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity"),
        (123.456, "123.456"),
    ],
)  # fmt: skip
def test_doubles_print_as_java_prints_them(number: float, text: str) -> None:
    assert ev("cast(x as string)", pa.table({"x": [number]}))[0] == [text]


def test_floats_print_with_float_digits() -> None:
    assert ev("cast(x as string)", pa.table({"x": pa.array([0.1, 1e10, 3.0], pa.float32())}))[0] == ["0.1", "1.0E10", "3.0"]


def test_casts_from_strings() -> None:
    text = pa.table({"x": [" 42 ", "+7", "-0", None]})
    values, type_ = ev("cast(x as int)", text)
    assert type_ == pa.int32() and values == [42, 7, 0, None]
    assert ev("cast(x as bigint)", text)[1] == pa.int64() and ev("cast(x as smallint)", text)[1] == pa.int16()
    assert ev("cast(x as tinyint)", text)[1] == pa.int8() and ev("cast(x as long)", text)[1] == pa.int64()
    assert same(ev("cast(x as double)", pa.table({"x": ["1.5", " -2e3 ", "NaN", "Infinity"]}))[0], [1.5, -2000.0, NAN, math.inf])
    assert ev("cast(x as boolean)", pa.table({"x": ["true", " Yes", "N", "0", "t", None]}))[0] == [
        True,
        True,
        False,
        False,
        True,
        None,
    ]
    assert ev("cast(x as date)", pa.table({"x": ["2024-01-31", "2024-02-29 10:00:00", None]}))[0] == [
        date(2024, 1, 31), date(2024, 2, 29), None,
    ]  # fmt: skip
    stamps = pa.table({"x": ["2024-01-31 12:00:00", "2024-01-31T12:00:00Z", "2024-01-31T13:00:00+01:00", "2024-01-31", None]})
    values, type_ = ev("cast(x as timestamp)", stamps)
    assert type_ == pa.timestamp("us", tz="UTC")
    assert values == [_ts(2024, 1, 31, 12), _ts(2024, 1, 31, 12), _ts(2024, 1, 31, 12), _ts(2024, 1, 31), None]
    assert ev("to_timestamp(x)", stamps)[0] == values


@pytest.mark.parametrize(
    "expression, match",
    [
        ("cast(x as int)", "Failed to parse string: '4.5'"),
        ("cast(x as boolean)", "'4.5' is not a boolean"),
        ("cast(x as date)", "Failed to parse"),
        ("cast(x as timestamp)", "Failed to parse"),
    ],
)
def test_a_string_no_cast_can_read_fails_the_epoch(expression: str, match: str) -> None:
    fails_at_run(expression, match, pa.table({"x": ["1", "4.5"]}))


def test_casts_between_numbers_and_others() -> None:
    values, type_ = ev("cast(d as int)", pa.table({"d": [1.9, -1.9, None]}))
    assert type_ == pa.int32() and values == [1, -1, None]  # truncated toward zero
    fails_at_run("cast(d as int)", "out of the range of int", pa.table({"d": [3e9]}))
    fails_at_run("cast(d as bigint)", "out of the range of bigint", pa.table({"d": [NAN]}))
    assert ev("cast(b as int)")[0] == [1, 0, None, 1]
    assert ev("cast(i as boolean)")[0] == [True, True, None, True]
    assert ev("cast(l as boolean)")[0] == [True, False, True, None]
    assert ev("cast(i as double)")[0] == [1.0, -2.0, None, 7.0]
    assert ev("cast(day as timestamp)")[0] == [_ts(2024, 1, 31), _ts(2000, 2, 29), None, _ts(1970, 1, 1)]
    assert ev("cast(t as date)")[0] == [date(2024, 1, 31), date(1969, 12, 31), None, date(2024, 2, 29)]
    assert ev("to_date(t)")[0] == [date(2024, 1, 31), date(1969, 12, 31), None, date(2024, 2, 29)]
    assert ev("int(d)", pa.table({"d": [2.5]}))[0] == [2] and ev("l::string")[0] == ["10", "0", "3", None]
    refused_at_planning("cast(l as timestamp)", r"cast of l \(bigint\) to timestamp is not allowed .*use timestamp_seconds")
    refused_at_planning("cast(t as bigint)", "use unix_seconds")
    refused_at_planning("cast(day as int)", "is not allowed")


# -- strings ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected, type_",
    [
        ("upper(s)", ["A B", "", None, "HÉ"], pa.string()),
        ("ucase(s)", ["A B", "", None, "HÉ"], pa.string()),
        ("lower(s)", ["a b", "", None, "hé"], pa.string()),
        ("length(s)", [3, 0, None, 2], pa.int32()),  # characters, not bytes
        ("char_length(s)", [3, 0, None, 2], pa.int32()),
        ("length(i)", [1, 2, None, 1], pa.int32()),  # a number read as its string
        ("concat(s, '-', i)", ["a b-1", "--2", None, "Hé-7"], pa.string()),
        ("s || '!'", ["a b!", "!", None, "Hé!"], pa.string()),
        ("concat_ws(',', s, i, l)", ["a b,1,10", ",-2,0", "3", "Hé,7"], pa.string()),  # nulls skipped
        ("concat_ws('-', null, null)", ["", "", "", ""], pa.string()),
        ("concat('x', d)", ["x1.5", "x-0.5", None, "xNaN"], pa.string()),
        ("replace(s, ' ', '_')", ["a_b", "", None, "Hé"], pa.string()),
        ("replace(s, 'a')", [" b", "", None, "Hé"], pa.string()),
        ("replace(s, '', 'x')", ["a b", "", None, "Hé"], pa.string()),
        ("regexp_replace(s, '([a-z]) ([a-z])', '$2 $1')", ["b a", "", None, "Hé"], pa.string()),
        ("regexp_replace(s, '[aé]', '\\\\$')", ["$ b", "", None, "H$"], pa.string()),
        ("startswith(s, 'a')", [True, False, None, False], pa.bool_()),
        ("endswith(s, 'é')", [False, False, None, True], pa.bool_()),
        ("contains(s, ' ')", [True, False, None, False], pa.bool_()),
    ],
)
def test_string_functions(expression: str, expected: list[Any], type_: pa.DataType) -> None:
    values, got_type = ev(expression)
    assert got_type == type_ and values == expected


def test_trim_removes_spaces_only_or_the_characters_given() -> None:
    padded = pa.table({"x": ["  a b  ", "\ta\t", "xxaxx", None]})
    assert ev("trim(x)", padded)[0] == ["a b", "\ta\t", "xxaxx", None]
    assert ev("ltrim(x)", padded)[0] == ["a b  ", "\ta\t", "xxaxx", None]
    assert ev("rtrim(x)", padded)[0] == ["  a b", "\ta\t", "xxaxx", None]
    assert ev("trim(BOTH 'x' FROM x)", padded)[0] == ["  a b  ", "\ta\t", "a", None]
    assert ev("trim(LEADING 'x' FROM x)", padded)[0] == ["  a b  ", "\ta\t", "axx", None]
    assert ev("trim(TRAILING 'x' FROM x)", padded)[0] == ["  a b  ", "\ta\t", "xxa", None]


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("substring(x, 2)", "park SQL"),
        ("substring(x, 2, 3)", "par"),
        ("substr(x, 1, 5)", "Spark"),
        ("substring(x, 0, 2)", "Sp"),  # 0 reads as 1
        ("substring(x, -3)", "SQL"),
        ("substring(x, -3, 2)", "SQ"),
        ("substring(x, -20, 3)", ""),  # starts 11 before the string: its first 3 positions are before it
        ("substring(x, -11, 3)", "S"),  # starts 2 before the string: its third position is the first character
        ("substring(x, 5, 100)", "k SQL"),
        ("substring(x, 20)", ""),
        ("substring(x, 2, 0)", ""),
        ("substring(x, 2, -1)", ""),
        ("substring(x from 7 for 3)", "SQL"),
    ],
)
def test_substring_is_one_based_as_spark(expression: str, expected: str) -> None:
    assert ev(expression, pa.table({"x": ["Spark SQL", None]}))[0] == [expected, None]


def test_split_keeps_trailing_empty_strings_and_takes_a_limit() -> None:
    texts = pa.table({"x": ["y x. x z. q", "dup dup.", "", ".a", None]})
    values, type_ = ev("split(x, '[.]')", texts)
    assert type_ == pa.list_(pa.string())
    assert values == [["y x", " x z", " q"], ["dup dup", ""], [""], ["", "a"], None]
    assert ev("split(x, ' ', 2)", texts)[0] == [["y", "x. x z. q"], ["dup", "dup."], [""], [".a"], None]
    assert ev("split(x, ' ', -1)", texts)[0] == [["y", "x.", "x", "z.", "q"], ["dup", "dup."], [""], [".a"], None]


def test_element_at_and_size() -> None:
    texts = pa.table({"x": ["y x", None, " lead", "", "z"]})  # the integration test's computed keys
    assert ev("element_at(split(x, ' '), 1)", texts)[0] == ["y", None, "", "", "z"]
    assert ev("element_at(split(x, ' '), -1)", texts)[0] == ["x", None, "lead", "", "z"]
    values, type_ = ev("size(split(x, ' '))", texts)
    assert type_ == pa.int32() and values == [2, None, 2, 1, 1]
    assert ev("cardinality(split(x, ' '))", texts)[0] == [2, None, 2, 1, 1]
    lists = pa.table({"a": pa.array([[1, 2, 3], [4], None, []], pa.list_(pa.int64())), "p": [3, -1, 1, None]})
    values, type_ = ev("element_at(a, p)", lists)
    assert type_ == pa.int64() and values == [3, 4, None, None]
    fails_at_run("element_at(a, 2)", r"element_at\(a, 2\): position out of the array's bounds .*\(2 record\(s\)\)", lists)
    fails_at_run("element_at(a, p - p)", "position 0", lists)
    refused_at_planning("element_at(s, 1)", r"element_at needs an array, not s \(string\)")
    refused_at_planning("size(s)", "needs an array")


# -- math --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected, type_",
    [
        ("abs(i)", [1, 2, None, 7], pa.int32()),
        ("abs(d)", [1.5, 0.5, None, NAN], pa.float64()),
        ("round(d)", [2.0, -1.0, None, NAN], pa.float64()),  # half away from zero
        ("round(i)", [1, -2, None, 7], pa.int32()),
        ("round(i * 125, -2)", [100, -300, None, 900], pa.int32()),  # 125 -> 100, -250 -> -300, 875 -> 900
        ("floor(d)", [1, -1, None, 0], pa.int64()),  # NaN: 0, as Java's (long)
        ("ceil(d)", [2, 0, None, 0], pa.int64()),
        ("ceiling(i)", [1, -2, None, 7], pa.int64()),
        ("sqrt(l)", [math.sqrt(10), 0.0, math.sqrt(3), None], pa.float64()),
        ("pow(i, 2)", [1.0, 4.0, None, 49.0], pa.float64()),
        ("power(2, 10)", [1024.0] * 4, pa.float64()),
        ("greatest(i, l, 2)", [10, 2, 3, 7], pa.int64()),  # nulls skipped
        ("least(i, l)", [1, -2, 3, 7], pa.int64()),
        ("greatest(d, 0)", [1.5, 0.0, 0.0, NAN], pa.float64()),  # NaN is the greatest
        ("least(d, 0)", [0.0, -0.5, 0.0, 0.0], pa.float64()),
        ("greatest(s, 'b')", ["b", "b", "b", "b"], pa.string()),
    ],
)
def test_math_functions(expression: str, expected: list[Any], type_: pa.DataType) -> None:
    values, got_type = ev(expression)
    assert got_type == type_ and same(values, expected)


@pytest.mark.parametrize(
    "x, digits, expected",
    [
        (2.5, 0, 3.0), (-2.5, 0, -3.0), (0.5, 0, 1.0), (1.005, 2, 1.01), (2.675, 2, 2.68), (-2.675, 2, -2.68),
        (0.125, 2, 0.13), (1.2345, 3, 1.235), (1234.5, -1, 1230.0), (1250.0, -2, 1300.0), (1e300, 2, 1e300),
        (0.0004, 3, 0.0), (float("inf"), 1, float("inf")),
    ],
)  # fmt: skip
def test_round_is_half_up_on_the_shortest_decimal_as_spark(x: float, digits: int, expected: float) -> None:
    assert ev(f"round(x, {digits})", pa.table({"x": [x]}))[0] == [expected]


def test_math_edge_values() -> None:
    assert math.isnan(one("sqrt(-1)")) and one("pow(0, -1)") == math.inf
    fails_at_run("abs(n)", "integer overflow", pa.table({"n": pa.array([-2147483648], pa.int32())}))
    assert ev("floor(x)", pa.table({"x": [1e30, -1e30]}))[0] == [2**63 - 1, -(2**63)]  # saturating, as Java's (long)


# -- time ---------------------------------------------------------------------------------------------------


def test_timestamps_from_and_to_numbers() -> None:
    epochs = pa.table({"n": pa.array([1700000000, -1, None], pa.int64()), "f": [1.5, -0.5, NAN]})
    values, type_ = ev("timestamp_seconds(n)", epochs)
    assert type_ == pa.timestamp("us", tz="UTC") and values == [
        _ts(2023, 11, 14, 22, 13, 20),
        _ts(1969, 12, 31, 23, 59, 59),
        None,
    ]
    assert ev("timestamp_seconds(f)", epochs)[0] == [
        _ts(1970, 1, 1, 0, 0, 1, 500000),
        _ts(1969, 12, 31, 23, 59, 59, 500000),
        None,
    ]
    assert ev("timestamp_millis(n)", epochs)[0] == [_ts(1970, 1, 20, 16, 13, 20), _ts(1969, 12, 31, 23, 59, 59, 999000), None]
    assert ev("timestamp_micros(n)", epochs)[0] == [_ts(1970, 1, 1, 0, 28, 20), _ts(1969, 12, 31, 23, 59, 59, 999999), None]
    assert ev("timestamp_seconds(i + 1700000000)")[0][0] == _ts(2023, 11, 14, 22, 13, 21)
    assert ev("unix_seconds(t)")[0] == [1706702400, -1, None, 1709168523]  # floored: -0.5 s is -1
    assert ev("unix_millis(t)")[0] == [1706702400000, -500, None, 1709168523000]
    assert ev("unix_micros(t)")[0] == [1706702400000000, -500000, None, 1709168523000000]
    fails_at_run("timestamp_millis(n)", "overflow", pa.table({"n": pa.array([2**62], pa.int64())}))
    refused_at_planning("timestamp_millis(d)", "timestamp_millis needs an integer")


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("year(t)", [2024, 1969, None, 2024]),
        ("month(t)", [1, 12, None, 2]),
        ("day(t)", [31, 31, None, 29]),
        ("dayofmonth(day)", [31, 29, None, 1]),
        ("hour(t)", [12, 23, None, 1]),
        ("minute(t)", [0, 59, None, 2]),
        ("second(t)", [0, 59, None, 3]),
        ("hour(day)", [0, 0, None, 0]),
        ("year('2024-05-06')", [2024] * 4),
        ("month(to_date('2024-05-06'))", [5] * 4),
    ],
)
def test_date_and_time_parts_in_utc(expression: str, expected: list[Any]) -> None:
    values, type_ = ev(expression)
    assert type_ == pa.int32() and values == expected


def test_time_parts_read_other_zones_in_utc() -> None:
    paris = pa.table({"t": pa.array([_ts(2024, 1, 31, 23, 30)], pa.timestamp("us", tz="Europe/Paris"))})
    assert ev("hour(t)", paris)[0] == [23] and ev("day(t)", paris)[0] == [31]
    assert ev("cast(t as string)", paris)[0] == ["2024-01-31 23:30:00"]


# -- what is refused, and when ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, match",
    [
        (
            "sha2(s, 256)",
            r"op: function sha2 in 'sha2\(s, 256\)' is not supported\. barrierflow evaluates these SQL expressions: column names.*upper",
        ),
        ("my_udf(s)", "function my_udf in 'my_udf"),
        ("sum(i)", "aggregate function sum .* is not supported; aggregate with key_by"),
        ("count(*)", "aggregate function count"),
        ("row_number() over (order by i)", "window function"),
        ("i in (select 1)", "is not supported"),
        ("try_cast(s as int)", "try_cast .* is not supported"),
        ("cast(i as decimal(10, 2))", r"cast to DECIMAL\(10, 2\) .* is not supported; cast to string, tinyint"),
        ("cast(i as array<int>)", "cast to ARRAY"),
        ("split(s, sep)", r"argument 2 of split as 'sep' in 'split\(s, sep\)' is not supported; give a string literal"),
        ("substring(s, i)", "give an integer literal"),
        ("s rlike '(?=a)'", "is not one RE2 compiles"),
        ("split(s, 'x*')", "matches the empty string"),
        ("s like 'a\\\\b'", r"the escape character '\\\\' is not allowed to precede 'b'"),
        ("s like 'a!b' escape '!'", "not allowed to precede 'b'"),
        ("s like s escape '!'", r"argument 2 of LIKE as 's' .* give a string literal"),
        ("regexp_replace(s, 'a', '$x')", r"\$ must be followed by one group number"),
        ("element_at(split(s, ' '), 0)", "element_at position 0 .*SQL arrays start at 1"),
        ("split(s, ' ')[0]", r"array\[index\] .* write element_at"),
        ("try_element_at(split(s, ' '), 1)", "try_element_at"),
        ("a.b", "name a top-level column"),
        ("upper(s) AS x AS y", "not a SQL expression|alias"),
        ("upper(s AS x)", "is not a SQL expression"),
        ("if(b, 1)", r"if with 2 argument\(s\) .* it takes 3"),
        ("greatest(i)", "greatest with 1 argument"),
        ("i IS 1", "IS takes NULL, TRUE or FALSE"),
        ("to_date(s, 'yyyy')", "to_date with a format"),
        ("trim(s, 'x')", "TRIM\\(BOTH\\|LEADING\\|TRAILING 'chars' FROM s\\)"),
        ("floor(d, 1)", "floor with a scale"),
        ("x'0a'", "is not supported"),
        ("99999999999999999999", "does not fit a bigint"),
        ("i +", "is not a SQL expression"),
        ("select i", "a statement"),
    ],
)
def test_unsupported_constructs_are_refused_at_declaration(expression: str, match: str) -> None:
    refused_at_declaration(expression, match)


@pytest.mark.parametrize(
    "expression",
    ["current_date()", "current_date", "current_timestamp()", "now()", "rand()", "random()", "randn()", "uuid()",
     "monotonically_increasing_id()", "spark_partition_id()", "input_file_name()", "unix_timestamp()", "shuffle(split(s, ' '))"],
)  # fmt: skip
def test_non_deterministic_functions_are_refused(expression: str) -> None:
    refused_at_declaration(expression, "is non-deterministic and not supported: a replayed epoch must compute the same records")


class Column:
    """Stands for a pyspark.sql.Column (recognised by its class, without importing PySpark)."""


Column.__module__ = "pyspark.sql.classic.column"

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.float64())])


def _build(body: Any) -> bf.Pipeline:
    @bf.pipeline("expr_pipe")
    def definition(p: bf.PipelineBuilder, params: dict[str, Any]) -> None:
        body(p.source(bf.FileSource("events", "/nonexistent", schema=SCHEMA)))

    return definition.build({})


@pytest.mark.parametrize(
    "body",
    [
        lambda s: s.filter(Column()),
        lambda s: s.select("k", Column()),
        lambda s: s.map(x=Column()),
        lambda s: s.flat_map(x=Column()),
    ],
)
def test_a_pyspark_column_is_refused_when_declared_pointing_to_the_sql_string(body: Any) -> None:
    with pytest.raises(
        bf.PipelineDefinitionError, match=r"a pyspark.sql.Column has no Arrow form.*give the expression as a SQL string"
    ):
        _build(body)


def test_unsupported_expressions_fail_when_the_pipeline_is_declared_naming_the_operator() -> None:
    with pytest.raises(bf.PipelineDefinitionError, match=r"^cleaned: function md5 in 'md5\(k\)' is not supported"):
        _build(lambda s: s.map(x="md5(k)", operator_id="cleaned"))
    with pytest.raises(
        bf.PipelineDefinitionError,
        match=r"^filter: current_date in \"v > 0 and current_date\(\) > '2024-01-01'\" is non-deterministic",
    ):
        _build(lambda s: s.filter("v > 0 and current_date() > '2024-01-01'"))
    with pytest.raises(bf.PipelineDefinitionError, match=r"^select-1: select 'upper\(k\)' needs a name for its output column"):
        _build(lambda s: s.select("upper(k)"))


@pytest.mark.parametrize(
    "expression, match",
    [
        ("upper(split(s, ' '))", r"upper needs a string, not split\(s, ' '\) \(array<string>\)"),
        ("s + 1", r"\+ needs a number, not s \(string\)"),
        ("i = s", r"comparing with = of i \(int\), s \(string\): the types do not meet; cast one of them"),
        ("i = 'x'", r"'x' is not a int"),
        ("not i", "NOT must be a boolean, not i"),
        ("i and b", "AND must be a boolean"),
        ("i div d", r"div needs integers, not d \(double\)"),
        ("sqrt(s)", "sqrt needs a number"),
        ("year(i)", r"year needs a date, not i \(int\)"),
        ("timestamp_seconds(s)", "timestamp_seconds needs a number"),
        ("greatest(b, true)", "greatest compares single values"),
    ],
)
def test_type_errors_are_refused_when_the_pipeline_is_planned(expression: str, match: str) -> None:
    refused_at_planning(expression, match)


def test_declared_names() -> None:
    assert declared_name("op", "amount * 100 AS cents") == ("cents", None)
    assert declared_name("op", "amount") == ("amount", "amount")
    assert declared_name("op", "left_ts as ordered_at") == ("ordered_at", "left_ts")
    assert declared_name("op", "upper(k)") == (None, None)


EVERY_KIND = [
    "i + l", "i / 2", "i % 3", "i div 2", "-i", "i = '7'", "d = d", "i <=> null", "b and i > 0", "b or i > 0", "not b",
    "s is null", "i in (1, null)", "i between 1 and 2", "s like 'a%'", "s rlike 'a'", "case when l <> 0 then 1 / l end",
    "case i when 1 then 'x' end", "if(b, 1, 2)", "coalesce(i, l)", "nullif(i, 1)", "cast(d as string)", "cast(t as string)",
    "cast(cast(i as string) as int)", "cast(cast(b as string) as boolean)", "cast(cast(t as string) as timestamp)", "upper(s)", "length(s)", "trim(s)", "substring(s, 2, 1)",
    "concat(s, i)", "concat_ws(',', s, i)", "replace(s, 'a', 'b')", "regexp_replace(s, 'a', 'b')", "split(s, ' ')",
    "startswith(s, 'a')", "element_at(split(s, ' '), 1)", "size(split(s, ' '))", "abs(i)", "round(d, 1)", "floor(d)", "sqrt(d)",
    "pow(d, 2)", "greatest(i, l)", "timestamp_seconds(l)", "timestamp_seconds(d)", "unix_seconds(t)", "year(t)", "hour(t)",
    "'web'", "null",
]  # fmt: skip


@pytest.mark.parametrize("expression", EVERY_KIND)
def test_every_kind_of_expression_runs_on_no_rows_and_on_chunked_columns(expression: str) -> None:
    compiled = compile_expression("op", expression, TABLE.schema)
    empty = compiled.evaluate(TABLE.slice(0, 0))
    assert len(empty) == 0 and empty.type == compiled.type
    whole = compiled.evaluate(TABLE.filter(pa.array([True, True, False, True])))
    chunked = pa.concat_tables([TABLE.slice(0, 1), TABLE.slice(1, 1), TABLE.slice(3, 1)])
    assert same(compiled.evaluate(chunked).to_pylist(), whole.to_pylist())
