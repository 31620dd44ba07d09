"""Tests of the ``orders_payments`` reference oracle: tiny inputs, hand-computed expectations."""

from __future__ import annotations

import json
import math
import pathlib
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from .orders_payments_reference import (
    OrdersPaymentsResult,
    epoch_sum,
    parse_timestamp,
    read_lines,
    run_reference,
    split_epochs,
    validate_line,
)

__all__: list[str] = []

UTC = timezone.utc


def t(minute: int, second: int = 0) -> datetime:
    """2024-01-01T00:00:00Z plus ``minute`` minutes and ``second`` seconds (negative: the day before)."""
    return datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=minute, seconds=second)


def iso(minute: int, second: int = 0) -> str:
    return t(minute, second).strftime("%Y-%m-%dT%H:%M:%SZ")


def order(oid: str, minute: int, amount: float = 10.0, customer: str = "c1", country: str = "DE", second: int = 0) -> str:
    return json.dumps({"order_id": oid, "customer_id": customer, "country": country, "ts": iso(minute, second), "amount": amount})


def payment(
    pid: str, oid: str, minute: int, amount: float = 10.0, customer: str = "c1", country: str = "DE", second: int = 0
) -> str:
    return json.dumps(
        {
            "payment_id": pid,
            "order_id": oid,
            "customer_id": customer,
            "country": country,
            "ts": iso(minute, second),
            "amount": amount,
        }
    )


def threshold(country: str | None, limit: float | None) -> str:
    return json.dumps({"country": country, "limit": limit})


def run(tmp_path: pathlib.Path, epochs: list[dict[str, list[str]]]) -> OrdersPaymentsResult:
    """Write one file per source and epoch (empty when the epoch has no lines for it), run with one file per epoch."""
    landing = tmp_path / "landing"
    for source in ("orders", "payments", "thresholds"):
        directory = landing / source
        directory.mkdir(parents=True, exist_ok=True)
        for n, lines in enumerate(epochs, start=1):
            (directory / f"e{n:03d}.jsonl").write_text("".join(line + "\n" for line in lines.get(source, [])))
    split = split_epochs(landing, 1)
    assert len(split) == len(epochs)
    return run_reference(split)


def without(rows: list[dict[str, Any]], *columns: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in columns} for row in rows]


# --------------------------------------------------------------------------- epochs and lines


def test_split_epochs_chunks_each_source_and_ignores_hidden_files(tmp_path: pathlib.Path) -> None:
    for source, names in {
        "orders": ["b.jsonl", "a.jsonl", "c.jsonl", ".d.jsonl", "_e.jsonl", "f.json"],
        "payments": ["x.jsonl"],
    }.items():
        (tmp_path / source).mkdir()
        for name in names:
            (tmp_path / source / name).write_text("")
    # No thresholds directory at all.
    epochs = split_epochs(tmp_path, 2)
    assert [{s: [p.name for p in files] for s, files in e.items()} for e in epochs] == [
        {"orders": ["a.jsonl", "b.jsonl"], "payments": ["x.jsonl"], "thresholds": []},
        {"orders": ["c.jsonl"], "payments": [], "thresholds": []},
    ]
    assert split_epochs(tmp_path / "nothing", 3) == []
    with pytest.raises(ValueError):
        split_epochs(tmp_path, 0)


def test_read_lines_splits_on_newline_and_strips_one_cr(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"a\r\n\nb\rc\r\nlast")
    assert read_lines(path) == [b"a", b"", b"b\rc", b"last"]
    path.write_bytes(b"a\n")
    assert read_lines(path) == [b"a"]


# --------------------------------------------------------------------------- dead letters


GOOD_ORDER = {"order_id": "o", "customer_id": "c", "country": "DE", "ts": "2024-01-01T00:00:00Z", "amount": 1.5}
_DROP = object()


def variant(**changes: object) -> bytes:
    obj = {**GOOD_ORDER, **changes}
    return json.dumps({k: v for k, v in obj.items() if v is not _DROP}).encode()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe{}", "invalid_utf8"),
        (b"garbage", "not_json"),
        (b'{"order_id": "o"', "not_json"),
        (b"[1, 2]", "not_an_object"),
        (b'"a string"', "not_an_object"),
        (b"42", "not_an_object"),
        (b"null", "not_an_object"),
        (b"true", "not_an_object"),
        (variant(amount="12"), "wrong_type"),  # a string is never coerced to a number
        (variant(amount=True), "wrong_type"),
        (variant(amount=[1]), "wrong_type"),
        (variant(amount=""), "wrong_type"),
        (variant(ts="yesterday"), "wrong_type"),
        (variant(ts="2024-13-01T00:00:00Z"), "wrong_type"),
        (variant(ts=1.5), "wrong_type"),  # only an integer number of seconds is a timestamp
        (variant(ts=""), "wrong_type"),
        (variant(ts=_DROP), "missing_field"),
        (variant(amount=None), "missing_field"),
        (b"{}", "missing_field"),
        (variant(order_id=None), "null_key"),
        (variant(customer_id=_DROP), "null_key"),
        (variant(country=None), "null_key"),
        (variant(country=""), "empty_key"),
        (variant(order_id=""), "empty_key"),
        # Precedence: a wrong type before a missing field before a key; keys by column name.
        (variant(order_id=None, ts=_DROP, amount="x"), "wrong_type"),
        (variant(order_id=None, ts=_DROP), "missing_field"),
        (variant(order_id=None, country=""), "empty_key"),
        (variant(order_id="", customer_id=None), "null_key"),
        # A repeated name: the last value counts, but every value must convert.
        (variant(amount=1.0)[:-1] + b', "amount": "x"}', "wrong_type"),
        (b'{"amount": "x", ' + variant(amount=1.0)[1:], "wrong_type"),
        (variant(amount=1.0)[:-1] + b', "amount": null}', "missing_field"),
        (variant(order_id="o")[:-1] + b', "order_id": ""}', "empty_key"),
    ],
)
def test_each_dead_letter_rule_for_orders(raw: bytes, reason: str) -> None:
    assert validate_line("orders", raw) == reason


def test_values_the_schema_accepts() -> None:
    assert validate_line("orders", b"   \t ") is None  # blank: neither a record nor a dead letter
    assert validate_line("orders", variant(amount=7)) == {**GOOD_ORDER, "amount": 7.0, "ts": t(0)}  # integer -> float64
    assert validate_line("orders", variant(ts="2024-01-01T01:30:00+01:30")) == {**GOOD_ORDER, "ts": t(0)}
    assert validate_line("orders", variant(ts="2024-01-01T00:00:00")) == {**GOOD_ORDER, "ts": t(0)}  # no offset: UTC
    assert validate_line("orders", variant(ts="2024-01-01 00:00:00.1234567Z")) == {
        **GOOD_ORDER,
        "ts": t(0) + timedelta(microseconds=123456),
    }
    assert validate_line("orders", variant(ts=1704067260)) == {**GOOD_ORDER, "ts": t(1)}  # integer: epoch seconds
    assert validate_line("orders", variant(order_id=123, extra={"x": 1})) == {**GOOD_ORDER, "order_id": "123", "ts": t(0)}
    assert validate_line("orders", variant(order_id=True)) == {**GOOD_ORDER, "order_id": "true", "ts": t(0)}
    assert validate_line("orders", b'{"amount": null, ' + variant(amount=2.5)[1:]) == {**GOOD_ORDER, "amount": 2.5, "ts": t(0)}
    nan = validate_line("orders", variant(amount="NaN"))
    assert isinstance(nan, dict) and math.isnan(nan["amount"])
    assert validate_line("orders", variant(amount="-Infinity")) == {**GOOD_ORDER, "amount": -math.inf, "ts": t(0)}
    assert validate_line("orders", variant(amount=1e400)) == {**GOOD_ORDER, "amount": math.inf, "ts": t(0)}
    # Payments key payment_id too; thresholds have no key, and country is required.
    good_payment = payment("p", "o", 0).encode()
    assert isinstance(validate_line("payments", good_payment), dict)
    assert validate_line("payments", good_payment.replace(b'"p"', b'""', 1)) == "empty_key"
    assert validate_line("thresholds", b'{"country": null}') == "missing_field"  # a broadcast map key is never null
    assert validate_line("thresholds", b'{"country": "DE", "limit": "high"}') == "wrong_type"


def test_parse_timestamp_forms() -> None:
    assert parse_timestamp("2024-01-01T00:01:00Z") == t(1)
    assert parse_timestamp("2024-01-01T00:01:00+0000") == t(1)
    assert parse_timestamp("2024-01-01T02:01:00+02") == t(1)
    assert parse_timestamp("2023-12-31T19:01:00-05:00") == t(1)
    assert parse_timestamp("2024-01-01T00:01") == t(1)
    assert parse_timestamp("2024-01-01") == t(0)
    assert parse_timestamp("2024-01-01T01:01:00 Europe/Berlin") == t(1)
    assert parse_timestamp("2024-01-01T00:01:00+25:00") is None
    assert parse_timestamp("01/01/2024") is None
    assert parse_timestamp("2024-02-30T00:00:00Z") is None


def test_dead_letters_carry_source_file_and_line(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {
                "orders": [order("o1", 0), "", "garbage", "  ", variant(amount="x").decode(), order("o2", 1)],
                "payments": ["[]", payment("p1", "o1", 1)],
                "thresholds": ['{"country": "DE", "limit": true}', threshold("DE", 5.0)],
            },
            {"orders": ["{}"]},
        ],
    )
    assert res.dead_letters == [
        ("orders", "e001.jsonl", 3, "not_json"),
        ("orders", "e001.jsonl", 5, "wrong_type"),
        ("payments", "e001.jsonl", 1, "not_an_object"),
        ("thresholds", "e001.jsonl", 1, "wrong_type"),
        ("orders", "e002.jsonl", 1, "missing_field"),
    ]
    assert res.seen_order_ids == {"o1", "o2"} and res.fraud_limits == {"DE": 5.0}


# --------------------------------------------------------------------------- watermarks and dedup


def test_watermark_is_the_minimum_of_both_streams_and_none_until_both_have_records(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {"orders": [order("o1", 10)]},
            {"payments": [payment("p1", "o1", 5)]},
            {"orders": [order("o2", 3)], "payments": [payment("p2", "o2", 30)]},
        ],
    )
    assert res.stream_watermarks == {
        1: {"orders": t(9), "payments": None},
        2: {"orders": t(9), "payments": t(4)},
        3: {"orders": t(9), "payments": t(29)},  # an order older than the maximum does not lower it
    }
    assert res.watermarks == {1: None, 2: t(4), 3: t(9)}


def test_duplicates_first_arrival_wins_forever(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {
                "orders": [order("o1", 0, 10.0), order("o1", 1, 99.0), order("o2", 0, 1.0, country="FR")],
                "payments": [payment("p1", "o1", 5, 10.0), payment("p1", "o1", 6, 77.0)],
            },
            {"orders": [order("o1", 2, 50.0)], "payments": [payment("p1", "o1", 7, 66.0)]},
        ],
    )
    assert without(res.paid_orders, "_epoch") == [
        {
            "order_id": "o1",
            "customer_id": "c1",
            "country": "DE",
            "ordered_at": t(0),
            "order_amount": 10.0,
            "payment_id": "p1",
            "paid_at": t(5),
            "paid_amount": 10.0,
        }
    ]
    assert res.country_totals == {"DE": {"orders": 1, "revenue": 10.0}, "FR": {"orders": 1, "revenue": 1.0}}
    assert res.seen_payment_ids == {"p1"}
    assert res.stream_watermarks[2] == {"orders": t(-1), "payments": t(4)}  # duplicates do not move a watermark


# --------------------------------------------------------------------------- interval join


def test_join_bounds_are_inclusive_at_zero_and_fifteen_minutes(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {
                "orders": [order("o1", 0)],
                "payments": [
                    payment("p-before", "o1", -1, second=59),
                    payment("p0", "o1", 0),
                    payment("p15", "o1", 15),
                    payment("p-after", "o1", 15, second=1),
                    payment("p-other", "o2", 5),
                ],
            }
        ],
    )
    assert [(r["order_id"], r["payment_id"], r["paid_at"], r["_epoch"]) for r in res.paid_orders] == [
        ("o1", "p0", t(0), 1),
        ("o1", "p15", t(15), 1),
    ]
    assert res.late_payments == []


def test_pair_across_epochs_is_emitted_in_the_epoch_of_the_later_record(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {"orders": [order("o1", 0)], "payments": [payment("px", "ox", 1)]},  # W(1) = 23:59
            {"payments": [payment("p1", "o1", 10)]},
            {"payments": [payment("p2", "o1", 14)]},  # W(2) = 23:59 still: o1 is kept
        ],
    )
    assert res.watermarks == {1: t(-1), 2: t(-1), 3: t(-1)}
    assert [(r["payment_id"], r["_epoch"]) for r in res.paid_orders] == [("p1", 2), ("p2", 3)]


def test_payment_before_its_order_pairs_when_the_order_arrives_and_the_order_is_not_unpaid(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {"payments": [payment("p1", "o1", 5, 20.0)]},  # no order yet: W(1) = -infinity, p1 kept
            {"orders": [order("o1", 0, 20.0), order("o2", 40, 1.0, customer="c2")]},  # W(2) = 00:04
            {"payments": [payment("p9", "o9", 40, customer="c9")]},  # W(3) = 00:39: o1's timer fires
        ],
    )
    assert without(res.paid_orders, "_epoch") == [
        {
            "order_id": "o1",
            "customer_id": "c1",
            "country": "DE",
            "ordered_at": t(0),
            "order_amount": 20.0,
            "payment_id": "p1",
            "paid_at": t(5),
            "paid_amount": 20.0,
        }
    ]
    assert res.paid_orders[0]["_epoch"] == 2
    assert res.watermarks == {1: None, 2: t(4), 3: t(39)}
    assert res.unpaid_orders == []  # paid in its window: no unpaid row
    assert res.pending_timers == {"o2": [t(55)], "o9": [t(55)]}


def test_late_payment_goes_to_late_payments_and_still_reaches_the_fraud_check(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {
                "orders": [order("o1", 0), order("o9", 30)],
                "payments": [payment("p9", "o9", 30)],
                "thresholds": [threshold("DE", 100.0)],
            },
            {"payments": [payment("p1", "o1", 5, 500.0), payment("p-edge", "o9", 29)]},
        ],
    )
    assert res.watermarks[1] == t(29)
    # p1 (00:05 < W(1) = 00:29) is late; p-edge at exactly W(1) is not (and is before o9: no pair).
    assert res.late_payments == [{"payment_id": "p1", "order_id": "o1", "ts": t(5), "amount": 500.0, "_epoch": 2}]
    assert [(r["order_id"], r["payment_id"], r["_epoch"]) for r in res.paid_orders] == [("o9", "p9", 1)]
    assert res.flagged_payments == [
        {"payment_id": "p1", "order_id": "o1", "country": "DE", "amount": 500.0, "limit": 100.0, "flagged": 1, "_epoch": 2}
    ]
    # o1's deadline 00:15 <= W(1): decided unpaid in epoch 1, before the late payment arrived.
    assert [(r["order_id"], r["deadline"], r["_epoch"]) for r in res.unpaid_orders] == [("o1", t(15), 1)]


def test_join_state_cleanup_times(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {"orders": [order("o1", 0), order("o2", 20)], "payments": [payment("p2", "o2", 21), payment("p3", "o3", 30)]},
        ],
    )
    # W(1) = 00:19: o1 leaves state when W >= ts + 15 min (00:15), o2 stays; payments stay while ts > W.
    assert res.watermarks[1] == t(19)
    assert [r["order_id"] for r in res.join_left] == ["o2"]
    assert [r["payment_id"] for r in res.join_right] == ["p2", "p3"]


def test_late_order_is_dropped_by_the_join_but_counted_and_decided_unpaid_in_its_epoch(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {
                "orders": [order("o9", 30, 1.0, customer="c9")],
                "payments": [payment("p1", "o1", 5, 3.0), payment("p9", "o9", 30, 1.0, customer="c9")],
            },
            {"orders": [order("o1", 0, 3.0)]},
        ],
    )
    assert res.watermarks == {1: t(29), 2: t(29)}
    assert res.dropped_late_orders == [(2, "o1")]
    assert res.paid_orders[0]["order_id"] == "o9" and len(res.paid_orders) == 1
    # p1's own timer (00:20 <= W(1)) forgot it in epoch 1, so o1 is decided unpaid in epoch 2.
    assert res.unpaid_orders == [
        {
            "order_id": "o1",
            "customer_id": "c1",
            "country": "DE",
            "ordered_at": t(0),
            "amount": 3.0,
            "deadline": t(15),
            "_epoch": 2,
        }
    ]
    assert res.country_totals == {"DE": {"orders": 2, "revenue": 4.0}}  # the late order counts


# --------------------------------------------------------------------------- unpaid orders


def test_unpaid_order_timer_fires_in_a_later_epoch(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {
                "orders": [order("u1", 0, 7.5), order("paid", 0)],
                "payments": [
                    payment("p-outside", "u1", 16),  # after u1's window: does not pay it
                    payment("p-paid", "paid", 15),
                ],
            },
            {"orders": [order("x", 20, customer="c2")], "payments": [payment("px", "x", 20, customer="c2")]},
        ],
    )
    assert res.watermarks == {1: t(-1), 2: t(19)}
    assert res.unpaid_orders == [
        {
            "order_id": "u1",
            "customer_id": "c1",
            "country": "DE",
            "ordered_at": t(0),
            "amount": 7.5,
            "deadline": t(15),
            "_epoch": 2,
        }
    ]
    # Left: the payments' own timers (00:30, 00:31) and x's (00:35, once for an order and a payment at one time).
    assert res.pending_timers == {"paid": [t(30)], "u1": [t(31)], "x": [t(35)]}


# --------------------------------------------------------------------------- fraud check


def test_threshold_change_and_removal_between_epochs(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {
                "thresholds": [threshold("DE", 100.0)],
                "payments": [
                    payment("a1", "o", 0, 150.0),
                    payment("a2", "o", 0, 100.0),  # equal to the limit: not above it
                    payment("a3", "o", 0, 1000.0, country="FR"),  # no limit for FR
                ],
            },
            {
                # Thresholds run before the epoch's payments, whatever the files; the last one of a country wins.
                "thresholds": [threshold("DE", 200.0), threshold("FR", 50.0), threshold("FR", 55.0)],
                "payments": [
                    payment("b1", "o", 0, 150.0),
                    payment("b2", "o", 0, 250.0),
                    payment("b3", "o", 0, 60.0, country="FR"),
                ],
            },
            {
                "thresholds": [threshold("DE", None), threshold("IT", None)],  # removes DE; IT had none
                "payments": [payment("c1", "o", 0, 1000.0), payment("c2", "o", 0, 70.0, country="FR")],
            },
        ],
    )
    assert [
        (r["payment_id"], r["country"], r["amount"], r["limit"], r["flagged"], r["_epoch"]) for r in res.flagged_payments
    ] == [
        ("a1", "DE", 150.0, 100.0, 1, 1),
        ("b2", "DE", 250.0, 200.0, 2, 2),
        ("b3", "FR", 60.0, 55.0, 1, 2),
        ("c2", "FR", 70.0, 55.0, 2, 3),
    ]
    assert res.fraud_limits == {"FR": 55.0}
    assert res.flagged_counts == {"DE": 2, "FR": 2}


# --------------------------------------------------------------------------- sessions


def test_session_bridged_by_a_later_record_sums_in_arrival_order(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            # Two sessions of c1: [00:00, 00:10) and [00:20, 00:30). W(1) = 23:59.
            {"orders": [order("o1", 0, 0.1)], "payments": [payment("p1", "x", 20, 0.2)]},
            # 00:10 touches both: one session [00:00, 00:30); W(2) = 00:44 fires it.
            {
                "orders": [order("o2", 10, 0.3), order("o3", 45, 1.0, customer="c2")],
                "payments": [payment("p3", "o3", 45, 2.0, customer="c2")],
            },
        ],
    )
    assert res.watermarks == {1: t(-1), 2: t(44)}
    assert res.customer_sessions == [
        {"customer_id": "c1", "window_start": t(0), "window_end": t(30), "events": 3, "amount": (0.1 + 0.2) + 0.3, "_epoch": 2}
    ]
    assert res.open_sessions == {"c2": [(t(45), t(55), 2, 3.0)]}
    assert res.late_activity == []


def test_sessions_exactly_gap_apart_merge_and_fire_when_the_watermark_reaches_their_end(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {"orders": [order("o1", 0, 1.0), order("o2", 10, 2.0)], "payments": [payment("p9", "o9", 21, 5.0, customer="c9")]},
        ],
    )
    assert res.watermarks == {1: t(9)}
    assert res.customer_sessions == []  # [00:00, 00:20) ends after W(1) = 00:09
    assert res.open_sessions == {"c1": [(t(0), t(20), 2, 3.0)], "c9": [(t(21), t(31), 1, 5.0)]}


def test_late_session_record_goes_to_late_activity(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {"orders": [order("o1", 30, 1.0, customer="c0")], "payments": [payment("p1", "o1", 30, 1.0, customer="c0")]},
            # W(1) = 00:29: a record at 00:19 (window end 00:29 <= W(1)) is late, one a second later is not.
            {
                "orders": [order("o2", 19, 4.0, customer="c5")],
                "payments": [payment("p2", "o2", 19, 6.0, customer="c5", second=1), payment("p3", "o3", 50, customer="c0")],
            },
        ],
    )
    assert res.watermarks == {1: t(29), 2: t(29)}
    assert res.late_activity == [{"customer_id": "c5", "ts": t(19), "amount": 4.0, "_epoch": 2}]
    assert res.customer_sessions == []
    assert res.open_sessions == {
        "c0": [(t(30), t(40), 2, 2.0), (t(50), t(60), 1, 10.0)],
        "c5": [(t(19, 1), t(29, 1), 1, 6.0)],
    }


# --------------------------------------------------------------------------- totals


def test_country_totals_sum_each_epoch_exactly_then_add() -> None:
    assert epoch_sum([0.1, 0.2]) == 0.3  # not 0.1 + 0.2
    assert epoch_sum([1e10 + 0.5, 0.1]) == 10000000000.6  # decimal(38,18) method
    assert epoch_sum([1e300, 1.0, -1e300]) == 0.0  # sorted fold: (-1e300 + 1.0) + 1e300
    assert epoch_sum([1e300, 1.0]) == 1e300 + 1.0
    assert math.isnan(epoch_sum([math.nan, 1.0]))
    assert epoch_sum([]) == 0.0


def test_country_totals_running(tmp_path: pathlib.Path) -> None:
    res = run(
        tmp_path,
        [
            {"orders": [order("o1", 0, 0.1), order("o2", 0, 0.2), order("o3", 0, 5.0, country="FR")]},
            {"orders": [order("o4", 0, 0.1)]},
        ],
    )
    assert res.country_totals == {"DE": {"orders": 3, "revenue": 0.3 + 0.1}, "FR": {"orders": 1, "revenue": 5.0}}
    assert res.country_totals_updates == [
        {"country": "DE", "orders": 2, "revenue": 0.3, "_epoch": 1},
        {"country": "FR", "orders": 1, "revenue": 5.0, "_epoch": 1},
        {"country": "DE", "orders": 3, "revenue": 0.3 + 0.1, "_epoch": 2},
    ]
