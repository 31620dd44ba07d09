"""Column expressions: the Spark SQL strings filter, select, map and flat_map take, evaluated on Arrow.

An expression (``"amount >= 0"``, ``"cast(round(amount * 100) as long)"``, ``"split(text, '[.]')"``) is parsed with
sqlglot (dialect ``spark``) when the pipeline is declared and compiled to ``pyarrow.compute`` over the operator's input
rows: the same rows give the same values, whatever the epoch's size or placement. Anything outside the subset (another
function, a subquery, an aggregate or window function) is refused at declaration with a
:class:`~barrierflow.core.errors.PipelineDefinitionError` naming the operator and the construct; so is a
``pyspark.sql.Column``, which has no form outside a Spark session (``F.col("amount") > 0`` is ``"amount > 0"``).

The supported subset, its run-time errors and where it differs from Spark: ``docs/expressions.md``.
"""

from __future__ import annotations

import dataclasses
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
from sqlglot.helper import ensure_list

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

# Functions a replay could not repeat, as sqlglot writes them in Spark SQL.
_NON_DETERMINISTIC = frozenset(
    "now current_date current_timestamp current_time current_datetime localtimestamp localtime current_timezone "
    "current_user user session_user current_schema current_catalog rand random randn uniform randstr uuid shuffle "
    "monotonically_increasing_id spark_partition_id input_file_name input_file_block_start input_file_block_length".split()
)

_SESSION_ZONE = "UTC"  # barrierflow's Spark session time zone: all event time is UTC
_TIMESTAMP = pa.timestamp("us", tz=_SESSION_ZONE)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_S, _B, _I32, _I64, _F64 = pa.string(), pa.bool_(), pa.int32(), pa.int64(), pa.float64()


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
    for node in tree.walk():
        if isinstance(node, exp.Func) and _name(node) in _NON_DETERMINISTIC:
            raise PipelineDefinitionError(
                f"{operator_id}: {_name(node)} in {value!r} is non-deterministic and not supported: a replayed epoch "
                "must compute the same records (take the time from a column, e.g. an event time, or from the "
                "records' source)"
            )
    if not isinstance(tree, exp.Star):
        _Compiler(operator_id, value, None).compile(_body(tree))


def is_star(text: str) -> bool:
    """Whether the expression is ``*`` (every user column, in ``select``)."""
    return text.strip() == "*"


def declared_name(operator_id: str, text: str) -> tuple[str | None, str | None]:
    """The output name the expression declares (its alias, or the column it is), and the column it is (None: computed)."""
    tree = _parse(operator_id, text)
    inner = _body(tree).unnest()
    source = inner.name if isinstance(inner, exp.Column) and isinstance(inner.this, exp.Identifier) else None
    return (tree.alias if isinstance(tree, exp.Alias) else source), source


def _body(tree: exp.Expr) -> exp.Expr:
    return tree.this if isinstance(tree, exp.Alias) else tree


_parsed = functools.lru_cache(maxsize=1024)(functools.partial(sqlglot.parse_one, dialect="spark"))


def _parse(operator_id: str, text: str) -> exp.Expr:
    try:
        tree = _parsed(text)
    except SqlglotError as exc:
        message = str(exc).replace("\x1b[4m", "").replace("\x1b[0m", "")
        raise PipelineDefinitionError(f"{operator_id}: {text!r} is not a SQL expression: {message}") from None
    if isinstance(tree, (exp.Query, exp.Command)):
        raise PipelineDefinitionError(f"{operator_id}: {text!r} is a statement, not a column expression")
    return tree


@dataclass(frozen=True)
class _Rule:
    """A construct barrierflow evaluates: where sqlglot holds its operands, what must be literal, how it is compiled."""

    name: str  # as users write it
    kind: str = "call"  # the compiler's method: _c_<kind>
    keys: tuple[str, ...] = ("this",)  # sqlglot's arguments holding the operands (a node or a list), in order
    arity: tuple[int, int] | None = None  # how many operands (default: one per key)
    literals: Mapping[int, str] | None = None  # operand position -> integer | string | regex | split | like | replacement
    flags: tuple[str, ...] = ()  # sqlglot's arguments that do not change Spark's meaning (or that the compiler reads)
    # kind "call": the Arrow function of the operands (literals as Python values), each operand's kind (_KINDS, the
    # last one repeating), the result's type (None: the first operand's), and whether it may fail on some value.
    call: Callable[..., Any] | None = None
    args: str = ""
    out: pa.DataType | None = None
    fails: bool = False


def _substring(values: pa.Array, pos: int, length: int | None = None) -> pa.Array:
    """Spark's 1-based ``substring``: ``pos`` 0 reads as 1, a negative one counts from the end (as Arrow's start)."""
    start = pos - 1 if pos > 0 else pos
    to_end = length is None or (pos < 0 and pos + length >= 0)
    return pc.utf8_slice_codeunits(values, start, None if to_end else start + max(length or 0, 0))


def _round(values: pa.Array, scale: int = 0) -> pa.Array:
    if pa.types.is_integer(values.type):
        return values if scale >= 0 else pc.round(values, scale, round_mode="half_towards_infinity")
    return _round_half_up(values.cast(_F64), scale).cast(values.type)


def _to_long(function: Callable[[pa.Array], pa.Array], values: pa.Array) -> pa.Array:
    """floor/ceil as a bigint: of a floating-point number as Java's (long) (saturating, NaN 0)."""
    if pa.types.is_integer(values.type):
        return values.cast(_I64)
    x = np.nan_to_num(_to_numpy(function(values.cast(_F64)), 0.0, np.float64), nan=0.0)
    inside = np.abs(x) < 2.0**63
    longs = np.where(inside, np.where(inside, x, 0.0).astype(np.int64), np.where(x > 0, _INT64_MAX, _INT64_MIN))
    return pa.array(longs, _I64, mask=~_valid(values))


def _from_epoch(factor: int, values: pa.Array) -> pa.Array:
    """Seconds, milliseconds or microseconds since the epoch (``factor`` microseconds each) as a timestamp."""
    try:
        if pa.types.is_integer(values.type):
            micros = pc.multiply_checked(values.cast(_I64), factor)
        else:
            x = _to_numpy(values.cast(_F64, safe=False), np.nan, np.float64)
            finite = np.isfinite(x)  # NaN and infinity: null, as Spark
            scaled = np.where(finite, x * factor, 0.0)
            _fail_where(np.abs(scaled) >= 2.0**63, "out of the timestamp range")
            micros = pa.array(np.trunc(scaled).astype(np.int64), _I64, mask=~finite)
    except pa.ArrowInvalid as exc:
        raise _Failure(f"{exc} (out of the timestamp range)") from None
    return micros.cast(pa.timestamp("us")).cast(_TIMESTAMP)


def _extreme(greatest: bool, *arrays: pa.Array) -> pa.Array:
    out = (pc.max_element_wise if greatest else pc.min_element_wise)(*arrays, skip_nulls=True)
    if pa.types.is_floating(out.type) and greatest:  # NaN is the greatest number, in Spark
        nan = functools.reduce(np.logical_or, [_mask(pc.is_nan(a)) for a in arrays])
        out = pc.if_else(pa.array(nan), pa.scalar(float("nan"), out.type), out)
    return out


_BINARY = ("this", "expression")
_MANY = 1 << 30
_RULES: dict[type[exp.Expr], _Rule] = {
    **{c: _Rule(op, "arith", _BINARY, flags=("typed", "safe")) for c, op in (
        (exp.Add, "+"), (exp.Sub, "-"), (exp.Mul, "*"), (exp.Div, "/"), (exp.Mod, "%"), (exp.IntDiv, "div"))},
    **{c: _Rule(op, "compare", _BINARY) for c, op in (
        (exp.EQ, "="), (exp.NEQ, "<>"), (exp.GT, ">"), (exp.GTE, ">="), (exp.LT, "<"), (exp.LTE, "<="), (exp.NullSafeEQ, "<=>"))},
    **{c: _Rule(name, call=pc.negate_checked, args="n", fails=True) for c, name in ((exp.Neg, "unary -"), (exp.Negative, "negative"))},
    **{c: _Rule(op, "logic", _BINARY) for c, op in ((exp.And, "AND"), (exp.Or, "OR"))},
    exp.Not: _Rule("NOT", call=pc.invert, args="b", out=_B),
    exp.Is: _Rule("IS", "is_", _BINARY),
    exp.In: _Rule("IN", "in_", ("this", "expressions"), (2, _MANY)),
    exp.Between: _Rule("BETWEEN", "between", ("this", "low", "high")),
    **{c: _Rule(op, "like", _BINARY, literals={1: "like"}, flags=("negate",)) for c, op in ((exp.Like, "LIKE"), (exp.ILike, "ILIKE"))},
    exp.Escape: _Rule("ESCAPE", "like", _BINARY),
    exp.RegexpLike: _Rule("RLIKE", keys=_BINARY, literals={1: "regex"}, call=pc.match_substring_regex, args="s", out=_B),
    exp.Case: _Rule("CASE", "case", ("this", "ifs", "default"), (0, _MANY)),
    exp.If: _Rule("if", "if_", ("this", "true", "false")),
    exp.Coalesce: _Rule("coalesce", "coalesce", ("this", "expressions"), (1, _MANY), flags=("is_nvl", "is_null")),
    exp.Nullif: _Rule("nullif", "nullif", _BINARY),
    **dict.fromkeys((exp.Cast, exp.TryCast), _Rule("cast", "cast", flags=("to", "safe"))),
    exp.Upper: _Rule("upper", call=pc.utf8_upper, args="s", out=_S),
    exp.Lower: _Rule("lower", call=pc.utf8_lower, args="s", out=_S),
    exp.Length: _Rule("length", call=pc.utf8_length, args="s", out=_I32),
    exp.Trim: _Rule("trim", "trim", _BINARY, (1, 2), flags=("position",)),
    exp.Substring: _Rule(
        "substring", keys=("this", "start", "length"), arity=(2, 3), literals={1: "integer", 2: "integer"},
        flags=("zero_start",), call=_substring, args="s", out=_S,
    ),
    **{c: _Rule(name, keys=keys, arity=(1, _MANY), flags=("safe", "coalesce"), args="s", out=_S,
                call=lambda *parts: pc.binary_join_element_wise(*parts, "", null_handling="emit_null"))
       for c, name, keys in ((exp.Concat, "concat", ("expressions",)), (exp.DPipe, "||", _BINARY))},
    exp.ConcatWs: _Rule("concat_ws", "concat_ws", ("expressions",), (1, _MANY), {0: "string"}, ("safe", "coalesce", "flatten")),
    exp.Replace: _Rule(
        "replace", keys=("this", "expression", "replacement"), arity=(2, 3), literals={1: "string", 2: "string"},
        args="s", out=_S,  # an empty search leaves the string unchanged, as Spark (Arrow would loop)
        call=lambda s, search, replacement="": pc.replace_substring(s, search, replacement) if search else s,
    ),
    exp.RegexpReplace: _Rule(
        "regexp_replace", keys=("this", "expression", "replacement"), literals={1: "regex", 2: "replacement"},
        call=lambda s, pattern, java: pc.replace_substring_regex(s, pattern, _re2_replacement(java)), args="s", out=_S,
    ),
    exp.RegexpSplit: _Rule(
        "split", keys=("this", "expression", "limit"), arity=(2, 3), literals={1: "split", 2: "integer"}, args="s",
        out=pa.list_(_S), call=lambda s, pattern, limit=0: pc.split_pattern_regex(s, pattern, max_splits=limit - 1 if limit > 0 else None),
    ),
    **{c: _Rule(name, keys=_BINARY, literals={1: "string"}, call=f, args="s", out=_B) for c, name, f in (
        (exp.StartsWith, "startswith", pc.starts_with), (exp.EndsWith, "endswith", pc.ends_with),
        (exp.Contains, "contains", pc.match_substring))},
    exp.Bracket: _Rule("element_at", "element_at", ("this", "expressions"), (2, 2), flags=("offset", "safe")),
    exp.ArraySize: _Rule("size", call=pc.list_value_length, args="A", out=_I32),
    exp.Abs: _Rule("abs", call=pc.abs_checked, args="n", fails=True),
    exp.Round: _Rule("round", keys=("this", "decimals"), arity=(1, 2), literals={1: "integer"}, call=_round, args="x", fails=True),
    **{c: _Rule(name, call=functools.partial(_to_long, f), args="n", out=_I64) for c, name, f in (
        (exp.Floor, "floor", pc.floor), (exp.Ceil, "ceil", pc.ceil))},
    exp.Sqrt: _Rule("sqrt", call=pc.sqrt, args="d", out=_F64),
    exp.Pow: _Rule("pow", keys=_BINARY, call=pc.power, args="d", out=_F64),
    **{c: _Rule(name, "extreme", ("this", "expressions"), (2, _MANY), flags=("ignore_nulls",)) for c, name in (
        (exp.Greatest, "greatest"), (exp.Least, "least"))},
    **{c: _Rule(name, call=f, args=kind, out=_I32) for c, name, f, kind in (
        (exp.Year, "year", pc.year, "D"), (exp.Month, "month", pc.month, "D"), (exp.Day, "day", pc.day, "D"),
        (exp.DayOfMonth, "dayofmonth", pc.day, "D"), (exp.Hour, "hour", pc.hour, "T"), (exp.Minute, "minute", pc.minute, "T"),
        (exp.Second, "second", pc.second, "T"))},
    exp.TsOrDsToDate: _Rule("to_date", flags=("safe",), call=lambda dates: dates, args="D", out=pa.date32()),
    **{c: _Rule(name, args="T", out=_I64, call=lambda t, unit=unit: pc.floor_temporal(t, unit=unit[0]).cast(
        pa.timestamp(unit[1], tz=_SESSION_ZONE)).cast(_I64)) for c, name, unit in ((exp.UnixSeconds, "unix_seconds", ("second", "s")),
        (exp.UnixMillis, "unix_millis", ("millisecond", "ms")), (exp.UnixMicros, "unix_micros", ("microsecond", "us")))},
}  # fmt: skip
# Functions sqlglot leaves as they are written (exp.Anonymous), by lower-case name.
_ANONYMOUS: dict[str, _Rule] = {
    **{f"timestamp_{unit}": _Rule(f"timestamp_{unit}", call=functools.partial(_from_epoch, factor), args=kind, out=_TIMESTAMP)
       for unit, factor, kind in (("seconds", 1_000_000, "n"), ("millis", 1_000, "i"), ("micros", 1, "i"))},
    "isnull": _Rule("isnull", call=pc.is_null, args="*", out=_B),
    "isnotnull": _Rule("isnotnull", call=pc.is_valid, args="*", out=_B),
    "regexp": _Rule("regexp", arity=(2, 2), literals={1: "regex"}, call=pc.match_substring_regex, args="s", out=_B),
    "cardinality": _Rule("cardinality", call=pc.list_value_length, args="A", out=_I32),
}  # fmt: skip
_CAST_TARGETS: dict[Any, pa.DataType] = {
    exp.DataType.Type.TEXT: _S, exp.DataType.Type.VARCHAR: _S, exp.DataType.Type.CHAR: _S,
    exp.DataType.Type.TINYINT: pa.int8(), exp.DataType.Type.SMALLINT: pa.int16(), exp.DataType.Type.INT: _I32,
    exp.DataType.Type.BIGINT: _I64, exp.DataType.Type.FLOAT: pa.float32(), exp.DataType.Type.DOUBLE: _F64,
    exp.DataType.Type.BOOLEAN: _B, exp.DataType.Type.DATE: pa.date32(), exp.DataType.Type.TIMESTAMP: _TIMESTAMP,
    exp.DataType.Type.TIMESTAMPLTZ: _TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ: _TIMESTAMP,
}  # fmt: skip
# sqlglot arguments refused by what they mean to users (any other one set: refused by its own name).
_IN_VALUES = "list the values: x IN (1, 2, 3)"
_REFUSED_ARGS = {
    "format": ("a format", "cast the string first if it is yyyy-MM-dd"), "decimals": ("a scale", ""), "to": ("a scale", ""),
    "collation": ("a collation", ""), "query": ("a subquery", _IN_VALUES), "unnest": ("an array", _IN_VALUES),
    "field": ("an array", _IN_VALUES),
}  # fmt: skip


def _rule(node: exp.Expr) -> _Rule | None:
    if isinstance(node, exp.Anonymous):
        rule = _ANONYMOUS.get(node.name.lower())
        return None if rule is None else dataclasses.replace(rule, keys=("expressions",), flags=("this",))
    return _RULES.get(type(node))


def _operands(rule: _Rule, node: exp.Expr) -> list[exp.Expr]:
    """The node's operands, in the order Spark's function takes them."""
    return [o for key in rule.keys for o in ensure_list(node.args.get(key)) if o is not None]


def _literal(node: exp.Expr | None) -> Any:
    """The value of a string or integer literal (``'a'``, ``3``, ``-3``, ``(3)``), else None."""
    node = None if node is None else node.unnest()
    if isinstance(node, exp.Neg):
        value = _literal(node.this)
        return -value if isinstance(value, int) else None
    if isinstance(node, exp.Literal) and (node.is_string or re.fullmatch(r"[0-9]+", node.name)):
        return node.name if node.is_string else int(node.name)
    return None


def _sql(node: exp.Expr) -> str:
    """A (sub)expression as SQL, for messages."""
    return node.sql(dialect="spark", normalize_functions="lower")


def _name(node: exp.Expr) -> str:
    """How users write the construct, for messages."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.Func):
        written = re.match(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", _sql(node))  # as Spark spells it (date_format, not time_to_str)
        return (written.group(1) if written else node.sql_name()).lower()
    return type(node).__name__


def _like_pattern(pattern: str, escape: str) -> str:
    """A LIKE pattern as Arrow's ``match_like`` reads it (backslash escapes), refusing what Spark refuses."""
    out = []
    for escaped, char in re.findall(f"({re.escape(escape)}.?)|(.)", pattern, flags=re.S):
        if escaped and len(escaped) == 1:
            raise ValueError(f"the LIKE pattern {pattern!r} ends with the escape character {escape!r}")
        if escaped and escaped[1] not in ("_", "%", escape):
            raise ValueError(f"the escape character {escape!r} is not allowed to precede {escaped[1]!r} in {pattern!r}")
        out.append("\\" + escaped[1] if escaped else "\\\\" if char == "\\" else char)
    return "".join(out)


def _re2_replacement(java: str) -> str:
    """A Java replacement string (``$1`` a group, ``\\`` escapes) as RE2's rewrite (``\\1``)."""
    out = []
    for escaped, dollar, char in re.findall(r"(\\.?)|(\$(?:[0-9](?![0-9]))?)|(.)", java, flags=re.S):
        if escaped == "\\":
            raise ValueError(f"the replacement {java!r} ends with a backslash")
        if dollar == "$":
            raise ValueError(
                f"in the replacement {java!r}, $ must be followed by one group number (0-9); write \\$ for a dollar sign"
            )
        if escaped:
            out.append("\\\\" if escaped == "\\\\" else escaped[1])
        else:
            out.append("\\" + dollar[1] if dollar else char)
    return "".join(out)


# -- types ------------------------------------------------------------------------------------------


def _any_of(*checks: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    return lambda t: any(check(t) for check in checks)


_is_string = _any_of(pa.types.is_string, pa.types.is_large_string)
_is_numeric = _any_of(pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
_is_list = _any_of(pa.types.is_list, pa.types.is_large_list)
_is_datetime = _any_of(pa.types.is_timestamp, pa.types.is_date)
_is_null = pa.types.is_null
_NUMERIC_ORDER = (pa.int8(), pa.int16(), _I32, _I64, pa.float32(), _F64)


def _numeric_rank(t: pa.DataType) -> int:
    if pa.types.is_decimal(t) or t == _F64:
        return 5
    if pa.types.is_floating(t):
        return 4
    return min(3, t.bit_width.bit_length() - 4 + (not pa.types.is_signed_integer(t)))  # unsigned: the next signed width


def _wider(*types: pa.DataType) -> pa.DataType:
    """The type Spark computes numbers of these types in (decimals: as double)."""
    known = [t for t in types if not _is_null(t)]
    return _NUMERIC_ORDER[max(map(_numeric_rank, known))] if known else pa.null()


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
        return _S
    if all(_is_datetime(t) for t in known):
        stamps = [t for t in known if pa.types.is_timestamp(t)]
        if not stamps:
            return pa.date32()
        return pa.timestamp("us", tz=_SESSION_ZONE if any(t.tz for t in stamps) or len(stamps) < len(known) else None)
    return None


def spark_type_name(t: pa.DataType) -> str:
    """An Arrow type as Spark names it, for messages."""
    names = {
        pa.int8(): "tinyint", pa.int16(): "smallint", _I32: "int", _I64: "bigint", pa.float32(): "float",
        _F64: "double", _B: "boolean", _S: "string", pa.large_string(): "string",
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
        return _Rows(self.table.take(pa.array(indices, _I64)), len(indices))


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


def _to_numpy(values: pa.Array, fill: Any, dtype: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(values, fill).to_numpy(zero_copy_only=False), dtype=dtype)


def _fail_where(failing: np.ndarray, message: str) -> None:
    if failing.any():
        raise _Failure(f"{message} ({int(failing.sum())} record(s))")


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


def _compare(op: str, x: pa.Array, y: pa.Array) -> pa.Array:
    """``x op y`` with Spark's rules (NaN equals NaN and is above every other number); null if either is, but for ``<=>``."""
    if op == "<=>":  # two nulls are equal, a null and a value not
        return pc.if_else(pc.and_(x.is_null(), y.is_null()), True, pc.fill_null(_compare("=", x, y), False))
    if _is_null(x.type) or _is_null(y.type):
        return pa.nulls(len(x), _B)
    functions = {"=": pc.equal, "<>": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}
    if not pa.types.is_floating(x.type) or not (_mask(pc.is_nan(x)).any() or _mask(pc.is_nan(y)).any()):
        return functions[op](x, y)
    x_nan, y_nan = pc.is_nan(x), pc.is_nan(y)
    equal = pc.or_(pc.and_(x_nan, y_nan), pc.equal(x, y))
    less = pc.or_(pc.and_(pc.invert(x_nan), y_nan), pc.less(x, y))
    at_most = pc.or_(less, equal)
    return {"=": equal, "<>": pc.invert(equal), "<": less, "<=": at_most, ">": pc.invert(at_most), ">=": pc.invert(less)}[op]


def _round_half_up(x: pa.Array, scale: int) -> pa.Array:
    """Spark's ``round`` of doubles: HALF_UP of the number's shortest decimal form (``round(1.005, 2)`` is 1.01)."""
    values = _to_numpy(x, 0.0, np.float64)
    # Already whole (or not finite): nothing to round at a non-negative scale; Arrow would overflow scaling them.
    keep = ~np.isfinite(values) | ((np.abs(values) >= 2.0**52) & (scale >= 0))
    safe = pa.array(np.where(keep, 0.0, values), _F64)
    rounded = _to_numpy(pc.round(safe, scale, round_mode="half_towards_infinity"), 0.0, np.float64).copy()
    if scale > 0:
        # A tie in decimal (2.675 -> "2.675") that binary holds just below it: away from zero, as BigDecimal does.
        text = pc.cast(pc.abs(safe), _S)
        tie = _mask(pc.match_substring_regex(text, rf"^[0-9]+\.[0-9]{{{scale}}}5$")) & ~keep
        if tie.any():
            rows = np.flatnonzero(tie)
            digits = pc.replace_substring(pc.utf8_slice_codeunits(text.take(pa.array(rows)), 0, -1), ".", "")
            short = _mask(pc.less_equal(pc.utf8_length(digits), 17))
            rows, digits = rows[short], digits.filter(pa.array(short))
            whole = np.asarray(digits.cast(_I64), dtype=np.int64) + 1
            rounded[rows] = np.sign(values[rows]) * whole / 10.0**scale
    return pa.array(np.where(keep, values, rounded), _F64, mask=~_valid(x))


def _element_at(lists: pa.Array, at: pa.Array) -> pa.Array:
    valid = _valid(lists) & _valid(at)
    lengths = _to_numpy(pc.list_value_length(lists), 0, np.int64)
    i = _to_numpy(at, 1, np.int64)
    _fail_where(valid & (i == 0), "position 0 (SQL arrays start at 1)")
    index = np.where(i > 0, i - 1, lengths + i)
    _fail_where(
        valid & ((index < 0) | (index >= lengths)),
        "position out of the array's bounds (as in Spark's ANSI mode; check size(...) first)",
    )
    offsets = lists.offsets.to_numpy().astype(np.int64)[:-1]
    return lists.values.take(pa.array(np.where(valid, offsets + index, 0), _I64, mask=~valid))


def _concat_ws(separator: str, *parts: pa.Array) -> pa.Array:
    """The non-null parts joined by ``separator`` ("" when all are null: Arrow's "skip" would drop the record)."""
    none = functools.reduce(pc.and_, [p.is_null() for p in parts])
    return pc.binary_join_element_wise(pc.if_else(none, "", parts[0]), *parts[1:], separator, null_handling="skip")


def _arithmetic(op: str, x: pa.Array, y: pa.Array) -> pa.Array:
    if op in ("+", "-", "*"):
        return {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}[op](x, y)
    zero = _valid(x) & _valid(y) & (_to_numpy(y, 1, np.float64) == 0)
    _fail_where(zero, "division by zero (as in Spark's ANSI mode; guard it: CASE WHEN d <> 0 THEN n / d END)")
    if op == "/":
        return pc.divide(x, y)
    if op == "div":
        return pc.divide_checked(x, pc.if_else(pc.equal(y, 0), 1, y))  # zero divisors are null dividends here
    dtype = x.type.to_pandas_dtype()
    xs, ys = _to_numpy(x, 0, dtype), _to_numpy(y, 1, dtype)
    ys = np.where(ys == 0, 1, ys)
    with np.errstate(all="ignore"):
        remainder = np.where(ys == -1, 0, np.fmod(xs, ys)) if pa.types.is_integer(x.type) else np.fmod(xs, ys)
    return pa.array(remainder, x.type, mask=~(_valid(x) & _valid(y)))


# -- casts ------------------------------------------------------------------------------------------


def _float_strings(values: pa.Array) -> pa.Array:
    """Floating-point numbers as Java (hence Spark) prints them: ``1.0``, ``0.001``, ``1.0E7``, ``1.5E-4``, ``NaN``."""
    x = np.abs(_to_numpy(values, 0.0, np.float64))
    # Arrow's shortest round-trip digits (as Java's), plain from 1e-6 to 1e21; Java prints plain from 1e-3 to 1e7.
    text = pc.replace_substring(pc.replace_substring(pc.cast(values, _S), "nan", "NaN"), "inf", "Infinity")
    parts = pc.extract_regex(text, r"^(?P<s>-?)(?P<i>[0-9]+)\.?(?P<f>[0-9]*)(?:e\+?(?P<e>-?[0-9]+))?$")
    every = pc.binary_join_element_wise(parts.field("i"), parts.field("f"), "")
    digits = pc.utf8_trim(every, "0")
    length = [_to_numpy(pc.utf8_length(a), 0, np.int64) for a in (parts.field("i"), every, pc.utf8_ltrim(every, "0"))]
    exponent = pc.if_else(pc.equal(parts.field("e"), ""), "0", parts.field("e")).cast(_I64)
    power = length[0] - 1 - length[1] + length[2] + _to_numpy(exponent, 0, np.int64)
    rest = pc.utf8_slice_codeunits(digits, 1, 1 << 30)
    scientific = pc.binary_join_element_wise(
        parts.field("s"), pc.utf8_slice_codeunits(digits, 0, 1), ".", pc.if_else(pc.equal(rest, ""), "0", rest), "E",
        pa.array(power).cast(_S), "",
    )  # fmt: skip
    plain = pc.replace_substring_regex(text, r"^(-?[0-9]+)$", r"\1.0")
    return pc.if_else(pa.array(((x >= 1e-3) & (x < 1e7)) | (x == 0) | ~np.isfinite(x)), plain, scientific)


def _to_string(values: pa.Array) -> pa.Array:
    t = values.type
    if pa.types.is_floating(t):
        return _float_strings(values)
    if pa.types.is_timestamp(t):  # in UTC, the fraction without trailing zeros
        stamps = values.cast(pa.timestamp("us", tz=_SESSION_ZONE if t.tz else None), safe=False)
        return pc.replace_substring_regex(pc.strftime(stamps, format="%Y-%m-%d %H:%M:%S"), r"\.?0+$", "")
    return values.cast(_S)  # strings, integers, booleans, decimals, dates: as Spark prints them


_BOOLEAN_STRINGS = pa.array(["t", "true", "y", "yes", "1", "f", "false", "n", "no", "0"])  # true, then false


def _cast_values(values: pa.Array, target: pa.DataType) -> pa.Array:
    """Spark's ANSI cast of ``values`` to ``target`` (the pair checked by :func:`_castable`)."""
    source = values.type
    if source == target:
        return values
    if _is_null(source):
        return pa.nulls(len(values), target)
    text = pc.utf8_trim_whitespace(values) if _is_string(source) else values
    try:
        if _is_string(target):
            return _to_string(values)
        if pa.types.is_integer(target) and (pa.types.is_floating(source) or pa.types.is_decimal(source)):
            x = values.cast(_F64, safe=False)
            whole = np.trunc(_to_numpy(x, 0.0, np.float64))
            bounds = np.iinfo(target.to_pandas_dtype())
            _fail_where(
                ~np.isfinite(whole) | (whole < bounds.min) | (whole >= float(bounds.max) + 1),
                f"a value out of the range of {spark_type_name(target)} (as Spark's ANSI cast)",
            )
            return pa.array(whole, mask=~_valid(x)).cast(target, safe=False)
        if pa.types.is_integer(target) and _is_string(source):
            return pc.replace_substring_regex(text, r"^\+", "").cast(target)
        if pa.types.is_floating(target):
            return text.cast(target, safe=False)
        if pa.types.is_boolean(target) and _is_string(source):
            index = pc.index_in(pc.utf8_lower(text), _BOOLEAN_STRINGS)
            bad = _valid(values) & ~_valid(index)
            if bad.any():
                raise _Failure(f"{values.filter(pa.array(bad))[0].as_py()!r} is not a boolean ({int(bad.sum())} record(s))")
            return pc.less(index, 5)
        if pa.types.is_boolean(target):
            return pc.not_equal(values, pa.scalar(0, source))
        if pa.types.is_date(target) and _is_string(source):
            return pc.replace_substring_regex(text, r"^([0-9]{4}-[0-9]{2}-[0-9]{2})[ T].*$", r"\1").cast(target)
        if pa.types.is_date(target) and pa.types.is_timestamp(source):
            return values.cast(pa.timestamp("us", tz=_SESSION_ZONE) if source.tz else pa.timestamp("us")).cast(target)
        if pa.types.is_timestamp(target) and _is_string(source):  # without a zone: in UTC
            zoned, rows = _mask(pc.match_substring_regex(text, r"(Z|[+-][0-9]{2}:?[0-9]{2})$")), np.arange(len(values))
            pieces = [
                (rows[m], text.filter(pa.array(m)).cast(pa.timestamp("us", tz=z))) for m, z in ((zoned, "UTC"), (~zoned, None))
            ]
            return _scatter(len(values), _TIMESTAMP, pieces).cast(target)
        if pa.types.is_timestamp(target) and pa.types.is_timestamp(source):
            # Another unit or zone: the same instant (a zone-less timestamp read in UTC), to the microsecond.
            return values.cast(pa.timestamp(target.unit, tz=source.tz), safe=False).cast(target)
        return values.cast(pa.timestamp("us")).cast(target) if pa.types.is_timestamp(target) else values.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _Failure(str(exc)) from None


def _cast_may_fail(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether some value of ``source`` has no ``target`` value (a string that is not a number, an overflow)."""
    if source == target or _is_null(source) or _is_string(target):
        return False
    if _is_string(source):
        return True
    return bool(pa.types.is_integer(target)) and not (
        pa.types.is_boolean(source) or (pa.types.is_integer(source) and _numeric_rank(source) <= _numeric_rank(target))
    )


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether Spark's ANSI mode casts ``source`` to ``target``."""
    if source == target or _is_null(source) or _is_string(source):
        return True
    if _is_string(target):
        return _is_numeric(source) or _is_datetime(source) or pa.types.is_boolean(source)
    if _is_numeric(target) or pa.types.is_boolean(target):
        return _is_numeric(source) or pa.types.is_boolean(source)
    return _is_datetime(target) and _is_datetime(source)


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
        except (_Failure, pa.ArrowException) as exc:
            raise UserFunctionError(f"{self.operator_id}: expression {self.text!r} failed: {exc}") from None


def compile_expression(operator_id: str, text: str, schema: pa.Schema) -> Compiled:
    """``text`` compiled against rows of ``schema``; a :class:`PipelineDefinitionError` if it cannot run on them."""
    check_expression(operator_id, text)
    tree = _parse(operator_id, text)
    if isinstance(tree, exp.Star):
        raise PipelineDefinitionError(f"{operator_id}: * stands for every column only in select")
    body = _body(tree).unnest()
    compiler = _Compiler(operator_id, text, schema)
    value = compiler.compile(body)
    column = next(iter(compiler.read)) if isinstance(body, exp.Column) else None
    type_, name = (schema.field(column).type if column else value.type), (tree.alias if isinstance(tree, exp.Alias) else column)
    return Compiled(operator_id, text, type_, name, column, tuple(sorted(compiler.read)), value)


# The operand kinds a rule's ``args`` name: what the message says it needs, the types it takes, the type it is read as
# (None: its own; null stays null).
_KINDS: dict[str, tuple[str, Callable[[pa.DataType], bool], pa.DataType | None]] = {
    "*": ("", lambda t: True, None),
    "s": ("needs a string", lambda t: _castable(t, _S), _S),
    "b": ("must be a boolean", pa.types.is_boolean, _B),
    "n": ("needs a number", _is_numeric, None),
    "x": ("needs a number", _is_numeric, None),  # decimals read as double
    "d": ("needs a number", _is_numeric, _F64),
    "i": ("needs an integer", pa.types.is_integer, None),
    "I": ("needs integers", pa.types.is_integer, _I64),
    "A": ("needs an array", _is_list, None),
    "D": ("needs a date", lambda t: _castable(t, pa.date32()), pa.date32()),
    "T": ("needs a timestamp", lambda t: _castable(t, _TIMESTAMP), _TIMESTAMP),
}


class _Compiler:
    """Types a parsed expression against a schema and builds its evaluation, refusing what barrierflow cannot evaluate.

    Without a schema (when the pipeline is declared) it checks the constructs alone: every value is then of no type.
    """

    def __init__(self, operator_id: str, text: str, schema: pa.Schema | None) -> None:
        self.operator_id, self.text, self.schema = operator_id, text, schema
        self.read: set[str] = set()

    def error(self, message: str) -> PipelineDefinitionError:
        return PipelineDefinitionError(f"{self.operator_id}: in {self.text!r}, {message}")

    def refuse(self, what: str, hint: str = "") -> PipelineDefinitionError:
        return PipelineDefinitionError(
            f"{self.operator_id}: {what} in {self.text!r} is not supported{'; ' + hint if hint else ''}. "
            f"barrierflow evaluates these SQL expressions: {SUPPORTED}"
        )

    def resolve(self, name: str) -> str:
        """The input column ``name`` refers to, resolved as Spark does (case-insensitively)."""
        if self.schema is None:
            return name
        users = [n for n in self.schema.names if not n.startswith("_")]
        if name.startswith("_"):
            raise self.error(f"column {name!r} is the engine's (columns starting with _ cannot be read)")
        if name in users:
            return name
        matches = [n for n in users if n.lower() == name.lower()]
        if len(matches) != 1:
            raise self.error(f"column {name!r} {'is ambiguous' if matches else 'does not exist'} (columns: {users})")
        return matches[0]

    def compile(self, node: exp.Expr) -> _Value:
        node = node.unnest()
        if isinstance(node, exp.Column):
            if not isinstance(node.this, exp.Identifier) or node.args.get("table") is not None:
                raise self.refuse(f"{_sql(node)!r}", "name a top-level column (no qualifier, no nested field)")
            column = self.resolve(node.name)
            self.read.add(column)
            t = pa.null() if self.schema is None else self.schema.field(column).type
            return _Value(t.value_type if pa.types.is_dictionary(t) else t, lambda rows: rows.column(column), _sql(node))
        value: Any
        if isinstance(node, exp.Literal) and not node.is_string:  # int if it fits, else bigint; double with a point or exponent
            try:
                value = int(node.name) if re.fullmatch(r"[0-9]+", node.name) else float(node.name)
            except ValueError:
                raise PipelineDefinitionError(f"{self.operator_id}: {node.name!r} in {self.text!r} is not a number") from None
            if isinstance(value, int) and value > _INT64_MAX:
                raise PipelineDefinitionError(f"{self.operator_id}: the number {node.name} in {self.text!r} does not fit a bigint")
            type_ = _F64 if isinstance(value, float) else _I32 if value < 2**31 else _I64
        elif isinstance(node, (exp.Null, exp.Boolean, exp.Literal)):  # null, a boolean, a string
            value = None if isinstance(node, exp.Null) else bool(node.this) if isinstance(node, exp.Boolean) else node.name
            type_ = pa.scalar(value).type
        else:
            rule = _rule(node)
            if rule is None:
                raise self.unsupported(node)
            compile_construct: Callable[[exp.Expr, _Rule, list[exp.Expr]], _Value] = getattr(self, f"_c_{rule.kind}")
            compiled = compile_construct(node, rule, self.operands(node, rule))
            return compiled if self.schema is not None else self.constant(None, pa.null(), compiled.sql)
        if self.schema is None:  # declaring: no value has a type
            value, type_ = None, pa.null()
        return self.constant(value, type_, _sql(node))

    def operands(self, node: exp.Expr, rule: _Rule) -> list[exp.Expr]:
        """The construct's operands, once its arguments, their number and its literals are what barrierflow evaluates."""
        for key, value in node.args.items():
            if key not in rule.keys and key not in rule.flags and value not in (None, False, [], ""):
                shown = _sql(value) if isinstance(value, exp.Expr) else repr(value)
                words, hint = _REFUSED_ARGS.get(key, (f"{key} {shown}", ""))
                raise self.refuse(f"{rule.name} with {words}", hint)
        operands = _operands(rule, node)
        low, high = rule.arity or (len(rule.keys), len(rule.keys))
        if not low <= len(operands) <= high:
            raise self.refuse(
                f"{rule.name} with {len(operands)} argument(s)", f"it takes {low}{'' if low == high else ' or more'}"
            )
        for position, kind in (rule.literals or {}).items():
            if position < len(operands):
                self.check_literal(rule, position, operands[position], kind)
        return operands

    def unsupported(self, node: exp.Expr) -> PipelineDefinitionError:
        for kinds, what, hint in (
            (exp.AggFunc, f"aggregate function {_name(node)}", "aggregate with key_by(...).aggregate(...) or a window"),
            (exp.Window, "a window function (OVER)", ""),
            ((exp.Subquery, exp.Query, exp.Exists), "a subquery", ""),
            (exp.Alias, "an alias (AS) inside an expression", "name the whole expression only"),
            (exp.Star, "*", "* stands alone, in select"),
            (exp.Func, f"function {_name(node)}", ""),
        ):
            if isinstance(node, kinds):
                return self.refuse(what, hint)
        return self.refuse(f"{_sql(node)!r} ({type(node).__name__})")

    def check_literal(self, rule: _Rule, position: int, operand: exp.Expr, kind: str) -> None:
        value: Any
        what, value = f"argument {position + 1} of {rule.name}", _literal(operand)
        if not isinstance(value, int if kind == "integer" else str):
            raise self.refuse(f"{what} as {_sql(operand)!r}", f"give {'an integer' if kind == 'integer' else 'a string'} literal")
        self.compile(operand)  # a number that fits
        try:
            if kind == "like":
                _like_pattern(str(value), "\\")
            elif kind == "replacement":
                _re2_replacement(str(value))
            elif kind in ("regex", "split") and pc.match_substring_regex(pa.array([""]), value)[0].as_py() and kind == "split":
                raise ValueError(f"split by {value!r}, which matches the empty string, is not supported")
        except pa.ArrowInvalid as exc:
            problem = f"regular expression {value!r} is not one RE2 compiles ({exc}); barrierflow uses RE2 syntax"
            raise PipelineDefinitionError(f"{self.operator_id}: {what} in {self.text!r}: {problem}") from None
        except ValueError as exc:
            raise PipelineDefinitionError(f"{self.operator_id}: {what} in {self.text!r}: {exc}") from None

    # -- helpers

    @staticmethod
    def constant(value: Any, type_: pa.DataType, sql: str) -> _Value:
        scalar = pa.scalar(value, type_)
        return _Value(type_, lambda rows: pa.repeat(scalar, rows.n), sql, constant=value)

    @staticmethod
    def apply(
        where: exp.Expr | str, type_: pa.DataType, call: Callable[..., pa.Array], *inputs: Any, fallible: bool = False, note: str = ""
    ) -> _Value:
        """The value ``call`` computes from its inputs' arrays (literals passed as they are); a failure names ``where``."""
        sql = where if isinstance(where, str) else _sql(where)

        def run(rows: _Rows) -> pa.Array:
            arguments = [i.run(rows) if isinstance(i, _Value) else i for i in inputs]
            try:
                return call(*arguments)
            except _Failure as exc:
                raise _Failure(f"{sql}: {exc}") from None
            except pa.ArrowInvalid as exc:  # an overflow of a checked kernel
                raise _Failure(f"{sql}: {'integer ' if pa.types.is_integer(type_) else ''}{exc}{note}") from None

        return _Value(type_, run, sql, fallible or any(isinstance(i, _Value) and i.fallible for i in inputs))

    def coerce(self, value: _Value, target: pa.DataType) -> _Value:
        """``value`` in the type ``target``, as Spark casts implicitly (a string literal read as that type, here)."""
        if value.type == target:
            return value
        return self.cast(value, target, value.sql, f"{value.sql} is not a {spark_type_name(target)}")

    def cast(self, value: _Value, target: pa.DataType, where: exp.Expr | str, what: str) -> _Value:
        """``value`` cast to ``target``: a literal once (a failure is the error ``what: why``), else for each record."""
        if value.constant is not _NO_CONSTANT:
            try:
                converted = _cast_values(pa.array([value.constant], value.type), target)[0]
            except _Failure as exc:
                raise self.error(f"{what}: {exc}") from None
            return self.constant(converted.as_py(), target, where if isinstance(where, str) else _sql(where))
        cast = functools.partial(_cast_values, target=target)
        return self.apply(where, target, cast, value, fallible=_cast_may_fail(value.type, target))

    def typed(self, value: _Value, kind: str, what: str) -> _Value:
        """``value`` as an operand of kind ``kind`` (:data:`_KINDS`) of ``what``, or the error saying it is not one."""
        need, takes, target = _KINDS[kind]
        if not (_is_null(value.type) or takes(value.type)):
            raise self.error(f"{what} {need}, not {value.sql} ({spark_type_name(value.type)})")
        if kind == "x" and pa.types.is_decimal(value.type):
            target = _F64
        return value if target is None else self.coerce(value, target)

    def meet(self, values: Sequence[_Value], what: str, literals: bool = False) -> tuple[pa.DataType, list[_Value]]:
        """The common type of ``values`` and the values in it; with ``literals`` (comparisons, IN, BETWEEN), string
        literals read as the others' type, as Spark reads ``x = '5'`` as ``x = 5`` for a number (date, timestamp) ``x``."""
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

    # -- constructs

    def _c_call(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        """A function of its operands: each read as its kind says (literals as values), null if one is of no type."""
        inputs: list[Any] = []
        for position, operand in enumerate(operands):
            if position in (rule.literals or {}):
                inputs.append(_literal(operand))
                continue
            kind = rule.args[min(position, len(rule.args) - 1)]
            if kind == "D" and isinstance(operand, exp.TsOrDsToDate) and not operand.args.get("format"):
                operand = operand.this  # sqlglot's reading of year(x): x as a date
            inputs.append(self.typed(self.compile(operand), kind, rule.name))
        values = [i for i in inputs if isinstance(i, _Value)]
        out = rule.out or values[0].type
        if rule.args != "*" and any(_is_null(v.type) for v in values):
            return self.constant(None, out, _sql(node))
        assert rule.call is not None
        call = rule.call
        return self.apply(node, out, lambda *arguments: call(*arguments).cast(out), *inputs, fallible=rule.fails)

    def _c_arith(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        op = rule.name
        a, b = (self.typed(self.compile(o), {"/": "d", "div": "I"}.get(op, "n"), op) for o in operands)
        target = _wider(a.type, b.type)
        if _is_null(target):
            return self.constant(None, target, _sql(node))
        a, b = self.coerce(a, target), self.coerce(b, target)
        fallible = pa.types.is_integer(target) or op in ("/", "%", "div")
        note = " (Spark's ANSI arithmetic fails too; cast to bigint or double first)"
        return self.apply(node, target, functools.partial(_arithmetic, op), a, b, fallible=fallible, note=note)

    def _c_compare(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        return self.comparison(node, rule.name, self.compile(operands[0]), self.compile(operands[1]))

    def comparison(self, node: exp.Expr, op: str, left: _Value, right: _Value) -> _Value:
        target, (a, b) = self.meet([left, right], f"comparing with {op}", literals=True)
        if _is_list(target) or pa.types.is_struct(target):
            raise self.error(f"{op} compares single values, not {spark_type_name(target)}")
        return self.apply(node, _B, functools.partial(_compare, op), a, b)

    def _c_logic(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        return self.logic(node, rule.name, *(self.typed(self.compile(o), "b", rule.name) for o in operands))

    def logic(self, node: exp.Expr, op: str, a: _Value, b: _Value) -> _Value:
        combine = pc.and_kleene if op == "AND" else pc.or_kleene

        def run(rows: _Rows) -> pa.Array:
            x = a.run(rows)
            if not b.fallible:
                return combine(x, b.run(rows))
            # The right side only where the left does not decide (as Spark, which never evaluates it there).
            undecided = np.flatnonzero(~_mask(pc.invert(x) if op == "AND" else x))
            return combine(x, _scatter(rows.n, _B, [(undecided, b.run(rows.take(undecided)))]))

        return _Value(_B, run, _sql(node), a.fallible or b.fallible)

    def _c_is_(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        if not isinstance(operands[1], (exp.Null, exp.Boolean)):
            raise self.refuse(f"IS {_sql(operands[1])}", "IS takes NULL, TRUE or FALSE")
        if isinstance(operands[1], exp.Null):
            return self.apply(node, _B, pc.is_null, self.compile(operands[0]))
        a, truth = self.typed(self.compile(operands[0]), "b", "IS TRUE/FALSE"), bool(operands[1].this)
        return self.apply(node, _B, lambda x: pc.fill_null(x if truth else pc.invert(x), False), a)

    def _c_in_(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        _, values = self.meet([self.compile(o) for o in operands], "IN", literals=True)

        # x = v1 OR x = v2 ...: null when none is and a null was met
        return self.apply(node, _B, lambda x, *vs: functools.reduce(pc.or_kleene, [_compare("=", x, v) for v in vs]), *values)

    def _c_between(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        x, low, high = (self.compile(o) for o in operands)
        return self.logic(node, "AND", self.comparison(node, ">=", x, low), self.comparison(node, "<=", x, high))

    def _c_like(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        escape = "\\"
        if isinstance(node, exp.Escape):
            escape = _literal(operands[1])
            if not isinstance(operands[0], (exp.Like, exp.ILike)) or not isinstance(escape, str) or len(escape) != 1:
                raise self.refuse("ESCAPE", "write x LIKE 'pattern' ESCAPE 'c' with one character")
            like_rule, pattern = _RULES[type(operands[0])], operands[0].expression
            if not isinstance(_literal(pattern), str):
                raise self.refuse(f"argument 2 of {like_rule.name} as {_sql(pattern)!r}", "give a string literal")
            try:
                _like_pattern(_literal(pattern), escape)
            except ValueError as exc:
                raise PipelineDefinitionError(f"{self.operator_id}: the LIKE pattern in {self.text!r}: {exc}") from None
            node = operands[0]
            operands = _operands(_RULES[type(node)], node)
        a = self.typed(self.compile(operands[0]), "s", _RULES[type(node)].name)
        pattern = _like_pattern(_literal(operands[1]), escape)
        ignore_case, negate = isinstance(node, exp.ILike), bool(node.args.get("negate"))
        like = functools.partial(pc.match_like, pattern=pattern, ignore_case=ignore_case)
        return self.apply(node, _B, (lambda strings: pc.invert(like(strings))) if negate else like, a)

    def branches(self, node: exp.Expr, conditions: Sequence[_Value], results: Sequence[_Value], default: _Value | None) -> _Value:
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

        return _Value(target, run, _sql(node), any(v.fallible for v in [*conditions, *typed]))

    def _c_case(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        subject = None if node.this is None else self.compile(node.this)
        conditions, results = [], []
        for branch in node.args.get("ifs") or []:
            if subject is None:
                conditions.append(self.typed(self.compile(branch.this), "b", "a WHEN condition"))
            else:
                conditions.append(self.comparison(branch, "=", subject, self.compile(branch.this)))
            results.append(self.compile(branch.args["true"]))
        default = node.args.get("default")
        return self.branches(node, conditions, results, self.compile(default) if default is not None else None)

    def _c_if_(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        condition = self.typed(self.compile(operands[0]), "b", "if's condition")
        return self.branches(node, [condition], [self.compile(operands[1])], self.compile(operands[2]))

    def _c_coalesce(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
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

        return _Value(target, run, _sql(node), any(v.fallible for v in values))

    def _c_nullif(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        a, b = (self.compile(o) for o in operands)
        if _is_null(a.type):
            return a
        equal = self.comparison(node, "=", a, b)
        return self.apply(node, a.type, lambda x, eq: pc.if_else(pc.fill_null(eq, False), pa.nulls(len(x), x.type), x), a, equal)

    def _c_cast(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        if node.args.get("safe"):
            raise self.refuse("try_cast", "cast fails on a value the type cannot hold, as Spark's ANSI cast")
        to = node.args.get("to")
        if not isinstance(to, exp.DataType) or to.this not in _CAST_TARGETS:
            target = _sql(to) if isinstance(to, exp.Expr) else to
            raise self.refuse(
                f"cast to {target}", "cast to string, tinyint, smallint, int, bigint, float, double, boolean, date or timestamp"
            )
        a, target = self.compile(operands[0]), _CAST_TARGETS[to.this]
        if not _castable(a.type, target):
            hint = ""
            if _is_numeric(a.type) and _is_datetime(target):
                hint = "; use timestamp_seconds, timestamp_millis or timestamp_micros"
            elif _is_datetime(a.type) and _is_numeric(target):
                hint = "; use unix_seconds, unix_millis or unix_micros"
            raise self.error(
                f"cast of {a.sql} ({spark_type_name(a.type)}) to {spark_type_name(target)} is not allowed (as in Spark's ANSI mode){hint}"
            )
        return self.cast(a, target, node, _sql(node))  # cast('2024-01-31' as date), 100L: typed literals

    def _c_trim(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        if len(operands) == 2 and (_literal(node.this) is not None or not isinstance(_literal(node.expression), str)):
            raise self.refuse(
                f"{_sql(node)!r}", "write trim(s), or TRIM(BOTH|LEADING|TRAILING 'chars' FROM s) with literal chars"
            )
        a = self.typed(self.compile(node.this), "s", "trim")
        chars = _literal(node.expression) if node.args.get("expression") is not None else " "
        position = str(node.args.get("position") or "BOTH").upper()
        function = {"LEADING": pc.utf8_ltrim, "TRAILING": pc.utf8_rtrim}.get(position, pc.utf8_trim)
        return self.apply(node, _S, lambda strings: function(strings, chars) if chars else strings, a)

    def _c_concat_ws(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        parts = [self.typed(self.compile(o), "s", "concat_ws") for o in operands[1:]]
        if not parts:
            return self.constant("", _S, _sql(node))
        return self.apply(node, _S, functools.partial(_concat_ws, _literal(operands[0])), *parts)

    def _c_element_at(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        if node.args.get("offset") != 1:
            raise self.refuse("array[index]", "write element_at(array, position), 1-based")
        if node.args.get("safe"):
            raise self.refuse("try_element_at", "element_at fails on a position out of bounds, as Spark's ANSI mode")
        if _literal(operands[1]) == 0:
            raise PipelineDefinitionError(f"{self.operator_id}: element_at position 0 in {self.text!r}: SQL arrays start at 1")
        array = self.typed(self.compile(operands[0]), "A", "element_at")
        position = self.coerce(self.typed(self.compile(operands[1]), "i", "element_at's position"), _I64)
        if _is_null(array.type):
            return self.constant(None, pa.null(), _sql(node))
        return self.apply(node, array.type.value_type, _element_at, array, position, fallible=True)

    def _c_extreme(self, node: exp.Expr, rule: _Rule, operands: list[exp.Expr]) -> _Value:
        target, values = self.meet([self.compile(o) for o in operands], rule.name)
        if not (_is_numeric(target) or _is_string(target) or _is_datetime(target) or _is_null(target)):
            raise self.error(f"{rule.name} compares single values, not {spark_type_name(target)}")
        if _is_null(target):
            return self.constant(None, target, _sql(node))
        return self.apply(node, target, functools.partial(_extreme, rule.name == "greatest"), *values)
