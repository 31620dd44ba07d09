"""Column expressions: the Spark SQL expressions users give filter, select, map and flat_map, evaluated on Arrow.

An expression is a string of Spark SQL (``"amount >= 0"``,
``"cast(round(amount * 100) as long)"``, ``"split(text, '[.]')"``), parsed
with sqlglot (dialect ``spark``) when the pipeline is declared and compiled
to ``pyarrow.compute`` over the operator's input rows. Whatever the epoch's
size or placement, the same rows give the same values.

Supported expressions
---------------------

Everything below is accepted; anything else (another function, a subquery,
an aggregate or window function) is refused when the pipeline is declared,
with a :class:`~barrierflow.core.errors.PipelineDefinitionError` naming the
operator and the construct. A ``pyspark.sql.Column`` is refused too: it has
no form outside a Spark session; write the same expression as a SQL string
(``F.col("amount") > 0`` is ``"amount > 0"``).

- **Columns** by name, as Spark resolves them (case-insensitively; quote
  odd names with backticks). Columns starting with ``_`` are the engine's
  and cannot be read.
- **Literals**: integers (``int`` if they fit 32 bits, else ``bigint``;
  ``100L`` is a ``bigint``), numbers with a point or exponent (``1.5``,
  ``1e3``: ``double``; Spark types ``1.5`` as a decimal), ``'strings'`` (or
  ``"strings"``), ``true``/``false``, ``null``, ``date'2024-01-31'``,
  ``timestamp'2024-01-31 12:00:00'``.
- **Arithmetic** ``+ - * %`` and unary ``-`` on numbers, in the wider of
  the operands' types (``int`` < ``bigint`` < ``float`` < ``double``);
  ``/`` always gives a ``double``; ``a div b`` (integers) a ``bigint``
  truncated toward zero; ``%`` has the sign of the dividend.
- **Comparisons** ``= == <> != < <= > >=`` and null-safe ``<=>``; a string
  literal compared with a number, date or timestamp is read as one
  (``day = '2024-01-31'``). Floating-point comparisons follow Spark:
  ``NaN = NaN`` and ``NaN`` is larger than every other number.
- **Logic** ``AND``, ``OR``, ``NOT`` with SQL's three-valued logic
  (``null AND false`` is false, ``null OR true`` is true, otherwise null
  stays null); ``IS [NOT] NULL``, ``IS [NOT] TRUE|FALSE``, ``isnull(x)``,
  ``isnotnull(x)``; ``x [NOT] IN (v, ...)`` (null when no value matches and
  ``x`` or a value is null); ``x [NOT] BETWEEN a AND b``;
  ``[NOT] LIKE 'pattern' [ESCAPE 'c']`` (``%``, ``_``; backslash escapes by
  default), ``ILIKE``, ``RLIKE``/``regexp``/``regexp_like``.
- **Conditionals** ``CASE WHEN ... THEN ... [ELSE ...] END``, ``CASE x WHEN
  v THEN ...``, ``if(c, a, b)``, ``coalesce(...)``/``nvl``/``ifnull``,
  ``nullif(a, b)``. As in Spark, a branch is evaluated only for the records
  that take it, and ``AND``/``OR`` evaluate their right side only where the
  left does not decide (``d <> 0 AND n / d > 1`` never divides by zero).
- **Casts** ``cast(x AS t)`` (also ``x::t``, ``int(x)``...) to ``string``,
  ``tinyint``/``byte``, ``smallint``/``short``, ``int``/``integer``,
  ``bigint``/``long``, ``float``/``real``, ``double``, ``boolean``,
  ``date``, ``timestamp``. As Spark's ANSI casts: a string that is not a
  value of the type fails (strings are trimmed; booleans read
  ``true/false/t/f/yes/no/y/n/1/0``; dates ``yyyy-MM-dd``; timestamps
  ``yyyy-MM-dd[( |T)HH:mm[:ss[.ffffff]]][Z|+HH:mm]``, in UTC without a
  zone), a number out of the target's range fails, a floating-point number
  is truncated toward zero; numbers and timestamps do not cast to each other
  (use ``timestamp_seconds``, ``unix_seconds``...). Numbers, booleans, dates
  and timestamps print as Spark prints them (``1.0``, ``1.0E10``,
  ``2024-01-31 12:00:00.5``).
- **Strings** (other values are cast to string as above): ``upper``/``ucase``,
  ``lower``/``lcase``, ``length``/``char_length`` (characters, ``int``),
  ``trim``/``ltrim``/``rtrim`` (spaces; ``trim(BOTH|LEADING|TRAILING 'chars'
  FROM s)``), ``substring``/``substr(s, pos[, len])`` (1-based, a negative
  ``pos`` counts from the end; literal ``pos`` and ``len``), ``concat`` and
  ``||`` (null if any argument is), ``concat_ws(sep, ...)`` (skips nulls),
  ``replace(s, search[, replacement])``, ``regexp_replace(s, regex,
  replacement)`` (``$1`` refers to a group), ``split(s, regex[, limit])``
  (an ``array<string>``, trailing empty strings kept), ``startswith``,
  ``endswith``, ``contains``. Patterns, separators and replacements are
  literals.
- **Arrays**: ``element_at(array, i)`` (1-based, a negative ``i`` counts from
  the end), ``size``/``cardinality``/``array_size`` (``int``).
- **Math**: ``abs``, ``round(x[, d])`` (half away from zero, as Spark's
  HALF_UP, on the number's shortest decimal form: ``round(1.005, 2)`` is
  ``1.01``), ``floor``/``ceil``/``ceiling`` (``bigint``), ``sqrt``,
  ``pow``/``power`` (``double``), ``greatest``/``least`` (nulls skipped).
- **Time** (in UTC, Spark's session time zone in barrierflow):
  ``timestamp_seconds`` (integer or fractional), ``timestamp_millis``,
  ``timestamp_micros``, ``unix_seconds``, ``unix_millis``, ``unix_micros``,
  ``to_date(x)``, ``year``, ``month``, ``day``/``dayofmonth``, ``hour``,
  ``minute``, ``second`` (``int``).

Not accepted: non-deterministic functions (``current_date``,
``current_timestamp``, ``now``, ``rand``, ``uuid``,
``monotonically_increasing_id``...): a replayed epoch must compute the same
rows. In ``select``, a computed expression needs a name (``"amount * 100 AS
cents"``).

Errors at run time. As Spark 4 in its default ANSI mode, an integer
overflow (``+ - * abs``, a cast out of range), a division or remainder by
zero (``/``, ``%``, ``div``; a null dividend or divisor gives null), an
``element_at`` index out of the array's bounds and a string no cast can read
fail the epoch with a :class:`~barrierflow.core.errors.UserFunctionError`
naming the operator and the expression; a retry replays the same records,
so change the expression (``CASE WHEN d <> 0 THEN n / d END``) and run again.
Floating-point results never fail (``sqrt(-1)`` is NaN, ``pow(0, -1)``
infinity).

Differences from Spark: regular expressions are RE2's (Java's without
lookaround, backreferences and possessive quantifiers; a pattern RE2 cannot
compile is refused at declaration); decimals (columns and literals with a
point) compute as ``double``; string functions read strings as ``string``
(not ``varchar``), and ``upper``/``lower`` map one character to one
character.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeGuard

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from barrierflow.core.errors import PipelineDefinitionError, UserFunctionError

__all__ = [
    "Expression", "Compiled", "SUPPORTED", "check_expression", "compile_expression", "declared_name", "is_column",
    "is_star",
]  # fmt: skip

# A Spark SQL expression string.
Expression = str

SUPPORTED = (
    "column names; literals (numbers, 'strings', true/false, null, date'...', timestamp'...'); + - * / % div; "
    "= <> < <= > >= <=>; AND OR NOT; IS [NOT] NULL|TRUE|FALSE; [NOT] IN (...); [NOT] BETWEEN; [NOT] LIKE, ILIKE, RLIKE; "
    "CASE WHEN; if; coalesce/nvl/ifnull; nullif; isnull; isnotnull; cast to string, tinyint, smallint, int, bigint, "
    "float, double, boolean, date, timestamp; upper, lower, length, trim, ltrim, rtrim, substring/substr, concat, ||, "
    "concat_ws, replace, regexp_replace, split, startswith, endswith, contains; element_at, size; abs, round, floor, "
    "ceil, sqrt, pow/power, greatest, least; timestamp_seconds, timestamp_millis, timestamp_micros, unix_seconds, "
    "unix_millis, unix_micros, to_date, year, month, day, hour, minute, second"
)

# The ones a replay could not repeat.
_NON_DETERMINISTIC_CLASSES: tuple[type[exp.Expression], ...] = tuple(
    getattr(exp, name)
    for name in (
        "CurrentDate", "CurrentTimestamp", "CurrentTime", "CurrentDatetime", "CurrentTimestampLTZ", "Localtimestamp",
        "Localtime", "CurrentTimezone", "CurrentUser", "SessionUser", "CurrentSchema", "CurrentCatalog", "Rand", "Randn",
        "Uuid", "Shuffle",
    )
    if hasattr(exp, name)
)  # fmt: skip
_NON_DETERMINISTIC_NAMES = frozenset(
    "now current_date current_timestamp localtimestamp current_timezone current_user user session_user rand random randn "
    "uniform randstr uuid shuffle monotonically_increasing_id spark_partition_id input_file_name input_file_block_start "
    "input_file_block_length unix_timestamp".split()
)

_SESSION_ZONE = "UTC"  # barrierflow's Spark session time zone: all event time is UTC
_TIMESTAMP = pa.timestamp("us", tz=_SESSION_ZONE)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class _Failure(Exception):
    """A value no record may have (overflow, division by zero...): the epoch fails."""


def is_column(value: Any) -> TypeGuard[Any]:
    """Whether ``value`` is a ``pyspark.sql.Column`` (classic or Connect), without importing PySpark."""
    kind = type(value)
    return kind.__name__ == "Column" and kind.__module__.startswith("pyspark.sql")


# -- declaration -----------------------------------------------------------------------------------


def check_expression(operator_id: str, value: Any) -> None:
    """Refuse, when the pipeline is declared, an expression barrierflow cannot evaluate (naming the operator and why)."""
    if is_column(value):
        raise PipelineDefinitionError(
            f"{operator_id}: a pyspark.sql.Column has no Arrow form, so barrierflow cannot evaluate it; give the "
            "expression as a SQL string instead (F.col('amount') > 0 is \"amount > 0\", "
            "F.upper('k').alias('key') is \"upper(k) AS key\")"
        )
    if not isinstance(value, str) or not value.strip():
        raise PipelineDefinitionError(
            f'{operator_id}: {value!r} is not a column expression; give a SQL expression string (e.g. "amount > 0")'
        )
    tree = _parse(operator_id, value)
    if isinstance(tree, exp.Star):
        return
    _Validator(operator_id, value).check(tree.this if isinstance(tree, exp.Alias) else tree)


def is_star(text: str) -> bool:
    """Whether the expression is ``*`` (every user column, in ``select``)."""
    return text.strip() == "*"


def declared_name(operator_id: str, text: str) -> tuple[str | None, str | None]:
    """The output name the expression declares (its alias, or the column it is), and the column it is (None: computed)."""
    tree = _parse(operator_id, text)
    inner = _unparen(tree.this if isinstance(tree, exp.Alias) else tree)
    source = inner.name if isinstance(inner, exp.Column) and isinstance(inner.this, exp.Identifier) else None
    return (tree.alias if isinstance(tree, exp.Alias) else source), source


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> exp.Expression | str:
    try:
        tree = sqlglot.parse_one(text, dialect="spark")
    except SqlglotError as exc:
        return str(exc).replace("\x1b[4m", "").replace("\x1b[0m", "")
    return tree if isinstance(tree, exp.Expression) else f"{type(tree).__name__} is not an expression"


def _parse(operator_id: str, text: str) -> exp.Expression:
    tree = _parsed(text)
    if isinstance(tree, str):
        raise PipelineDefinitionError(f"{operator_id}: {text!r} is not a SQL expression: {tree}")
    if isinstance(tree, (exp.Query, exp.Command)):
        raise PipelineDefinitionError(f"{operator_id}: {text!r} is a statement, not a column expression")
    return tree


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


@dataclass(frozen=True)
class _Rule:
    """A construct barrierflow evaluates: how sqlglot holds its operands, and what must be literal."""

    kind: str  # the compiler's method: _c_<kind>
    name: str  # as users write it
    keys: tuple[str, ...] = ("this",)  # sqlglot's arguments holding the operands, in order ("*x": a list)
    arity: tuple[int, int] = (1, 1)
    literals: Mapping[int, str] | None = None  # operand position -> string | integer | regex | split | like | replacement
    flags: tuple[str, ...] = ()  # sqlglot's arguments that do not change Spark's meaning (or that the compiler reads)


_BINARY = ("this", "expression")
_MANY = 1 << 30
_RULES: dict[type[exp.Expression], _Rule] = {
    exp.Add: _Rule("arith", "+", _BINARY, (2, 2)),
    exp.Sub: _Rule("arith", "-", _BINARY, (2, 2)),
    exp.Mul: _Rule("arith", "*", _BINARY, (2, 2)),
    exp.Div: _Rule("divide", "/", _BINARY, (2, 2), flags=("typed", "safe")),
    exp.Mod: _Rule("mod", "%", _BINARY, (2, 2), flags=("safe",)),
    exp.IntDiv: _Rule("int_divide", "div", _BINARY, (2, 2)),
    exp.Neg: _Rule("negate", "unary -"),
    exp.EQ: _Rule("compare", "=", _BINARY, (2, 2)),
    exp.NEQ: _Rule("compare", "<>", _BINARY, (2, 2)),
    exp.GT: _Rule("compare", ">", _BINARY, (2, 2)),
    exp.GTE: _Rule("compare", ">=", _BINARY, (2, 2)),
    exp.LT: _Rule("compare", "<", _BINARY, (2, 2)),
    exp.LTE: _Rule("compare", "<=", _BINARY, (2, 2)),
    exp.NullSafeEQ: _Rule("null_safe_equal", "<=>", _BINARY, (2, 2)),
    exp.And: _Rule("and_", "AND", _BINARY, (2, 2)),
    exp.Or: _Rule("or_", "OR", _BINARY, (2, 2)),
    exp.Not: _Rule("not_", "NOT"),
    exp.Is: _Rule("is_", "IS", _BINARY, (2, 2)),
    exp.In: _Rule("in_", "IN", ("this", "*expressions"), (2, _MANY)),
    exp.Between: _Rule("between", "BETWEEN", ("this", "low", "high"), (3, 3)),
    exp.Like: _Rule("like", "LIKE", _BINARY, (2, 2), {1: "like"}, flags=("negate",)),
    exp.ILike: _Rule("like", "ILIKE", _BINARY, (2, 2), {1: "like"}, flags=("negate",)),
    exp.Escape: _Rule("escape", "ESCAPE", _BINARY, (2, 2), {1: "string"}),
    exp.RegexpLike: _Rule("rlike", "RLIKE", _BINARY, (2, 2), {1: "regex"}),
    exp.Case: _Rule("case", "CASE", ("this", "*ifs", "default"), (0, _MANY)),
    exp.If: _Rule("if_", "if", ("this", "true", "false"), (3, 3)),
    exp.Coalesce: _Rule("coalesce", "coalesce", ("this", "*expressions"), (1, _MANY), flags=("is_nvl", "is_null")),
    exp.Nullif: _Rule("nullif", "nullif", _BINARY, (2, 2)),
    exp.Cast: _Rule("cast", "cast", flags=("to", "safe", "format")),
    exp.TryCast: _Rule("cast", "cast", flags=("to", "safe", "format")),
    exp.Upper: _Rule("upper", "upper"),
    exp.Lower: _Rule("lower", "lower"),
    exp.Length: _Rule("length", "length"),
    exp.Trim: _Rule("trim", "trim", ("this", "expression"), (1, 2), flags=("position",)),
    exp.Substring: _Rule("substring", "substring", ("this", "start", "length"), (2, 3), {1: "integer", 2: "integer"}, ("zero_start",)),
    exp.Concat: _Rule("concat", "concat", ("*expressions",), (1, _MANY), flags=("safe", "coalesce")),
    exp.DPipe: _Rule("concat", "||", _BINARY, (2, 2), flags=("safe",)),
    exp.ConcatWs: _Rule("concat_ws", "concat_ws", ("*expressions",), (1, _MANY), {0: "string"}, ("safe", "coalesce", "flatten")),
    exp.Replace: _Rule("replace", "replace", ("this", "expression", "replacement"), (2, 3), {1: "string", 2: "string"}),
    exp.RegexpReplace: _Rule("regexp_replace", "regexp_replace", ("this", "expression", "replacement"), (3, 3), {1: "regex", 2: "replacement"}),
    exp.RegexpSplit: _Rule("split", "split", ("this", "expression", "limit"), (2, 3), {1: "split", 2: "integer"}),
    exp.StartsWith: _Rule("affix", "startswith", _BINARY, (2, 2), {1: "string"}),
    exp.EndsWith: _Rule("affix", "endswith", _BINARY, (2, 2), {1: "string"}),
    exp.Contains: _Rule("affix", "contains", _BINARY, (2, 2), {1: "string"}),
    exp.Bracket: _Rule("element_at", "element_at", ("this", "*expressions"), (2, 2), flags=("offset", "safe")),
    exp.ArraySize: _Rule("size", "size"),
    exp.Abs: _Rule("abs", "abs"),
    exp.Round: _Rule("round", "round", ("this", "decimals"), (1, 2), {1: "integer"}),
    exp.Floor: _Rule("floor_ceil", "floor", flags=("decimals", "to")),
    exp.Ceil: _Rule("floor_ceil", "ceil", flags=("decimals", "to")),
    exp.Sqrt: _Rule("sqrt", "sqrt"),
    exp.Pow: _Rule("pow", "pow", _BINARY, (2, 2)),
    exp.Greatest: _Rule("extreme", "greatest", ("this", "*expressions"), (2, _MANY), flags=("ignore_nulls",)),
    exp.Least: _Rule("extreme", "least", ("this", "*expressions"), (2, _MANY), flags=("ignore_nulls",)),
    exp.Year: _Rule("date_part", "year"),
    exp.Month: _Rule("date_part", "month"),
    exp.Day: _Rule("date_part", "day"),
    exp.DayOfMonth: _Rule("date_part", "dayofmonth"),
    exp.Hour: _Rule("time_part", "hour"),
    exp.Minute: _Rule("time_part", "minute"),
    exp.Second: _Rule("time_part", "second"),
    exp.TsOrDsToDate: _Rule("to_date", "to_date", flags=("safe", "format")),
    exp.UnixSeconds: _Rule("unix_time", "unix_seconds"),
    exp.UnixMillis: _Rule("unix_time", "unix_millis"),
    exp.UnixMicros: _Rule("unix_time", "unix_micros"),
    exp.Negative: _Rule("negate", "negative"),
}  # fmt: skip
# Functions sqlglot leaves as they are written (exp.Anonymous), by lower-case name.
_ANONYMOUS: dict[str, _Rule] = {
    "timestamp_seconds": _Rule("from_epoch", "timestamp_seconds", ("*expressions",)),
    "timestamp_millis": _Rule("from_epoch", "timestamp_millis", ("*expressions",)),
    "timestamp_micros": _Rule("from_epoch", "timestamp_micros", ("*expressions",)),
    "isnull": _Rule("isnull", "isnull", ("*expressions",)),
    "isnotnull": _Rule("isnull", "isnotnull", ("*expressions",)),
    "regexp": _Rule("rlike", "regexp", ("*expressions",), (2, 2), {1: "regex"}),
    "cardinality": _Rule("size", "cardinality", ("*expressions",)),
}
_CAST_TARGETS: dict[Any, pa.DataType] = {
    exp.DataType.Type.TEXT: pa.string(),
    exp.DataType.Type.VARCHAR: pa.string(),
    exp.DataType.Type.CHAR: pa.string(),
    exp.DataType.Type.TINYINT: pa.int8(),
    exp.DataType.Type.SMALLINT: pa.int16(),
    exp.DataType.Type.INT: pa.int32(),
    exp.DataType.Type.BIGINT: pa.int64(),
    exp.DataType.Type.FLOAT: pa.float32(),
    exp.DataType.Type.DOUBLE: pa.float64(),
    exp.DataType.Type.BOOLEAN: pa.bool_(),
    exp.DataType.Type.DATE: pa.date32(),
    exp.DataType.Type.TIMESTAMP: _TIMESTAMP,
    exp.DataType.Type.TIMESTAMPLTZ: _TIMESTAMP,
    exp.DataType.Type.TIMESTAMPTZ: _TIMESTAMP,
}


def _rule(node: exp.Expression) -> _Rule | None:
    if isinstance(node, exp.Anonymous):
        rule = _ANONYMOUS.get(str(node.name).lower())
        return None if rule is None else _Rule(rule.kind, rule.name, rule.keys, rule.arity, rule.literals, (*rule.flags, "this"))
    return _RULES.get(type(node))


def _operands(rule: _Rule, node: exp.Expression) -> list[exp.Expression]:
    """The node's operands, in the order Spark's function takes them (trailing absent ones left out)."""
    out: list[exp.Expression | None] = []
    for key in rule.keys:
        if key.startswith("*"):
            out.extend(node.args.get(key[1:]) or [])
        else:
            out.append(node.args.get(key))
    while out and out[-1] is None:
        out.pop()
    return [o for o in out if o is not None]


def _integer_literal(node: exp.Expression | None) -> int | None:
    """The value of an integer literal (``3``, ``-3``, ``(3)``), else None."""
    if node is None:
        return None
    node = _unparen(node)
    sign = 1
    if isinstance(node, exp.Neg):
        sign, node = -1, _unparen(node.this)
    if isinstance(node, exp.Literal) and not node.is_string and re.fullmatch(r"[0-9]+", str(node.this)):
        return sign * int(str(node.this))
    return None


def _string_literal(node: exp.Expression | None) -> str | None:
    if node is None:
        return None
    node = _unparen(node)
    if isinstance(node, exp.Literal) and node.is_string:
        return str(node.this)
    return None


def _sql(node: exp.Expression) -> str:
    """A (sub)expression as SQL, for messages."""
    return node.sql(dialect="spark", normalize_functions="lower")


def _name(node: exp.Expression) -> str:
    """How users write the construct, for messages."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        written = re.match(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", _sql(node))  # as Spark spells it (date_format, not time_to_str)
        return (written.group(1) if written else node.sql_name()).lower()
    return type(node).__name__


class _Validator:
    """Walks a parsed expression at declaration: every construct supported, the literals it needs literal."""

    def __init__(self, operator_id: str, text: str) -> None:
        self.operator_id, self.text = operator_id, text

    def refuse(self, what: str, hint: str = "") -> PipelineDefinitionError:
        return PipelineDefinitionError(
            f"{self.operator_id}: {what} in {self.text!r} is not supported{'; ' + hint if hint else ''}. "
            f"barrierflow evaluates these SQL expressions: {SUPPORTED}"
        )

    def check(self, node: exp.Expression) -> None:
        node = _unparen(node)
        if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
            self._check_literal(node)
            return
        if isinstance(node, exp.Column):
            if not isinstance(node.this, exp.Identifier) or node.args.get("table") is not None:
                raise self.refuse(f"{_sql(node)!r}", "name a top-level column (no qualifier, no nested field)")
            return
        self._refuse_non_deterministic(node)
        rule = _rule(node)
        if rule is None:
            raise self._unsupported(node)
        for key, value in node.args.items():
            if key not in {k.lstrip("*") for k in rule.keys} and key not in rule.flags and value not in (None, False, [], ""):
                raise self.refuse(f"{rule.name} with {key} {_sql(value) if isinstance(value, exp.Expression) else value!r}")
        operands = _operands(rule, node)
        if not rule.arity[0] <= len(operands) <= rule.arity[1]:
            count = rule.arity[0] if rule.arity[0] == rule.arity[1] else f"{rule.arity[0]} or more"
            raise self.refuse(f"{rule.name} with {len(operands)} argument(s)", f"it takes {count}")
        getattr(self, f"_v_{rule.kind}", lambda n, r, o: None)(node, rule, operands)
        if isinstance(node, exp.Escape):  # the LIKE's pattern was checked with its escape character
            self.check(operands[0].this)
            return
        for position, operand in enumerate(operands):
            kind = (rule.literals or {}).get(position)
            if kind is not None:
                self._check_literal_operand(rule, position, operand, kind)
            if isinstance(node, exp.Case) and isinstance(operand, exp.If):
                self.check(operand.this)
                self.check(operand.args["true"])
            else:
                self.check(operand)

    def _unsupported(self, node: exp.Expression) -> PipelineDefinitionError:
        if isinstance(node, exp.AggFunc):
            return self.refuse(f"aggregate function {_name(node)}", "aggregate with key_by(...).aggregate(...) or a window")
        if isinstance(node, exp.Window):
            return self.refuse("a window function (OVER)")
        if isinstance(node, (exp.Subquery, exp.Query, exp.Exists)):
            return self.refuse("a subquery")
        if isinstance(node, exp.Alias):
            return self.refuse("an alias (AS) inside an expression", "name the whole expression only")
        if isinstance(node, exp.Star):
            return self.refuse("*", "* stands alone, in select")
        if isinstance(node, exp.Func):
            return self.refuse(f"function {_name(node)}")
        return self.refuse(f"{_sql(node)!r} ({type(node).__name__})")

    def _refuse_non_deterministic(self, node: exp.Expression) -> None:
        name = _name(node)
        if isinstance(node, _NON_DETERMINISTIC_CLASSES) or (isinstance(node, exp.Anonymous) and name in _NON_DETERMINISTIC_NAMES):
            raise PipelineDefinitionError(
                f"{self.operator_id}: {name} in {self.text!r} is non-deterministic and not supported: a replayed epoch "
                "must compute the same records (take the time from a column, e.g. an event time, or from the "
                "records' source)"
            )
        if isinstance(node, exp.StrToUnix) and isinstance(node.this, exp.CurrentTimestamp):
            raise PipelineDefinitionError(
                f"{self.operator_id}: unix_timestamp() in {self.text!r} is non-deterministic and not supported: a "
                "replayed epoch must compute the same records"
            )

    def _check_literal(self, node: exp.Expression) -> None:
        if isinstance(node, exp.Literal) and not node.is_string:
            _number(self.operator_id, self.text, str(node.this))

    def _check_literal_operand(self, rule: _Rule, position: int, operand: exp.Expression, kind: str) -> None:
        what = f"argument {position + 1} of {rule.name}"
        if kind == "integer":
            if _integer_literal(operand) is None:
                raise self.refuse(f"{what} as {_sql(operand)!r}", "give an integer literal")
            return
        value = _string_literal(operand)
        if value is None:
            raise self.refuse(f"{what} as {_sql(operand)!r}", "give a string literal")
        try:
            if kind in ("regex", "split"):
                _check_regex(value, empty=kind == "regex")
            elif kind == "like":
                _like_pattern(value, "\\")
            elif kind == "replacement":
                _re2_replacement(value)
        except ValueError as exc:
            raise PipelineDefinitionError(f"{self.operator_id}: {what} in {self.text!r}: {exc}") from None

    # Structural checks of single constructs (the literals are checked after).

    def _v_is_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        if not isinstance(operands[1], (exp.Null, exp.Boolean)):
            raise self.refuse(f"IS {_sql(operands[1])}", "IS takes NULL, TRUE or FALSE")

    def _v_escape(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        escape = _string_literal(operands[1])
        if not isinstance(operands[0], (exp.Like, exp.ILike)) or escape is None or len(escape) != 1:
            raise self.refuse("ESCAPE", "write x LIKE 'pattern' ESCAPE 'c' with one character")
        try:
            _like_pattern(_string_literal(operands[0].expression) or "", escape)
        except ValueError as exc:
            raise PipelineDefinitionError(f"{self.operator_id}: the LIKE pattern in {self.text!r}: {exc}") from None

    def _v_cast(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        if node.args.get("safe"):
            raise self.refuse("try_cast", "cast fails on a value the type cannot hold, as Spark's ANSI cast")
        if node.args.get("format") is not None:
            raise self.refuse("cast with a format")
        to = node.args.get("to")
        if not isinstance(to, exp.DataType) or to.this not in _CAST_TARGETS:
            target = _sql(to) if isinstance(to, exp.Expression) else to
            raise self.refuse(
                f"cast to {target}", "cast to string, tinyint, smallint, int, bigint, float, double, boolean, date or timestamp"
            )

    def _v_trim(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        if node.args.get("collation") is not None:
            raise self.refuse("trim with a collation")
        if len(operands) == 2 and (_string_literal(node.this) is not None or _string_literal(node.expression) is None):
            raise self.refuse(
                f"{_sql(node)!r}", "write trim(s), or TRIM(BOTH|LEADING|TRAILING 'chars' FROM s) with literal chars"
            )

    def _v_element_at(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        if node.args.get("offset") != 1:
            raise self.refuse("array[index]", "write element_at(array, position), 1-based")
        if node.args.get("safe"):
            raise self.refuse("try_element_at", "element_at fails on a position out of bounds, as Spark's ANSI mode")
        if _integer_literal(operands[1]) == 0:
            raise PipelineDefinitionError(f"{self.operator_id}: element_at position 0 in {self.text!r}: SQL arrays start at 1")

    def _v_to_date(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        if node.args.get("format") is not None:
            raise self.refuse("to_date with a format", "cast the string first if it is yyyy-MM-dd")

    def _v_floor_ceil(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        for key in ("decimals", "to"):
            if node.args.get(key) is not None:
                raise self.refuse(f"{rule.name} with a scale")

    def _v_in_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> None:
        for key in ("query", "unnest", "field"):
            if node.args.get(key) is not None:
                raise self.refuse("IN with a subquery or array", "list the values: x IN (1, 2, 3)")


def _number(operator_id: str, text: str, literal: str) -> tuple[Any, pa.DataType]:
    """A numeric literal's value and type: int if it fits, else bigint; double with a point or exponent."""
    if re.fullmatch(r"[0-9]+", literal):
        value = int(literal)
        if value <= 2**31 - 1:
            return value, pa.int32()
        if value <= _INT64_MAX:
            return value, pa.int64()
        raise PipelineDefinitionError(f"{operator_id}: the number {literal} in {text!r} does not fit a bigint")
    try:
        return float(literal), pa.float64()
    except ValueError:
        raise PipelineDefinitionError(f"{operator_id}: {literal!r} in {text!r} is not a number") from None


def _check_regex(pattern: str, *, empty: bool) -> None:
    """Refuse a pattern RE2 cannot compile (and, for split, one that matches the empty string)."""
    try:
        matches_empty = pc.match_substring_regex(pa.array([""]), pattern)[0].as_py()
    except pa.ArrowInvalid as exc:
        raise ValueError(f"regular expression {pattern!r} is not one RE2 compiles ({exc}); barrierflow uses RE2 syntax") from None
    if not empty and matches_empty:
        raise ValueError(f"split by {pattern!r}, which matches the empty string, is not supported")


def _like_pattern(pattern: str, escape: str) -> str:
    """A LIKE pattern as Arrow's ``match_like`` reads it (backslash escapes), refusing what Spark refuses."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape:
            if i + 1 == len(pattern):
                raise ValueError(f"the LIKE pattern {pattern!r} ends with the escape character {escape!r}")
            following = pattern[i + 1]
            if following not in ("_", "%", escape):
                raise ValueError(f"the escape character {escape!r} is not allowed to precede {following!r} in {pattern!r}")
            out.append("\\" + following)
            i += 2
            continue
        out.append("\\\\" if c == "\\" else c)
        i += 1
    return "".join(out)


def _re2_replacement(java: str) -> str:
    """A Java replacement string (``$1`` a group, ``\\`` escapes) as RE2's rewrite (``\\1``)."""
    out, i = [], 0
    while i < len(java):
        c = java[i]
        if c == "\\":
            if i + 1 == len(java):
                raise ValueError(f"the replacement {java!r} ends with a backslash")
            following = java[i + 1]
            out.append("\\\\" if following == "\\" else following)
            i += 2
        elif c == "$":
            group = java[i + 1 : i + 2]
            if not group.isdigit() or java[i + 2 : i + 3].isdigit():
                raise ValueError(
                    f"in the replacement {java!r}, $ must be followed by one group number (0-9); write \\$ for a dollar sign"
                )
            out.append("\\" + group)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


# -- types ------------------------------------------------------------------------------------------


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _is_datetime(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t))


def _is_null(t: pa.DataType) -> bool:
    return bool(pa.types.is_null(t))


_NUMERIC_ORDER = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64())


def _numeric_rank(t: pa.DataType) -> int:
    if pa.types.is_decimal(t) or t == pa.float64():
        return 5
    if pa.types.is_floating(t):
        return 4
    width = t.bit_width + (0 if pa.types.is_signed_integer(t) else 8)  # unsigned: the next signed width
    return min(3, {8: 0, 16: 1, 24: 1, 32: 2, 40: 2}.get(width, 3))


def _wider(*types: pa.DataType) -> pa.DataType:
    """The type Spark computes numbers of these types in (decimals: as double)."""
    return (
        _NUMERIC_ORDER[max(_numeric_rank(t) for t in types if not _is_null(t))]
        if any(not _is_null(t) for t in types)
        else pa.null()
    )


def _common_type(types: Sequence[pa.DataType]) -> pa.DataType | None:
    """The type values of ``types`` meet in (a comparison, CASE branches...), None if Spark has none."""
    known = [t for t in types if not _is_null(t)]
    if not known:
        return pa.null()
    if all(t == known[0] for t in known):
        return known[0]
    if all(_is_numeric(t) for t in known):
        return _wider(*known)
    if all(_is_string(t) for t in known):
        return pa.string()
    if all(_is_datetime(t) for t in known):
        stamps = [t for t in known if pa.types.is_timestamp(t)]
        if not stamps:
            return pa.date32()
        return pa.timestamp("us", tz=_SESSION_ZONE if any(t.tz for t in stamps) or len(stamps) < len(known) else None)
    return None


def spark_type_name(t: pa.DataType) -> str:
    """An Arrow type as Spark names it, for messages."""
    names = {
        pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint", pa.float32(): "float",
        pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string", pa.large_string(): "string",
        pa.date32(): "date", pa.null(): "void", pa.binary(): "binary",
    }  # fmt: skip
    if t in names:
        return names[t]
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if _is_list(t):
        return f"array<{spark_type_name(t.value_type)}>"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    return str(t)


# -- evaluation ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows:
    """The rows an expression is evaluated on (possibly a subset: the records a CASE branch takes)."""

    table: pa.Table
    n: int

    def column(self, name: str) -> pa.Array:
        values = self.table.column(name).combine_chunks()
        return values.dictionary_decode() if pa.types.is_dictionary(values.type) else values

    def take(self, indices: np.ndarray) -> "_Rows":
        if len(indices) == self.n:  # ascending and distinct: all of them
            return self
        return _Rows(self.table.take(pa.array(indices, pa.int64())), len(indices))


_NO_CONSTANT = object()


@dataclass(frozen=True)
class _Value:
    """A compiled (sub)expression: its type, and how its values are computed for some rows."""

    type: pa.DataType
    run: Callable[[_Rows], pa.Array]
    sql: str
    fallible: bool = False  # whether computing it may fail (then only the records that reach it compute it)
    constant: Any = _NO_CONSTANT  # a literal's value


def _mask(values: pa.Array) -> np.ndarray:
    """Where a boolean array is true (null: not)."""
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _valid(values: pa.Array) -> np.ndarray:
    return np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _scatter(n: int, type_: pa.DataType, pieces: Sequence[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """One array of ``n`` values from pieces computed for some of the rows (each: row indices, values); null elsewhere."""
    index = np.full(n, -1, dtype=np.int64)
    arrays, offset = [], 0
    for rows, values in pieces:
        if len(rows):
            index[rows] = offset + np.arange(len(rows))
            arrays.append(values.cast(type_))
            offset += len(rows)
    if not arrays:
        return pa.nulls(n, type_)
    arrays.append(pa.nulls(1, type_))
    index[index < 0] = offset
    return pa.concat_arrays(arrays).take(pa.array(index))


def _evaluate_on(value: _Value, rows: _Rows, indices: np.ndarray, type_: pa.DataType) -> pa.Array:
    """``value`` for the rows at ``indices`` only (null elsewhere), in ``type_``."""
    if len(indices) == rows.n:
        return value.run(rows).cast(type_)
    return _scatter(rows.n, type_, [(indices, value.run(rows.take(indices)))])


def _with_nulls_of(result: pa.Array, *inputs: pa.Array) -> pa.Array:
    """``result`` null wherever an input is null."""
    valid = np.ones(len(result), dtype=bool)
    for values in inputs:
        valid &= _valid(values)
    if valid.all():
        return result
    return pc.if_else(pa.array(valid), result, pa.nulls(len(result), result.type))


def _fail_where(failing: np.ndarray, message: str) -> None:
    if failing.any():
        raise _Failure(f"{message} ({int(failing.sum())} record(s))")


def _to_numpy(values: pa.Array, fill: Any, dtype: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(values, fill).to_numpy(zero_copy_only=False), dtype=dtype)


# -- casts ------------------------------------------------------------------------------------------


def _float_strings(values: pa.Array) -> pa.Array:
    """Floating-point numbers as Java (hence Spark) prints them: ``1.0``, ``0.001``, ``1.0E7``, ``1.5E-4``, ``NaN``."""
    n = len(values)
    x = _to_numpy(values, 0, np.float64)
    valid = _valid(values)
    pieces: list[tuple[np.ndarray, pa.Array]] = []
    for mask, text in (
        (np.isnan(x), "NaN"), (np.isposinf(x), "Infinity"), (np.isneginf(x), "-Infinity"),
        ((x == 0) & ~np.signbit(x), "0.0"), ((x == 0) & np.signbit(x), "-0.0"),
    ):  # fmt: skip
        rows = np.flatnonzero(mask & valid)
        pieces.append((rows, pa.repeat(pa.scalar(text), len(rows))))
    finite = np.flatnonzero(valid & np.isfinite(x) & (x != 0))
    if len(finite):
        # Arrow's shortest round-trip digits (as Java's), rearranged in Java's layout.
        shortest = pc.cast(pc.abs(values.take(pa.array(finite))), pa.string())
        parts = pc.extract_regex(shortest, r"^(?P<i>[0-9]+)(?:\.(?P<f>[0-9]*))?(?:e(?P<e>[-+]?[0-9]+))?$")
        integer, fraction, exponent = (parts.field(k) for k in ("i", "f", "e"))
        every = pc.binary_join_element_wise(integer, fraction, "")
        lead = pc.subtract(pc.utf8_length(every), pc.utf8_length(pc.utf8_ltrim(every, "0"))).to_numpy().astype(np.int64)
        digits = pc.utf8_rtrim(pc.utf8_ltrim(every, "0"), "0")
        shift = _to_numpy(pc.cast(pc.if_else(pc.equal(exponent, ""), "0", pc.utf8_ltrim(exponent, "+")), pa.int64()), 0, np.int64)
        power = pc.utf8_length(integer).to_numpy().astype(np.int64) - 1 - lead + shift
        negative = x[finite] < 0
        for e in np.unique(power):
            group = np.flatnonzero(power == e)
            d = digits.take(pa.array(group))
            if -3 <= e < 7:
                if e >= 0:
                    whole = pc.utf8_rpad(pc.utf8_slice_codeunits(d, 0, int(e) + 1), int(e) + 1, "0")
                    rest = pc.utf8_slice_codeunits(d, int(e) + 1, 1 << 30)
                    text = pc.binary_join_element_wise(whole, pc.if_else(pc.equal(rest, ""), "0", rest), ".")
                else:
                    text = pc.binary_join_element_wise("0." + "0" * int(-e - 1), d, "")
            else:
                rest = pc.utf8_slice_codeunits(d, 1, 1 << 30)
                rest = pc.if_else(pc.equal(rest, ""), "0", rest)
                text = pc.binary_join_element_wise(pc.utf8_slice_codeunits(d, 0, 1), ".", rest, f"E{int(e)}", "")
            signed = pc.if_else(pa.array(negative[group]), pc.binary_join_element_wise("-", text, ""), text)
            pieces.append((finite[group], signed))
    return _scatter(n, pa.string(), pieces)


def _timestamp_strings(values: pa.Array) -> pa.Array:
    """Timestamps as Spark prints them in UTC: ``2024-01-31 12:00:00``, the fraction without trailing zeros."""
    t = values.type
    stamps = values.cast(pa.timestamp("us", tz=_SESSION_ZONE if t.tz else None), safe=False)
    text = pc.strftime(stamps, format="%Y-%m-%d %H:%M:%S")
    return pc.replace_substring_regex(text, r"\.?0+$", "")


def _to_string(values: pa.Array) -> pa.Array:
    t = values.type
    if _is_string(t) or _is_null(t):
        return values.cast(pa.string())
    if pa.types.is_floating(t):
        return _float_strings(values)
    if pa.types.is_timestamp(t):
        return _timestamp_strings(values)
    return values.cast(pa.string())  # integers, booleans, decimals, dates: as Spark prints them


def _string_to_timestamp(values: pa.Array, target: pa.DataType) -> pa.Array:
    text = pc.utf8_trim_whitespace(values)
    zoned = _mask(pc.match_substring_regex(text, r"(Z|[+-][0-9]{2}:?[0-9]{2})$"))
    rows = np.arange(len(values))
    pieces = [
        (rows[zoned], text.filter(pa.array(zoned)).cast(pa.timestamp("us", tz=_SESSION_ZONE))),
        (rows[~zoned], text.filter(pa.array(~zoned)).cast(pa.timestamp("us")).cast(pa.timestamp("us", tz=_SESSION_ZONE))),
    ]
    return _scatter(len(values), pa.timestamp("us", tz=_SESSION_ZONE), pieces).cast(target)


_TRUE_STRINGS = pa.array(["t", "true", "y", "yes", "1"])
_FALSE_STRINGS = pa.array(["f", "false", "n", "no", "0"])


def _cast_values(values: pa.Array, target: pa.DataType, sql: str) -> pa.Array:
    """Spark's ANSI cast of ``values`` to ``target`` (the pair checked by :func:`_castable`)."""
    source = values.type
    if source == target:
        return values
    if _is_null(source):
        return pa.nulls(len(values), target)
    try:
        if _is_string(target):
            return _to_string(values)
        if pa.types.is_integer(target):
            if _is_string(source):
                text = pc.replace_substring_regex(pc.utf8_trim_whitespace(values), r"^\+", "")
                return text.cast(target)
            if pa.types.is_floating(source) or pa.types.is_decimal(source):
                x = values.cast(pa.float64(), safe=False)
                whole = np.trunc(_to_numpy(x, 0.0, np.float64))
                bounds = np.iinfo(target.to_pandas_dtype())
                _fail_where(
                    ~np.isfinite(whole) | (whole < bounds.min) | (whole >= float(bounds.max) + 1),
                    f"{sql}: a value out of the range of {spark_type_name(target)} (as Spark's ANSI cast)",
                )
                return _with_nulls_of(pa.array(whole).cast(target, safe=False), x)
            return values.cast(target)
        if pa.types.is_floating(target):
            if _is_string(source):
                return pc.utf8_trim_whitespace(values).cast(target)
            return values.cast(target, safe=False)
        if pa.types.is_boolean(target):
            if _is_string(source):
                lowered = pc.utf8_lower(pc.utf8_trim_whitespace(values))
                truth, falsity = pc.is_in(lowered, _TRUE_STRINGS), pc.is_in(lowered, _FALSE_STRINGS)
                bad = _valid(values) & ~_mask(truth) & ~_mask(falsity)
                if bad.any():
                    example = values.filter(pa.array(bad))[0].as_py()
                    raise _Failure(f"{sql}: {example!r} is not a boolean ({int(bad.sum())} record(s))")
                return _with_nulls_of(truth, values)
            return _with_nulls_of(pc.not_equal(values, pa.scalar(0, values.type)), values)
        if pa.types.is_date(target):
            if _is_string(source):
                text = pc.replace_substring_regex(pc.utf8_trim_whitespace(values), r"^([0-9]{4}-[0-9]{2}-[0-9]{2})[ T].*$", r"\1")
                return text.cast(target)
            if pa.types.is_timestamp(source):
                return values.cast(pa.timestamp("us", tz=_SESSION_ZONE) if source.tz else pa.timestamp("us")).cast(target)
            return values.cast(target)
        if pa.types.is_timestamp(target):
            if _is_string(source):
                return _string_to_timestamp(values, target)
            if pa.types.is_date(source):
                return values.cast(pa.timestamp("us")).cast(target)
            # Another unit or zone: the same instant (a zone-less timestamp read in UTC), to the microsecond.
            return values.cast(pa.timestamp(target.unit, tz=source.tz), safe=False).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _Failure(f"{sql}: {exc}") from None
    raise _Failure(f"{sql}: no cast from {spark_type_name(source)} to {spark_type_name(target)}")  # refused at planning


def _cast_may_fail(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether some value of ``source`` has no ``target`` value (a string that is not a number, an overflow)."""
    if source == target or _is_null(source) or _is_string(target):
        return False
    if _is_string(source):
        return True
    if pa.types.is_integer(target):
        return not (
            pa.types.is_boolean(source) or (pa.types.is_integer(source) and _numeric_rank(source) <= _numeric_rank(target))
        )
    return False


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether Spark's ANSI mode casts ``source`` to ``target``."""
    if source == target or _is_null(source) or _is_string(source):
        return True
    if _is_string(target):
        return _is_numeric(source) or _is_datetime(source) or pa.types.is_boolean(source)
    if _is_numeric(target) or pa.types.is_boolean(target):
        return _is_numeric(source) or pa.types.is_boolean(source)
    if _is_datetime(target):
        return _is_datetime(source)
    return False


# -- compilation ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compiled:
    """An expression compiled against an input schema: its type, output name, and how to evaluate it on a table."""

    operator_id: str
    text: str
    type: pa.DataType
    name: str | None  # its alias, or the name of the column it is
    column: str | None  # the input column it is, unchanged (a plain column reference)
    columns: tuple[str, ...]  # the input columns it reads
    value: _Value

    def evaluate(self, table: pa.Table) -> pa.Array | pa.ChunkedArray:
        """Its value for each row of ``table`` (in the schema it was compiled against)."""
        if self.column is not None:
            return table.column(self.column)
        try:
            out = self.value.run(_Rows(table.select(list(self.columns)), table.num_rows))
            return out if out.type == self.type else out.cast(self.type)
        except _Failure as exc:
            raise UserFunctionError(f"{self.operator_id}: expression {self.text!r} failed: {exc}") from None
        except pa.ArrowException as exc:
            raise UserFunctionError(f"{self.operator_id}: expression {self.text!r} failed: {exc}") from None


def compile_expression(operator_id: str, text: str, schema: pa.Schema) -> Compiled:
    """``text`` compiled against rows of ``schema``; a :class:`PipelineDefinitionError` if it cannot run on them."""
    check_expression(operator_id, text)
    tree = _parse(operator_id, text)
    if isinstance(tree, exp.Star):
        raise PipelineDefinitionError(f"{operator_id}: * stands for every column only in select")
    alias = tree.alias if isinstance(tree, exp.Alias) else None
    body = _unparen(tree.this if isinstance(tree, exp.Alias) else tree)
    compiler = _Compiler(operator_id, text, schema)
    if isinstance(body, exp.Column):
        column = compiler.resolve(body.name)
        field = schema.field(column)
        value = _Value(field.type, lambda rows: rows.column(column), _sql(body))
        return Compiled(operator_id, text, field.type, alias or column, column, (column,), value)
    value = compiler.compile(body)
    return Compiled(operator_id, text, value.type, alias, None, tuple(sorted(compiler.read)), value)


class _Compiler:
    """Types a parsed expression against a schema and builds its evaluation (the constructs the validator let through)."""

    def __init__(self, operator_id: str, text: str, schema: pa.Schema) -> None:
        self.operator_id, self.text, self.schema = operator_id, text, schema
        self.read: set[str] = set()

    def error(self, message: str) -> PipelineDefinitionError:
        return PipelineDefinitionError(f"{self.operator_id}: in {self.text!r}, {message}")

    def resolve(self, name: str) -> str:
        """The input column ``name`` refers to, resolved as Spark does (case-insensitively)."""
        users = [n for n in self.schema.names if not n.startswith("_")]
        if name.startswith("_"):
            raise self.error(f"column {name!r} is the engine's (columns starting with _ cannot be read)")
        if name in users:
            return name
        matches = [n for n in users if n.lower() == name.lower()]
        if len(matches) != 1:
            reason = "is ambiguous" if matches else "does not exist"
            raise self.error(f"column {name!r} {reason} (columns: {users})")
        return matches[0]

    def compile(self, node: exp.Expression) -> _Value:
        node = _unparen(node)
        if isinstance(node, exp.Column):
            column = self.resolve(node.name)
            self.read.add(column)
            field_type = self.schema.field(column).type
            if pa.types.is_dictionary(field_type):
                field_type = field_type.value_type
            return _Value(field_type, lambda rows: rows.column(column), _sql(node))
        if isinstance(node, exp.Null):
            return self.constant(None, pa.null(), "NULL")
        if isinstance(node, exp.Boolean):
            return self.constant(bool(node.this), pa.bool_(), _sql(node))
        if isinstance(node, exp.Literal):
            if node.is_string:
                return self.constant(str(node.this), pa.string(), _sql(node))
            number, number_type = _number(self.operator_id, self.text, str(node.this))
            return self.constant(number, number_type, str(node.this))
        rule = _rule(node)
        assert rule is not None, node  # the validator refused it otherwise
        method: Callable[[exp.Expression, _Rule, list[exp.Expression]], _Value] = getattr(self, f"_c_{rule.kind}")
        return method(node, rule, _operands(rule, node))

    # -- helpers

    @staticmethod
    def constant(value: Any, type_: pa.DataType, sql: str) -> _Value:
        scalar = pa.scalar(value, type_)
        return _Value(
            type_, lambda rows: pa.repeat(scalar, rows.n) if value is not None else pa.nulls(rows.n, type_), sql, constant=value
        )

    def coerce(self, value: _Value, target: pa.DataType) -> _Value:
        """``value`` in the type ``target`` it meets others in (a widening, or a string literal read as that type)."""
        if value.type == target:
            return value
        if value.constant is not _NO_CONSTANT and isinstance(value.constant, str) and not _is_string(target):
            try:
                converted = _cast_values(pa.array([value.constant]), target, value.sql)[0]
            except _Failure as exc:
                raise self.error(f"{value.sql} is not a {spark_type_name(target)}: {exc}") from None
            return _Value(target, lambda rows: pa.repeat(converted, rows.n), value.sql, constant=converted.as_py())
        source = value.type

        def run(rows: _Rows) -> pa.Array:
            values = value.run(rows)
            if _is_null(source):
                return pa.nulls(rows.n, target)
            if pa.types.is_floating(target) or pa.types.is_decimal(source):
                return values.cast(target, safe=False)
            if _is_datetime(target):
                return _cast_values(values, target, value.sql)
            return values.cast(target)

        return _Value(target, run, value.sql, value.fallible)

    def meet(self, values: Sequence[_Value], what: str, literals: bool = False) -> tuple[pa.DataType, list[_Value]]:
        """The common type of ``values`` and the values in it; with ``literals``, string literals read as the others' type.

        Spark reads ``x = '5'`` as ``x = 5`` for a number ``x`` (and a
        date or timestamp likewise): comparisons, IN and BETWEEN do.
        """
        target = _common_type([v.type for v in values])
        others = [v.type for v in values if not isinstance(v.constant, str)]
        if literals and len(others) < len(values):
            adapted = _common_type(others)
            if adapted is not None and not _is_null(adapted) and not _is_string(adapted):
                target = adapted
        if target is None:
            kinds = ", ".join(f"{v.sql} ({spark_type_name(v.type)})" for v in values)
            raise self.error(f"{what} of {kinds}: the types do not meet; cast one of them")
        return target, [self.coerce(v, target) for v in values]

    def boolean(self, value: _Value, what: str) -> _Value:
        if not (pa.types.is_boolean(value.type) or _is_null(value.type)):
            raise self.error(f"{what} must be a boolean, not {value.sql} ({spark_type_name(value.type)})")
        return self.coerce(value, pa.bool_())

    def number(self, value: _Value, what: str) -> _Value:
        if not (_is_numeric(value.type) or _is_null(value.type)):
            raise self.error(f"{what} needs a number, not {value.sql} ({spark_type_name(value.type)})")
        return value

    def string(self, value: _Value, what: str) -> _Value:
        """``value`` as a string (numbers, booleans, dates and timestamps cast as Spark casts them)."""
        t = value.type
        if t == pa.string():
            return value
        if not (_is_string(t) or _is_null(t) or _castable(t, pa.string())):
            raise self.error(f"{what} needs a string, not {value.sql} ({spark_type_name(t)})")
        return _Value(pa.string(), lambda rows: _to_string(value.run(rows)), value.sql, value.fallible)

    def to_type(self, value: _Value, target: pa.DataType, what: str) -> _Value:
        """An implicit cast (a timestamp function given a date or string...)."""
        if value.type == target:
            return value
        if not _castable(value.type, target):
            raise self.error(f"{what} needs a {spark_type_name(target)}, not {value.sql} ({spark_type_name(value.type)})")
        return _Value(target, lambda rows: _cast_values(value.run(rows), target, value.sql), value.sql, True)

    @staticmethod
    def derived(
        type_: pa.DataType, run: Callable[[_Rows], pa.Array], node: exp.Expression, *inputs: _Value, fallible: bool = False
    ) -> _Value:
        return _Value(type_, run, _sql(node), fallible or any(i.fallible for i in inputs))

    # -- arithmetic

    def _c_arith(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a, b = (self.number(self.compile(o), rule.name) for o in operands)
        target = _wider(a.type, b.type)
        if _is_null(target):
            return self.derived(pa.null(), lambda rows: pa.nulls(rows.n), node, a, b)
        a, b = self.coerce(a, target), self.coerce(b, target)
        function = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}[rule.name]
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            try:
                return function(a.run(rows), b.run(rows))
            except pa.ArrowInvalid as exc:
                raise _Failure(
                    f"{sql}: integer {exc} (Spark's ANSI arithmetic fails too; cast to bigint or double first)"
                ) from None

        return self.derived(target, run, node, a, b, fallible=pa.types.is_integer(target))

    def _divisor_zero(self, x: pa.Array, y: pa.Array, sql: str) -> None:
        zero = _valid(x) & _valid(y) & (_to_numpy(y, 1, np.float64) == 0)
        _fail_where(zero, f"{sql}: division by zero (as in Spark's ANSI mode; guard it: CASE WHEN d <> 0 THEN n / d END)")

    def _c_divide(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a, b = (self.coerce(self.number(self.compile(o), "/"), pa.float64()) for o in operands)
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            x, y = a.run(rows), b.run(rows)
            self._divisor_zero(x, y, sql)
            return pc.divide(x, y)

        return self.derived(pa.float64(), run, node, a, b, fallible=True)

    def _c_int_divide(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        values = [self.compile(o) for o in operands]
        for v in values:
            if not (pa.types.is_integer(v.type) or _is_null(v.type)):
                raise self.error(f"div needs integers, not {v.sql} ({spark_type_name(v.type)})")
        a, b = (self.coerce(v, pa.int64()) for v in values)
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            x, y = a.run(rows), b.run(rows)
            self._divisor_zero(x, y, sql)
            try:
                return pc.divide_checked(x, pc.if_else(pc.equal(y, 0), 1, y))  # zero divisors are null dividends here
            except pa.ArrowInvalid as exc:
                raise _Failure(f"{sql}: integer {exc}") from None

        return self.derived(pa.int64(), run, node, a, b, fallible=True)

    def _c_mod(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a, b = (self.number(self.compile(o), "%") for o in operands)
        target = _wider(a.type, b.type)
        if _is_null(target):
            return self.derived(pa.null(), lambda rows: pa.nulls(rows.n), node, a, b)
        a, b = self.coerce(a, target), self.coerce(b, target)
        sql = _sql(node)
        dtype = target.to_pandas_dtype()

        def run(rows: _Rows) -> pa.Array:
            x, y = a.run(rows), b.run(rows)
            self._divisor_zero(x, y, sql)
            xs, ys = _to_numpy(x, 0, dtype), _to_numpy(y, 1, dtype)
            ys = np.where(ys == 0, 1, ys)
            with np.errstate(all="ignore"):
                remainder = np.where(ys == -1, 0, np.fmod(xs, ys)) if pa.types.is_integer(target) else np.fmod(xs, ys)
            return _with_nulls_of(pa.array(remainder, target), x, y)

        return self.derived(target, run, node, a, b, fallible=True)

    def _c_negate(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.number(self.compile(operands[0]), "unary -")
        if _is_null(a.type):
            return a
        if a.constant is not _NO_CONSTANT and a.constant is not None:
            value = -a.constant
            fits = a.type if not pa.types.is_integer(a.type) or -(2**31) <= value else pa.int64()
            return self.constant(value, fits, _sql(node))
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            try:
                return pc.negate_checked(a.run(rows))
            except pa.ArrowInvalid as exc:
                raise _Failure(f"{sql}: integer {exc}") from None

        return self.derived(a.type, run, node, a, fallible=pa.types.is_integer(a.type))

    # -- comparisons and logic

    def _c_compare(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        return self.comparison(node, rule.name, self.compile(operands[0]), self.compile(operands[1]))

    def comparison(self, node: exp.Expression, op: str, left: _Value, right: _Value) -> _Value:
        target, (a, b) = self.meet([left, right], f"comparing with {op}", literals=True)
        if _is_list(target) or pa.types.is_struct(target):
            raise self.error(f"{op} compares single values, not {spark_type_name(target)}")
        op = {"==": "="}.get(op, op)

        def run(rows: _Rows) -> pa.Array:
            return _compare(op, a.run(rows), b.run(rows))

        return self.derived(pa.bool_(), run, node, a, b)

    def _c_null_safe_equal(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        target, (a, b) = self.meet([self.compile(o) for o in operands], "comparing with <=>", literals=True)

        def run(rows: _Rows) -> pa.Array:
            x, y = a.run(rows), b.run(rows)
            both, either = pc.and_(x.is_null(), y.is_null()), pc.or_(x.is_null(), y.is_null())
            return pc.if_else(both, True, pc.if_else(either, False, pc.fill_null(_compare("=", x, y), False)))

        return self.derived(pa.bool_(), run, node, a, b)

    def _c_and_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        return self.logic(node, "AND", *(self.boolean(self.compile(o), "AND") for o in operands))

    def _c_or_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        return self.logic(node, "OR", *(self.boolean(self.compile(o), "OR") for o in operands))

    def logic(self, node: exp.Expression, op: str, a: _Value, b: _Value) -> _Value:
        combine = pc.and_kleene if op == "AND" else pc.or_kleene

        def run(rows: _Rows) -> pa.Array:
            x = a.run(rows)
            if not b.fallible:
                return combine(x, b.run(rows))
            # The right side only where the left does not decide (as Spark, which never evaluates it there).
            undecided = ~_mask(pc.invert(x)) if op == "AND" else ~_mask(x)
            return combine(x, _evaluate_on(b, rows, np.flatnonzero(undecided), pa.bool_()))

        return self.derived(pa.bool_(), run, node, a, b)

    def _c_not_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.boolean(self.compile(operands[0]), "NOT")
        return self.derived(pa.bool_(), lambda rows: pc.invert(a.run(rows)), node, a)

    def _c_is_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        if isinstance(operands[1], exp.Null):
            a = self.compile(operands[0])
            return self.derived(pa.bool_(), lambda rows: a.run(rows).is_null(), node, a)
        a = self.boolean(self.compile(operands[0]), "IS TRUE/FALSE")
        truth = bool(operands[1].this)
        return self.derived(
            pa.bool_(), lambda rows: pc.fill_null(a.run(rows) if truth else pc.invert(a.run(rows)), False), node, a
        )

    def _c_isnull(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.compile(operands[0])
        valid = rule.name == "isnotnull"
        return self.derived(pa.bool_(), lambda rows: a.run(rows).is_valid() if valid else a.run(rows).is_null(), node, a)

    def _c_in_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        values = [self.compile(o) for o in operands]
        target, values = self.meet(values, "IN", literals=True)
        subject, candidates = values[0], values[1:]

        def run(rows: _Rows) -> pa.Array:
            x = subject.run(rows)
            out = None
            for candidate in candidates:  # x = v1 OR x = v2 ...: null when nothing matches and a null was met
                equal = _compare("=", x, candidate.run(rows))
                out = equal if out is None else pc.or_kleene(out, equal)
            return out

        return self.derived(pa.bool_(), run, node, *values)

    def _c_between(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        x, low, high = (self.compile(o) for o in operands)
        return self.logic(node, "AND", self.comparison(node, ">=", x, low), self.comparison(node, "<=", x, high))

    def _c_like(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression], escape: str = "\\") -> _Value:
        a = self.string(self.compile(operands[0]), rule.name)
        pattern = _like_pattern(_string_literal(operands[1]) or "", escape)
        ignore_case, negate = isinstance(node, exp.ILike), bool(node.args.get("negate"))

        def run(rows: _Rows) -> pa.Array:
            matched = pc.match_like(a.run(rows), pattern, ignore_case=ignore_case)
            return pc.invert(matched) if negate else matched

        return self.derived(pa.bool_(), run, node, a)

    def _c_escape(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        like = operands[0]
        like_rule = _rule(like)
        assert like_rule is not None
        return self._c_like(like, like_rule, _operands(like_rule, like), escape=_string_literal(operands[1]) or "\\")

    def _c_rlike(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), rule.name)
        pattern = _string_literal(operands[1]) or ""
        return self.derived(pa.bool_(), lambda rows: pc.match_substring_regex(a.run(rows), pattern), node, a)

    # -- conditionals

    def branches(
        self, node: exp.Expression, conditions: Sequence[_Value], results: Sequence[_Value], default: _Value | None
    ) -> _Value:
        """The first result whose condition is true (else ``default``, else null), each computed only for its records."""
        target, typed = self.meet([*results, *([default] if default else [])], type(node).__name__.upper())
        outcomes, otherwise = typed[: len(results)], (typed[-1] if default else None)

        def run(rows: _Rows) -> pa.Array:
            remaining = np.arange(rows.n)
            pieces = []
            for condition, outcome in zip(conditions, outcomes):
                if not len(remaining):
                    break
                taken = _mask(condition.run(rows.take(remaining)))
                chosen = remaining[taken]
                if len(chosen):
                    pieces.append((chosen, outcome.run(rows.take(chosen))))
                remaining = remaining[~taken]
            if otherwise is not None and len(remaining):
                pieces.append((remaining, otherwise.run(rows.take(remaining))))
            return _scatter(rows.n, target, pieces)

        return self.derived(target, run, node, *conditions, *typed)

    def _c_case(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        base = node.args.get("this")
        subject = self.compile(base) if base is not None else None
        conditions, results = [], []
        for branch in node.args.get("ifs") or []:
            if subject is None:
                conditions.append(self.boolean(self.compile(branch.this), "a WHEN condition"))
            else:
                conditions.append(self.comparison(branch, "=", subject, self.compile(branch.this)))
            results.append(self.compile(branch.args["true"]))
        default = node.args.get("default")
        return self.branches(node, conditions, results, self.compile(default) if default is not None else None)

    def _c_if_(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        condition = self.boolean(self.compile(operands[0]), "if's condition")
        return self.branches(node, [condition], [self.compile(operands[1])], self.compile(operands[2]))

    def _c_coalesce(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        target, values = self.meet([self.compile(o) for o in operands], "coalesce")

        def run(rows: _Rows) -> pa.Array:
            remaining = np.arange(rows.n)
            pieces = []
            for value in values:
                if not len(remaining):
                    break
                computed = value.run(rows.take(remaining))
                present = _valid(computed)
                pieces.append((remaining[present], computed.filter(pa.array(present))))
                remaining = remaining[~present]
            return _scatter(rows.n, target, pieces)

        return self.derived(target, run, node, *values)

    def _c_nullif(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a, b = (self.compile(o) for o in operands)
        equal = self.comparison(node, "=", a, b)

        def run(rows: _Rows) -> pa.Array:
            x = a.run(rows)
            if _is_null(x.type):
                return x
            return pc.if_else(pc.fill_null(equal.run(rows), False), pa.nulls(rows.n, x.type), x)

        return self.derived(a.type, run, node, a, equal)

    # -- casts

    def _c_cast(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.compile(operands[0])
        target = _CAST_TARGETS[node.args["to"].this]
        if not _castable(a.type, target):
            hint = ""
            if _is_numeric(a.type) and _is_datetime(target):
                hint = "; use timestamp_seconds, timestamp_millis or timestamp_micros"
            elif _is_datetime(a.type) and _is_numeric(target):
                hint = "; use unix_seconds, unix_millis or unix_micros"
            raise self.error(
                f"cast of {a.sql} ({spark_type_name(a.type)}) to {spark_type_name(target)} is not allowed (as in Spark's ANSI mode){hint}"
            )
        sql = _sql(node)
        if a.constant is not _NO_CONSTANT:  # cast('2024-01-31' as date), 100L: typed literals
            try:
                converted = _cast_values(pa.array([a.constant], a.type), target, sql)[0]
            except _Failure as exc:
                raise self.error(str(exc)) from None
            return self.constant(converted.as_py(), target, sql)
        return self.derived(
            target, lambda rows: _cast_values(a.run(rows), target, sql), node, a, fallible=_cast_may_fail(a.type, target)
        )

    def _c_to_date(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        return self.to_type(self.compile(operands[0]), pa.date32(), "to_date")

    # -- strings

    def _c_upper(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), "upper")
        return self.derived(pa.string(), lambda rows: pc.utf8_upper(a.run(rows)), node, a)

    def _c_lower(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), "lower")
        return self.derived(pa.string(), lambda rows: pc.utf8_lower(a.run(rows)), node, a)

    def _c_length(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), "length")
        return self.derived(pa.int32(), lambda rows: pc.utf8_length(a.run(rows)).cast(pa.int32()), node, a)

    def _c_trim(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(node.this), "trim")
        characters = _string_literal(node.args.get("expression")) if node.args.get("expression") is not None else " "
        position = str(node.args.get("position") or "BOTH").upper()
        function = {"LEADING": pc.utf8_ltrim, "TRAILING": pc.utf8_rtrim}.get(position, pc.utf8_trim)
        chars = characters or ""
        return self.derived(pa.string(), lambda rows: function(a.run(rows), chars) if chars else a.run(rows), node, a)

    def _c_substring(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), "substring")
        pos = _integer_literal(operands[1]) or 0
        length = _integer_literal(operands[2]) if len(operands) > 2 else None
        # Spark's 1-based positions: 0 reads as 1, a negative one counts from the end (Arrow's negative start too).
        start = pos - 1 if pos > 0 else pos
        if length is None or (pos < 0 and pos + length >= 0):
            stop = None  # to the end
        else:
            stop = start + length

        def run(rows: _Rows) -> pa.Array:
            values = a.run(rows)
            if length is not None and length <= 0:
                return _with_nulls_of(pa.repeat(pa.scalar(""), rows.n), values)
            return pc.utf8_slice_codeunits(values, start, stop)

        return self.derived(pa.string(), run, node, a)

    def _c_concat(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        parts = [self.string(self.compile(o), rule.name) for o in operands]

        def run(rows: _Rows) -> pa.Array:
            values = [p.run(rows) for p in parts]
            if len(values) == 1:
                return values[0]
            return pc.binary_join_element_wise(*values, "", null_handling="emit_null")

        return self.derived(pa.string(), run, node, *parts)

    def _c_concat_ws(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        separator = _string_literal(operands[0]) or ""
        parts = [self.string(self.compile(o), "concat_ws") for o in operands[1:]]

        def run(rows: _Rows) -> pa.Array:
            if not parts:
                return pa.repeat(pa.scalar(""), rows.n)
            # Each record's non-null strings as a list, joined (Arrow's "skip" null handling loses rows).
            values = [p.run(rows) for p in parts]
            valid = np.stack([_valid(v) for v in values], axis=1)
            order = np.flatnonzero(valid.reshape(-1))
            flat = pa.concat_arrays([v.cast(pa.string()) for v in values])
            # Row-major position r * k + j of part j of record r, in ``flat``: j * n + r.
            k = len(values)
            taken = flat.take(pa.array((order % k) * rows.n + order // k, pa.int64()))
            offsets = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int32)
            return pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), taken), separator)

        return self.derived(pa.string(), run, node, *parts)

    def _c_replace(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), "replace")
        search = _string_literal(operands[1]) or ""
        replacement = _string_literal(operands[2]) if len(operands) > 2 else ""
        if not search:  # Spark returns the string unchanged (Arrow would loop)
            return a
        return self.derived(pa.string(), lambda rows: pc.replace_substring(a.run(rows), search, replacement or ""), node, a)

    def _c_regexp_replace(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), "regexp_replace")
        pattern = _string_literal(operands[1]) or ""
        replacement = _re2_replacement(_string_literal(operands[2]) or "")
        return self.derived(pa.string(), lambda rows: pc.replace_substring_regex(a.run(rows), pattern, replacement), node, a)

    def _c_split(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), "split")
        pattern = _string_literal(operands[1]) or ""
        limit = _integer_literal(operands[2]) if len(operands) > 2 else None
        splits = limit - 1 if limit is not None and limit > 0 else None
        return self.derived(
            pa.list_(pa.string()), lambda rows: pc.split_pattern_regex(a.run(rows), pattern, max_splits=splits), node, a
        )

    def _c_affix(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.string(self.compile(operands[0]), rule.name)
        pattern = _string_literal(operands[1]) or ""
        function = {"startswith": pc.starts_with, "endswith": pc.ends_with, "contains": pc.match_substring}[rule.name]
        return self.derived(pa.bool_(), lambda rows: function(a.run(rows), pattern), node, a)

    # -- arrays

    def _c_element_at(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        array = self.compile(operands[0])
        if not (_is_list(array.type) or _is_null(array.type)):
            raise self.error(f"element_at needs an array, not {array.sql} ({spark_type_name(array.type)})")
        position = self.compile(operands[1])
        if not (pa.types.is_integer(position.type) or _is_null(position.type)):
            raise self.error(f"element_at's position must be an integer, not {position.sql} ({spark_type_name(position.type)})")
        position = self.coerce(position, pa.int64())
        element = array.type.value_type if _is_list(array.type) else pa.null()
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            lists, at = array.run(rows), position.run(rows)
            if _is_null(lists.type):
                return pa.nulls(rows.n)
            valid = _valid(lists) & _valid(at)
            lengths = _to_numpy(pc.list_value_length(lists), 0, np.int64)
            i = _to_numpy(at, 1, np.int64)
            _fail_where(valid & (i == 0), f"{sql}: position 0 (SQL arrays start at 1)")
            index = np.where(i > 0, i - 1, lengths + i)
            _fail_where(
                valid & ((index < 0) | (index >= lengths)),
                f"{sql}: position out of the array's bounds (as in Spark's ANSI mode; check size(...) first)",
            )
            offsets = lists.offsets.to_numpy().astype(np.int64)[:-1]
            return lists.values.take(pa.array(np.where(valid, offsets + index, 0), pa.int64(), mask=~valid))

        return self.derived(element, run, node, array, position, fallible=True)

    def _c_size(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.compile(operands[0])
        if not (_is_list(a.type) or _is_null(a.type)):
            raise self.error(f"{rule.name} needs an array, not {a.sql} ({spark_type_name(a.type)})")
        return self.derived(
            pa.int32(),
            lambda rows: pa.nulls(rows.n, pa.int32()) if _is_null(a.type) else pc.list_value_length(a.run(rows)).cast(pa.int32()),
            node,
            a,
        )

    # -- math

    def _c_abs(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.number(self.compile(operands[0]), "abs")
        if _is_null(a.type):
            return a
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            try:
                return pc.abs_checked(a.run(rows))
            except pa.ArrowInvalid as exc:
                raise _Failure(f"{sql}: integer {exc}") from None

        return self.derived(a.type, run, node, a, fallible=pa.types.is_integer(a.type))

    def _c_round(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.number(self.compile(operands[0]), "round")
        digits = _integer_literal(operands[1]) if len(operands) > 1 else 0
        scale = digits or 0
        t = pa.float64() if pa.types.is_decimal(a.type) else a.type
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            values = a.run(rows)
            if _is_null(t) or (pa.types.is_integer(t) and scale >= 0):
                return values
            try:
                if pa.types.is_integer(t):
                    return pc.round(values, scale, round_mode="half_towards_infinity")
            except pa.ArrowInvalid as exc:
                raise _Failure(f"{sql}: integer {exc}") from None
            return _round_half_up(values.cast(pa.float64()), scale).cast(t)

        return self.derived(t, run, node, a, fallible=pa.types.is_integer(t) and scale < 0)

    def _c_floor_ceil(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.number(self.compile(operands[0]), rule.name)
        function = pc.floor if rule.name == "floor" else pc.ceil

        def run(rows: _Rows) -> pa.Array:
            values = a.run(rows)
            if pa.types.is_integer(values.type) or _is_null(values.type):
                return values.cast(pa.int64())
            # Java's (long) of the double: saturating, NaN 0.
            x = _to_numpy(function(values.cast(pa.float64())), 0.0, np.float64)
            x = np.where(np.isnan(x), 0.0, x)
            bounded = np.clip(x, -9.2e18, 9.2e18).astype(np.int64)
            longs = np.where(x >= 2.0**63, _INT64_MAX, np.where(x <= -(2.0**63), _INT64_MIN, bounded))
            return _with_nulls_of(pa.array(longs, pa.int64()), values)

        return self.derived(pa.int64(), run, node, a)

    def _c_sqrt(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.coerce(self.number(self.compile(operands[0]), "sqrt"), pa.float64())
        return self.derived(pa.float64(), lambda rows: pc.sqrt(a.run(rows)), node, a)

    def _c_pow(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a, b = (self.coerce(self.number(self.compile(o), "pow"), pa.float64()) for o in operands)
        return self.derived(pa.float64(), lambda rows: pc.power(a.run(rows), b.run(rows)), node, a, b)

    def _c_extreme(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        target, values = self.meet([self.compile(o) for o in operands], rule.name)
        if not (_is_numeric(target) or _is_string(target) or _is_datetime(target) or _is_null(target)):
            raise self.error(f"{rule.name} compares single values, not {spark_type_name(target)}")
        greatest = rule.name == "greatest"
        function = pc.max_element_wise if greatest else pc.min_element_wise

        def run(rows: _Rows) -> pa.Array:
            arrays = [v.run(rows) for v in values]
            if _is_null(target):
                return pa.nulls(rows.n)
            out = function(*arrays, skip_nulls=True)
            if pa.types.is_floating(target) and greatest:  # NaN is the greatest number, in Spark
                nan = np.zeros(rows.n, dtype=bool)
                for values_ in arrays:
                    nan |= _mask(pc.is_nan(values_))
                out = pc.if_else(pa.array(nan), pa.scalar(float("nan"), target), out)
            return out

        return self.derived(target, run, node, *values)

    # -- time

    def _c_from_epoch(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.compile(operands[0])
        unit = rule.name.rsplit("_", 1)[1]
        allowed = _is_numeric(a.type) if unit == "seconds" else pa.types.is_integer(a.type)
        if not (allowed or _is_null(a.type)):
            raise self.error(
                f"{rule.name} needs {'a number' if unit == 'seconds' else 'an integer'}, not {a.sql} ({spark_type_name(a.type)})"
            )
        factor = {"seconds": 1_000_000, "millis": 1_000, "micros": 1}[unit]
        sql = _sql(node)

        def run(rows: _Rows) -> pa.Array:
            values = a.run(rows)
            if _is_null(values.type):
                return pa.nulls(rows.n, _TIMESTAMP)
            try:
                if pa.types.is_integer(values.type):
                    micros = pc.multiply_checked(values.cast(pa.int64()), factor)
                else:
                    x = _to_numpy(values.cast(pa.float64(), safe=False), np.nan, np.float64)
                    finite = np.isfinite(x)  # NaN and infinity: null, as Spark
                    scaled = np.where(finite, x * factor, 0.0)
                    _fail_where(np.abs(scaled) >= 2.0**63, f"{sql}: out of the timestamp range")
                    micros = pa.array(np.trunc(scaled).astype(np.int64), pa.int64(), mask=~finite)
            except pa.ArrowInvalid as exc:
                raise _Failure(f"{sql}: {exc} (out of the timestamp range)") from None
            return micros.cast(pa.timestamp("us")).cast(_TIMESTAMP)

        return self.derived(_TIMESTAMP, run, node, a, fallible=True)

    def _c_unix_time(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        a = self.to_type(self.compile(operands[0]), _TIMESTAMP, rule.name)
        divisor = {"unix_seconds": 1_000_000, "unix_millis": 1_000, "unix_micros": 1}[rule.name]

        def run(rows: _Rows) -> pa.Array:
            stamps = a.run(rows)
            micros = stamps.cast(pa.timestamp("us", tz=_SESSION_ZONE)).cast(pa.int64())
            if divisor == 1:
                return micros
            return _with_nulls_of(pa.array(np.floor_divide(_to_numpy(micros, 0, np.int64), divisor), pa.int64()), micros)

        return self.derived(pa.int64(), run, node, a)

    def _c_date_part(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        operand = operands[0]
        if isinstance(operand, exp.TsOrDsToDate) and not operand.args.get("format"):
            operand = operand.this  # sqlglot's reading of year(x): x as a date
        a = self.to_type(self.compile(operand), pa.date32(), rule.name)
        function = {"year": pc.year, "month": pc.month, "day": pc.day, "dayofmonth": pc.day}[rule.name]
        return self.derived(pa.int32(), lambda rows: function(a.run(rows)).cast(pa.int32()), node, a)

    def _c_time_part(self, node: exp.Expression, rule: _Rule, operands: list[exp.Expression]) -> _Value:
        value = self.compile(operands[0])
        target = value.type if pa.types.is_timestamp(value.type) else _TIMESTAMP
        a = self.to_type(value, target, rule.name)
        function = {"hour": pc.hour, "minute": pc.minute, "second": pc.second}[rule.name]

        def run(rows: _Rows) -> pa.Array:
            stamps = a.run(rows)
            if stamps.type.tz:
                stamps = stamps.cast(pa.timestamp(stamps.type.unit, tz=_SESSION_ZONE))
            return function(stamps).cast(pa.int32())

        return self.derived(pa.int32(), run, node, a)


# -- value rules -----------------------------------------------------------------------------------------


def _compare(op: str, x: pa.Array, y: pa.Array) -> pa.Array:
    """``x op y`` with Spark's rules (NaN equals NaN and is above every other number); null if either is."""
    functions = {
        "=": pc.equal,
        "<>": pc.not_equal,
        "!=": pc.not_equal,
        "<": pc.less,
        "<=": pc.less_equal,
        ">": pc.greater,
        ">=": pc.greater_equal,
    }
    if _is_null(x.type) or _is_null(y.type):
        return pa.nulls(len(x), pa.bool_())
    if not pa.types.is_floating(x.type):
        return functions[op](x, y)
    x_nan, y_nan = _mask(pc.is_nan(x)), _mask(pc.is_nan(y))
    if not (x_nan.any() or y_nan.any()):
        return functions[op](x, y)
    plain = _mask(functions[op](x, y))
    if op in ("=", "<>", "!="):
        equal = (x_nan & y_nan) | (~x_nan & ~y_nan & _mask(pc.equal(x, y)))
        result = equal if op == "=" else ~equal
    else:
        less = (~x_nan & y_nan) | (~x_nan & ~y_nan & _mask(pc.less(x, y)))
        greater = (x_nan & ~y_nan) | (~x_nan & ~y_nan & _mask(pc.greater(x, y)))
        equal = (x_nan & y_nan) | (~x_nan & ~y_nan & _mask(pc.equal(x, y)))
        result = {"<": less, "<=": less | equal, ">": greater, ">=": greater | equal}.get(op, plain)
    return _with_nulls_of(pa.array(result, pa.bool_()), x, y)


def _round_half_up(x: pa.Array, scale: int) -> pa.Array:
    """Spark's ``round`` of doubles: HALF_UP of the number's shortest decimal form (``round(1.005, 2)`` is 1.01)."""
    values = _to_numpy(x, 0.0, np.float64)
    # Already whole (or not finite): nothing to round at a non-negative scale; Arrow would overflow scaling them.
    keep = ~np.isfinite(values) | ((np.abs(values) >= 2.0**52) & (scale >= 0))
    safe = pa.array(np.where(keep, 0.0, values), pa.float64())
    rounded = _to_numpy(pc.round(safe, scale, round_mode="half_towards_infinity"), 0.0, np.float64).copy()
    if scale > 0:
        # A tie in decimal (2.675 -> "2.675") that binary holds just below it: away from zero, as BigDecimal does.
        text = pc.cast(pc.abs(safe), pa.string())
        tie = _mask(pc.match_substring_regex(text, rf"^[0-9]+\.[0-9]{{{scale}}}5$")) & ~keep
        if tie.any():
            rows = np.flatnonzero(tie)
            digits = pc.replace_substring(pc.utf8_slice_codeunits(text.take(pa.array(rows)), 0, -1), ".", "")
            short = _mask(pc.less_equal(pc.utf8_length(digits), 17))
            rows, digits = rows[short], digits.filter(pa.array(short))
            whole = np.asarray(digits.cast(pa.int64()), dtype=np.int64) + 1
            rounded[rows] = np.sign(values[rows]) * whole / 10.0**scale
    out = np.where(keep, values, rounded)
    return _with_nulls_of(pa.array(out, pa.float64()), x)
