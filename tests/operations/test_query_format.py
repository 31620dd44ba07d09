"""barrierflow.operations.query: output formats, the tables a query opens and the state views' WITH clause (no tables needed)."""

from __future__ import annotations

import csv
import io
import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pyarrow as pa
import pytest

from barrierflow.operations.query import _named_tables, _with_views, format_rows, to_jsonable

UTC = timezone.utc


@pytest.fixture
def sample() -> pa.Table:
    return pa.table(
        {
            "sensor_id": pa.array(["s-1", "s-22", None]),
            "ts": pa.array(
                [
                    datetime(2024, 3, 1, 12, 0, tzinfo=UTC),
                    datetime(2024, 3, 1, 12, 0, 1, 500_000, tzinfo=UTC),
                    None,
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "avg": pa.array([21.5, float("nan"), None], pa.float64()),
            "values": pa.array([[1.0, 2.0], [], None], pa.list_(pa.float64())),
        }
    )


# -- json -----------------------------------------------------------------------


def test_json_rows_with_iso_utc_timestamps(sample: pa.Table) -> None:
    rows = json.loads(format_rows(sample, "json"))
    assert rows == [
        {"sensor_id": "s-1", "ts": "2024-03-01T12:00:00Z", "avg": 21.5, "values": [1.0, 2.0]},
        {"sensor_id": "s-22", "ts": "2024-03-01T12:00:01.500000Z", "avg": None, "values": []},  # NaN -> null
        {"sensor_id": None, "ts": None, "avg": None, "values": None},
    ]


def test_json_timestamps_in_other_zones_and_naive_are_utc() -> None:
    table = pa.table(
        {
            "paris": pa.array([datetime(2024, 1, 1, 0, 0, tzinfo=UTC)], pa.timestamp("ms", tz="Europe/Paris")),
            "naive": pa.array([datetime(2024, 1, 1, 5, 6, 7)], pa.timestamp("s")),
            "day": pa.array([date(2024, 2, 29)], pa.date32()),
            "blob": pa.array([b"\x00\xff"], pa.binary()),
        }
    )
    rows = json.loads(format_rows(table, "json"))
    assert rows == [{"paris": "2024-01-01T00:00:00Z", "naive": "2024-01-01T05:06:07Z", "day": "2024-02-29", "blob": "00ff"}]


def test_json_of_empty_table_is_an_empty_list() -> None:
    assert json.loads(format_rows(pa.table({"a": pa.array([], pa.int64())}), "json")) == []


def test_to_jsonable_nested_values() -> None:
    value = {"when": datetime(2024, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1))), "xs": (float("nan"), 1)}
    assert to_jsonable(value) == {"when": "2024-01-01T00:00:00Z", "xs": [None, 1]}


# -- csv ------------------------------------------------------------------------


def test_csv(sample: pa.Table) -> None:
    out = format_rows(sample, "csv")
    assert out.splitlines()[0] == "sensor_id,ts,avg,values"
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert parsed == [
        {"sensor_id": "s-1", "ts": "2024-03-01T12:00:00Z", "avg": "21.5", "values": "[1.0, 2.0]"},
        {"sensor_id": "s-22", "ts": "2024-03-01T12:00:01.500000Z", "avg": "", "values": "[]"},
        {"sensor_id": "", "ts": "", "avg": "", "values": ""},
    ]
    assert not out.endswith("\n")


def test_csv_quotes_commas_and_quotes() -> None:
    out = format_rows(pa.table({"text": ["a,b", 'say "hi"']}), "csv")
    assert list(csv.reader(io.StringIO(out))) == [["text"], ["a,b"], ['say "hi"']]


def test_csv_of_empty_table_is_the_header() -> None:
    assert format_rows(pa.table({"a": pa.array([], pa.int64()), "b": pa.array([], pa.string())}), "csv") == "a,b"


# -- table ----------------------------------------------------------------------


def test_table_format_aligns_columns(sample: pa.Table) -> None:
    out = format_rows(sample.select(["sensor_id", "avg"]), "table")
    assert out.splitlines() == [
        "sensor_id | avg ",
        "----------+-----",
        "s-1       | 21.5",
        "s-22      |     ",
        "          |     ",
        "(3 rows)",
    ]


def test_table_format_row_counts() -> None:
    one = format_rows(pa.table({"n": [1]}), "table")
    assert one.splitlines()[-1] == "(1 row)"
    none = format_rows(pa.table({"n": pa.array([], pa.int64())}), "table")
    assert none.splitlines() == ["n", "-", "(0 rows)"]


def test_table_format_shows_iso_timestamps(sample: pa.Table) -> None:
    out = format_rows(sample.select(["ts"]).slice(0, 1), "table")
    assert out.splitlines()[2].strip() == "2024-03-01T12:00:00Z"


# -- known gaps in json output (see the report) -----------------------------------------


def test_json_decimal_column() -> None:
    table = pa.table({"d": pa.array([Decimal("1.50")], pa.decimal128(10, 2))})
    assert json.loads(format_rows(table, "json")) in ([{"d": "1.50"}], [{"d": 1.5}])


def test_json_duration_column() -> None:
    table = pa.table({"d": pa.array([timedelta(seconds=10)], pa.duration("us"))})
    assert json.loads(format_rows(table, "json")) == [{"d": 10.0}]


def test_json_infinity_is_valid_json() -> None:
    out = format_rows(pa.table({"x": pa.array([float("inf")], pa.float64())}), "json")

    def reject(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    json.loads(out, parse_constant=reject)


# -- _with_views ------------------------------------------------------------------

V1 = '"op__s" AS (SELECT 1)'
V2 = '"op__t" AS (SELECT 2)'


def test_with_views_no_views_leaves_sql_unchanged() -> None:
    assert _with_views("WITH x AS (SELECT 1) SELECT * FROM x", []) == "WITH x AS (SELECT 1) SELECT * FROM x"


def test_with_views_prepends_a_with_clause() -> None:
    assert _with_views("SELECT * FROM op__s", [V1, V2]) == f"WITH {V1}, {V2} SELECT * FROM op__s"


@pytest.mark.parametrize("keyword", ["WITH", "with", "With", "  with\n"])
def test_with_views_merges_with_a_user_with_clause(keyword: str) -> None:
    sql = f"{keyword} top AS (SELECT * FROM op__s) SELECT * FROM top"
    assert _with_views(sql, [V1, V2]) == f"WITH {V1}, {V2}, top AS (SELECT * FROM op__s) SELECT * FROM top"


def test_with_views_keeps_recursive() -> None:
    sql = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r"
    assert _with_views(sql, [V1]) == (
        f"WITH RECURSIVE {V1}, r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r"
    )


def test_with_views_does_not_mistake_identifiers_starting_with_with() -> None:
    assert _with_views("without_alias", [V1]) == f"WITH {V1} without_alias"


def test_with_views_result_runs_on_datafusion() -> None:
    from deltalake import QueryBuilder

    sql = _with_views("WITH b AS (SELECT 2 AS y) SELECT x, y FROM a, b", ["a AS (SELECT 1 AS x)"])
    assert pa.table(QueryBuilder().execute(sql).read_all()).to_pylist() == [{"x": 1, "y": 2}]


def test_with_views_after_a_leading_comment() -> None:
    from deltalake import QueryBuilder

    sql = _with_views("-- my query\nWITH b AS (SELECT 2 AS y) SELECT x, y FROM a, b", ["a AS (SELECT 1 AS x)"])
    assert pa.table(QueryBuilder().execute(sql).read_all()).to_pylist() == [{"x": 1, "y": 2}]


# -- the tables a query opens ---------------------------------------------------

TABLES = ["totals", "country_totals", "rising__last", "dead_letter", "checkpoints"]


@pytest.mark.parametrize(
    ("sql", "opened"),
    [
        ("select * from country_totals", {"country_totals"}),  # not "totals", a word inside it
        ('SELECT t.* FROM "Totals" t JOIN dead_letter d ON true', {"totals", "dead_letter"}),
        ("select * from rising__last", {"rising__last"}),
        ("select * from rising__last__changelog", {"rising__last"}),
        ("select epoch from checkpoints", {"checkpoints"}),
        ("select 1", set()),
        ("show tables", set(TABLES)),
        ("select * from information_schema.tables", set(TABLES)),
    ],
)
def test_a_query_opens_only_the_tables_it_names(sql: str, opened: set[str]) -> None:
    assert _named_tables(sql, TABLES) == opened
