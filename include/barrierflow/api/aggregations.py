"""Aggregations a pipeline declares, over a key's records (running) or a window's values.

Each names its output column: by keyword (``aggregate("totals", total=Sum("amount"))``) or its own ``name``.
How they are kept and computed: :mod:`barrierflow.operators.aggregate` and :mod:`barrierflow.operators.window`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Mapping

from barrierflow.core.errors import PipelineDefinitionError

__all__ = ["Aggregation", "Count", "Sum", "Min", "Max", "Avg", "Percentile", "named_aggregations"]


@dataclass(frozen=True)
class Aggregation:
    """An aggregate over one column; ``name`` is its output column."""

    column: str | None
    name: str

    @property
    def value_column(self) -> str | None:
        """The column whose values it aggregates (None: it only counts records)."""
        return self.column


@dataclass(frozen=True)
class Count(Aggregation):
    column: str | None = None
    name: str = "count"

    @property
    def value_column(self) -> str | None:
        return None


@dataclass(frozen=True)
class Sum(Aggregation):
    name: str = "sum"


@dataclass(frozen=True)
class Min(Aggregation):
    name: str = "min"


@dataclass(frozen=True)
class Max(Aggregation):
    name: str = "max"


@dataclass(frozen=True)
class Avg(Aggregation):
    name: str = "avg"


@dataclass(frozen=True)
class Percentile(Aggregation):
    """Nearest-rank percentile, windows only (a running one would need every value): the value at 1-based ceil(q x n), ascending."""

    q: float = 0.5
    name: str = "p50"

    def __post_init__(self) -> None:
        if not 0 < self.q <= 1:
            raise PipelineDefinitionError(f"percentile {self.name}: q must be in (0, 1]")

    def rank(self, count: int) -> int:
        """The 1-based position of the percentile among ``count`` sorted values: ceil(q x count), exactly."""
        frac = Fraction(self.q).limit_denominator(1_000_000)
        return (frac.numerator * count + frac.denominator - 1) // frac.denominator


def named_aggregations(
    operator_id: str,
    positional: tuple[Aggregation, ...],
    named: Mapping[str, Aggregation],
    reserved: tuple[str, ...] = (),
) -> tuple[Aggregation, ...]:
    """The aggregations of one operator, each under its output column.

    Positional ones keep their own ``name`` (``Sum("v", "total")``, or the class's default); a keyword names its aggregation
    (``total=Sum("v")``). Output columns must be unique, not start with ``_`` (the engine's) and not clash with ``reserved`` (the
    key and, for windows, the window's columns).
    """
    given = [*positional, *named.values()]
    wrong = [f"{a!r}" for a in given if not isinstance(a, Aggregation)]
    if wrong:
        raise PipelineDefinitionError(
            f"{operator_id}: {', '.join(wrong)} is not an aggregation; give Count(), Sum(column), Min(column), "
            "Max(column), Avg(column) or Percentile(column, q=...)"
        )
    aggregations = (*positional, *(replace(agg, name=name) for name, agg in named.items()))
    if not aggregations:
        raise PipelineDefinitionError(f"{operator_id}: no aggregation given, e.g. aggregate({operator_id!r}, count=Count())")
    names = [a.name for a in aggregations]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineDefinitionError(
            f"{operator_id}: output column(s) {duplicates} named more than once; name each aggregation by keyword, "
            f"e.g. total_a=Sum('a'), total_b=Sum('b')"
        )
    bad = sorted({n for n in names if not n or n.startswith("_") or n in reserved})
    if bad:
        raise PipelineDefinitionError(
            f"{operator_id}: output column(s) {bad} are not allowed: a name must not be empty, start with _ "
            f"(the engine's columns) or be one of {list(reserved)}"
        )
    return aggregations
