"""Plain-Python oracle for the ``orders_payments`` pipeline.

Independent of the engine: written from the README and the operators' numbered
docstrings, with ordinary dicts and lists as state and one pass over the
records of each epoch. The Spark engine's Delta tables are compared against
:class:`OrdersPaymentsResult` row for row. Nothing here imports ``barrierflow``; files are read and chunked as
:mod:`reference.sensor_stats_reference` does.

Epoch n reads chunk n of every source (:func:`split_epochs`); W(n-1) is the
pipeline's watermark at its start, W(n) the one at its end (``None`` stands for
-infinity). Within epoch n:

1. Read. Each source's files of the epoch, in name order, lines split on
   ``\\n`` (one trailing ``\\r`` stripped); blank lines are skipped. Every other
   line is a record or a dead letter ``(source, file, line, reason)``, the
   first failing check winning, in this order: ``invalid_utf8``, ``not_json``
   / ``not_an_object``, ``wrong_type`` (no coercion; see
   :func:`convert_value`), ``missing_field`` (a non-nullable field absent or
   null, in schema order), then per key column in name order ``null_key`` and
   ``empty_key`` (:data:`KEYS`: a column some keyed operator downstream keys
   by, checked at its source). A name repeated in an object takes its last
   value, but any occurrence that does not convert makes the line a
   ``wrong_type``. A record's arrival position is (source index in
   declaration order, file index in the epoch, line).
2. Deduplicate orders by ``order_id`` and payments by ``payment_id``: the
   first record of an id by arrival position wins, across all epochs.
3. Watermarks. Each stream's assigner W_s(n) = max ``ts`` of its deduplicated
   records up to epoch n - out_of_orderness (``None`` before its first
   record); W(n) = min(W_orders(n), W_payments(n)), ``None`` while either is.
4. ``paid_orders`` / ``late_payments``: interval join on ``order_id`` with
   ``0 <= paid ts - order ts <= PAYMENT_WINDOW``. A record with ``ts < W(n-1)``
   is late (a payment becomes a ``late_payments`` row, an order is dropped).
   The other records of the epoch join each other and the records kept in
   state; each pair is emitted once, in the epoch of its later record. At the
   end of the epoch an order is kept while ``ts + PAYMENT_WINDOW > W(n)``, a
   payment while ``ts > W(n)`` (cleanup times, ``None`` keeps everything).
5. ``unpaid_orders``: :class:`UnpaidOrders` re-implemented. Per order id, the
   epoch's orders then payments (orders are declared first, so their arrival
   positions come first), each in arrival order; then every event-time timer
   at or below W(n) fires in timestamp order (unique per key and timestamp;
   none while W(n) is ``None``), including keys without records this epoch.
6. ``flagged_payments``: :class:`FlagLargePayments` re-implemented. The
   epoch's threshold records first, in arrival order (a null ``limit``
   removes the country's limit), then every deduplicated payment (late ones
   too: a process function has no lateness filter) per country in arrival
   order; one above its country's limit is flagged with the running count.
7. ``customer_sessions`` / ``late_activity``: orders and payments unioned as
   ``(customer_id, ts, amount)``, keyed by ``customer_id``, session windows of
   ``SESSION_GAP``. A record whose own window ``[ts, ts + gap)`` has
   ``end <= W(n-1)`` is late (a ``late_activity`` row); the others open their
   own window, and windows of a key that overlap or touch merge (with stored
   sessions too). Sessions with ``end <= W(n)`` fire once (``events`` =
   count, ``amount`` = float sum folded in arrival order: earlier epochs
   first, then arrival position) and are purged (allowed lateness 0).
8. ``country_totals``: per country the running count of deduplicated orders
   (late ones too) and the running sum of their amounts: each epoch's sum is
   the exact sum of the values' decimal forms rounded once to a double
   (values outside ``decimal(38,18)``: folded sorted ascending), added to the
   stored sum (:func:`epoch_sum`).

Every output row carries ``_epoch``, the epoch that emits it. Rows of
append-only outputs are sorted (see :func:`sort_rows`), since the engine's
sinks give no order.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from reference.sensor_stats_reference import read_lines
from reference.sensor_stats_reference import split_epochs as split_directory

__all__ = [
    "SOURCES",
    "SCHEMAS",
    "KEYS",
    "PAYMENT_WINDOW",
    "SESSION_GAP",
    "OrdersPaymentsResult",
    "split_epochs",
    "read_lines",
    "parse_timestamp",
    "convert_value",
    "validate_line",
    "epoch_sum",
    "sort_rows",
    "run_reference",
    "run_reference_on_dir",
]

UTC = timezone.utc
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PAYMENT_WINDOW = timedelta(minutes=15)
SESSION_GAP = timedelta(minutes=10)

# Sources in declaration order (their index orders arrival positions, step 1).
SOURCES = ("orders", "payments", "thresholds")
# (field, type, nullable); types: "string", "float64", "timestamp".
SCHEMAS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "orders": (
        ("order_id", "string", True),
        ("customer_id", "string", True),
        ("country", "string", True),
        ("ts", "timestamp", False),
        ("amount", "float64", False),
    ),
    "payments": (
        ("payment_id", "string", True),
        ("order_id", "string", True),
        ("customer_id", "string", True),
        ("country", "string", True),
        ("ts", "timestamp", False),
        ("amount", "float64", False),
    ),
    "thresholds": (("country", "string", False), ("limit", "float64", True)),
}
# Key columns checked at each source (step 1): dedup, join and co-process keys,
# the sessions' customer_id, the totals' and fraud check's country, and the
# join's event time (non-nullable anyway). The broadcast thresholds have none.
KEYS: dict[str, tuple[str, ...]] = {
    "orders": ("country", "customer_id", "order_id", "ts"),
    "payments": ("country", "customer_id", "order_id", "payment_id", "ts"),
    "thresholds": (),
}


@dataclass
class OrdersPaymentsResult:
    """Everything the reference pipeline produces (rows carry ``_epoch``; lists sorted by :func:`sort_rows`)."""

    paid_orders: list[dict[str, Any]] = field(default_factory=list)
    late_payments: list[dict[str, Any]] = field(default_factory=list)
    unpaid_orders: list[dict[str, Any]] = field(default_factory=list)
    flagged_payments: list[dict[str, Any]] = field(default_factory=list)
    customer_sessions: list[dict[str, Any]] = field(default_factory=list)
    late_activity: list[dict[str, Any]] = field(default_factory=list)
    # Upsert table: its final content, country -> {"orders", "revenue"}; and the rows each epoch upserted.
    country_totals: dict[str | None, dict[str, Any]] = field(default_factory=dict)
    country_totals_updates: list[dict[str, Any]] = field(default_factory=list)
    # (source, file name, line, reason), in arrival order.
    dead_letters: list[tuple[str, str, int, str]] = field(default_factory=list)
    # Late orders the join dropped (logged by the engine, no table): order ids per epoch.
    dropped_late_orders: list[tuple[int, str]] = field(default_factory=list)
    # Watermarks: W(n) per epoch (None = -infinity), and per stream.
    watermarks: dict[int, datetime | None] = field(default_factory=dict)
    stream_watermarks: dict[int, dict[str, datetime | None]] = field(default_factory=dict)
    # Final state after the last epoch.
    fraud_limits: dict[str | None, float] = field(default_factory=dict)
    flagged_counts: dict[str | None, int] = field(default_factory=dict)
    open_sessions: dict[str, list[tuple[datetime, datetime, int, float]]] = field(default_factory=dict)
    join_left: list[dict[str, Any]] = field(default_factory=list)
    join_right: list[dict[str, Any]] = field(default_factory=list)
    pending_timers: dict[str, list[datetime]] = field(default_factory=dict)
    seen_order_ids: set[str] = field(default_factory=set)
    seen_payment_ids: set[str] = field(default_factory=set)


# --------------------------------------------------------------------------- input


def split_epochs(landing_dir: str | os.PathLike[str], max_files_per_epoch: int) -> list[dict[str, list[pathlib.Path]]]:
    """Per epoch, each source's files: ``landing/<source>/`` chunked as sensor_stats' reference chunks one directory.

    Epoch n takes chunk n of every source; a source with fewer chunks has an
    empty list in later epochs. No files at all: no epochs.
    """
    chunks = {source: split_directory(pathlib.Path(landing_dir) / source, max_files_per_epoch) for source in SOURCES}
    count = max((len(c) for c in chunks.values()), default=0)
    return [{s: (chunks[s][n] if n < len(chunks[s]) else []) for s in SOURCES} for n in range(count)]


class _Num(str):
    """A JSON number kept as its text (a string column takes a number's text as is)."""


class _Obj(dict[str, Any]):
    """A JSON object (the last value of a repeated name) that also keeps every ``(name, value)`` pair."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


_TS_RE = re.compile(
    r"""^\s*(?P<year>[+-]?\d{4,6})
        (?:-(?P<month>\d{1,2})
          (?:-(?P<day>\d{1,2})
            (?:[T\s](?P<hour>\d{1,2}):(?P<minute>\d{1,2})(?::(?P<second>\d{1,2})(?:\.(?P<fraction>\d*))?)?
              \s*(?P<zone>Z|[+-]\d{1,2}(?::?\d{2})?|(?:UTC|GMT|UT)(?:[+-]\d{1,2}(?::?\d{2})?)?|[A-Za-z_]+/[A-Za-z_/+-]+)?
            )?
          )?
        )?\s*$""",
    re.VERBOSE,
)


def _zone_offset(zone: str | None) -> timezone | ZoneInfo | None:
    if zone is None or zone in ("Z", "UTC", "GMT", "UT"):
        return UTC
    match = re.fullmatch(r"(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?", zone)
    if match:
        sign = -1 if match.group(1) == "-" else 1
        hours, minutes = int(match.group(2)), int(match.group(3) or 0)
        if hours > 18 or minutes > 59:
            return None
        return timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def parse_timestamp(text: str) -> datetime | None:
    """Aware UTC datetime of a timestamp string as Spark's JSON reader takes it, else None (a wrong type).

    Spark's lenient grammar (``DateTimeUtils.stringToTimestamp``) as far as a
    reference needs it: ``yyyy[-m[m][-d[d][(T| )h[h]:m[m][:s[s][.fraction]][zone]]]]``;
    fraction digits past the microsecond are truncated; zone ``Z``,
    ``+hh:mm``, ``+hhmm``, ``+hh``, ``UTC``/``GMT`` with an optional offset, or
    an ``area/city`` id; without a zone the session time zone, UTC.
    """
    match = _TS_RE.match(text)
    if not match:
        return None
    g = match.groupdict()
    zone = _zone_offset(g["zone"])
    if zone is None:
        return None
    fraction = (g["fraction"] or "")[:6].ljust(6, "0")
    try:
        local = datetime(
            int(g["year"]),
            int(g["month"] or 1),
            int(g["day"] or 1),
            int(g["hour"] or 0),
            int(g["minute"] or 0),
            int(g["second"] or 0),
            int(fraction),
            tzinfo=zone,
        )
        return local.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


_NON_NUMERIC = {
    "NaN": math.nan,
    "+INF": math.inf,
    "+Infinity": math.inf,
    "Infinity": math.inf,
    "-INF": -math.inf,
    "-Infinity": -math.inf,
}
_WRONG = object()


def _number_text(value: Any) -> Any:
    """A parsed JSON value with the numbers of :class:`_Num` made plain again (for nested values)."""
    if isinstance(value, _Num):
        return json.loads(str(value))
    if isinstance(value, dict):
        return {k: _number_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_number_text(v) for v in value]
    return value


def convert_value(kind: str, value: Any) -> Any:
    """A JSON value (numbers as :class:`_Num`) as its column type, ``None`` for null, or ``_WRONG``.

    As Spark's JSON parser with the source's schema: a string column takes a
    string, or any other value's JSON text (a number exactly as written,
    ``true``); a float64 column a JSON number (integer or not, ``1e400`` is
    infinity) or one of the strings ``NaN``, ``Infinity``, ``+Infinity``,
    ``+INF``, ``-Infinity``, ``-INF``; a timestamp column a string of
    :func:`parse_timestamp`, or an integer number of seconds since the epoch.
    Anything else (another string, a boolean, an object) is a wrong type;
    an empty string too, for non-string columns.
    """
    if value is None:
        return None
    if kind == "string":
        if isinstance(value, _Num):
            return str(value)
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        return json.dumps(_number_text(value), separators=(",", ":"), ensure_ascii=False)
    if kind == "float64":
        if isinstance(value, _Num):
            return float(str(value))  # Python's float() of the text: inf past the range, as getDoubleValue
        if isinstance(value, str) and not isinstance(value, _Num):
            return _NON_NUMERIC.get(value, _WRONG)
        return _WRONG
    if kind == "timestamp":
        if isinstance(value, _Num):
            text = str(value)
            if re.fullmatch(r"-?\d+", text):
                try:
                    return _EPOCH + timedelta(seconds=int(text))
                except OverflowError:
                    return _WRONG
            return _WRONG
        if isinstance(value, str):
            parsed = parse_timestamp(value)
            return _WRONG if parsed is None else parsed
        return _WRONG
    raise ValueError(f"unknown column type {kind}")


def validate_line(source: str, raw: bytes) -> dict[str, Any] | str | None:
    """Step 1 for one line: ``None`` if blank, the record (each schema field) if valid, else the reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    if text.strip() == "":
        return None
    try:
        obj = json.loads(text, parse_int=_Num, parse_float=_Num, parse_constant=_Num, object_pairs_hook=_Obj)
    except (ValueError, RecursionError):
        return "not_json"
    if not isinstance(obj, _Obj):
        return "not_an_object"
    # Every occurrence of a field is converted (Spark's parser does, keeping the
    # last value): one that does not convert makes the line a wrong type.
    kinds = {name: kind for name, kind, _ in SCHEMAS[source]}
    record: dict[str, Any] = {name: None for name in kinds}
    for name, value in obj.pairs:
        if name in kinds:
            record[name] = convert_value(kinds[name], value)
            if record[name] is _WRONG:
                return "wrong_type"
    for name, kind, nullable in SCHEMAS[source]:
        if not nullable and record[name] is None:
            return "missing_field"
    for name in sorted(KEYS[source]):
        if record[name] is None:
            return "null_key"
        if kinds[name] == "string" and record[name] == "":
            return "empty_key"
    return record


# --------------------------------------------------------------------------- arithmetic


def _micro_exact(v: float) -> bool:
    return math.isfinite(v) and abs(v) < 1e9 and round(v * 1e6) / 1e6 == v


_WIDE = Context(prec=80)


def _decimal_form(v: float) -> Decimal | None:
    """``v`` as ``decimal(38,18)`` (from its shortest decimal text, half up), if that reads back as ``v``."""
    if not math.isfinite(v):
        return None
    try:
        d = Decimal(repr(v)).quantize(Decimal("1e-18"), rounding=ROUND_HALF_UP, context=_WIDE)
    except InvalidOperation:
        return None
    if abs(d) >= Decimal(10) ** 20 or float(d) != v:
        return None
    return d


def epoch_sum(values: list[float]) -> float:
    """An epoch's ``Sum`` of one key, as README "Declare a pipeline" and aggregate.py steps 1-3 define it.

    The exact sum of the values' decimal forms, rounded once to a double
    (steps 1 and 2 give the same number whenever they apply); if a value
    has no exact ``decimal(38,18)`` form (NaN, infinity, too large or too
    precise) or a partial sum could overflow it, the values folded sorted
    ascending (NaN last, as Spark sorts it).
    """
    if not values:
        return 0.0
    if all(_micro_exact(v) for v in values):
        units = [round(v * 1e6) for v in values]
        total = sum(units)
        if max(abs(u) for u in units) * len(units) < 9e18 and abs(total) < 2**53:
            return total / 1e6  # an exact integer double over 1e6: one correctly rounded division
    forms = [_decimal_form(v) for v in values]
    if all(f is not None for f in forms) and max(abs(v) for v in values) * len(values) < 1e19:
        return float(sum((Fraction(f) for f in forms if f is not None), Fraction(0)))
    acc = 0.0
    for v in sorted(values, key=lambda x: (math.isnan(x), x if not math.isnan(x) else 0.0)):
        acc += v
    return acc


def _us(ts: datetime) -> int:
    return (ts - _EPOCH) // timedelta(microseconds=1)


def sort_rows(rows: list[dict[str, Any]], *columns: str) -> list[dict[str, Any]]:
    """``rows`` sorted by ``_epoch`` then ``columns`` (None first), for order-free comparison."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["_epoch"], *((row[c] is not None, row[c] if row[c] is not None else 0) for c in columns))

    return sorted(rows, key=key)


# --------------------------------------------------------------------------- the pipeline


@dataclass
class _Rec:
    source: str
    position: tuple[int, int, int]  # (source index, file index in the epoch, line)
    fields: dict[str, Any]


@dataclass
class _Session:
    start: datetime
    end: datetime
    values: list[tuple[int, tuple[int, int, int], float]]  # (epoch, arrival position, amount)


@dataclass
class _UnpaidState:
    order: dict[str, Any] | None = None  # ordered_at, customer_id, country, amount
    payment_times: list[datetime] = field(default_factory=list)
    timers: set[datetime] = field(default_factory=set)


def _min_watermark(values: list[datetime | None]) -> datetime | None:
    return None if any(v is None for v in values) else min(v for v in values if v is not None)


def run_reference(
    epochs: list[dict[str, list[pathlib.Path]]], out_of_orderness: timedelta = timedelta(seconds=60)
) -> OrdersPaymentsResult:
    """Run the reference ``orders_payments`` pipeline over ``epochs`` (numbered from 1); see the module docstring."""
    res = OrdersPaymentsResult()
    max_ts: dict[str, datetime | None] = {"orders": None, "payments": None}
    watermark: datetime | None = None  # W(n-1) while epoch n runs
    join_left: list[dict[str, Any]] = []  # kept orders: order fields
    join_right: list[dict[str, Any]] = []  # kept payments: payment_id, order_id, ts, amount
    unpaid: dict[str, _UnpaidState] = {}
    limits: dict[str | None, float] = {}
    flagged: dict[str | None, int] = {}
    sessions: dict[str, list[_Session]] = {}
    totals: dict[str | None, dict[str, Any]] = {}

    for epoch, files in enumerate(epochs, start=1):
        # 1. Read every source's files of the epoch.
        valid: dict[str, list[_Rec]] = {s: [] for s in SOURCES}
        for index, source in enumerate(SOURCES):
            paths = sorted(files.get(source, []), key=lambda p: pathlib.Path(p).name)
            for fidx, path in enumerate(paths):
                name = pathlib.Path(path).name
                for number, raw in enumerate(read_lines(path), start=1):
                    outcome = validate_line(source, raw)
                    if outcome is None:
                        continue
                    if isinstance(outcome, str):
                        res.dead_letters.append((source, name, number, outcome))
                        continue
                    valid[source].append(_Rec(source, (index, fidx, number), outcome))

        # 2. Deduplicate (records are already in arrival order).
        orders: list[_Rec] = []
        for r in valid["orders"]:
            if r.fields["order_id"] not in res.seen_order_ids:
                res.seen_order_ids.add(r.fields["order_id"])
                orders.append(r)
        payments: list[_Rec] = []
        for r in valid["payments"]:
            if r.fields["payment_id"] not in res.seen_payment_ids:
                res.seen_payment_ids.add(r.fields["payment_id"])
                payments.append(r)
        thresholds = valid["thresholds"]

        # 3. Watermarks at the end of the epoch.
        for name, recs in (("orders", orders), ("payments", payments)):
            for r in recs:
                seen = max_ts[name]
                max_ts[name] = r.fields["ts"] if seen is None else max(seen, r.fields["ts"])
        stream_wm = {s: (None if m is None else m - out_of_orderness) for s, m in max_ts.items()}
        new_watermark = _min_watermark(list(stream_wm.values()))
        res.stream_watermarks[epoch] = stream_wm
        res.watermarks[epoch] = new_watermark
        wp, wn = watermark, new_watermark

        # 4. Interval join.
        fresh_left: list[dict[str, Any]] = []
        for r in orders:
            if wp is not None and r.fields["ts"] < wp:
                res.dropped_late_orders.append((epoch, r.fields["order_id"]))
            else:
                fresh_left.append(dict(r.fields))
        fresh_right: list[dict[str, Any]] = []
        for r in payments:
            row = {k: r.fields[k] for k in ("payment_id", "order_id", "ts", "amount")}
            if wp is not None and r.fields["ts"] < wp:
                res.late_payments.append({**row, "_epoch": epoch})
            else:
                fresh_right.append(row)

        def pair(left: dict[str, Any], right: dict[str, Any]) -> None:
            if left["order_id"] == right["order_id"] and timedelta(0) <= right["ts"] - left["ts"] <= PAYMENT_WINDOW:
                res.paid_orders.append(
                    {
                        "order_id": left["order_id"],
                        "customer_id": left["customer_id"],
                        "country": left["country"],
                        "ordered_at": left["ts"],
                        "order_amount": left["amount"],
                        "payment_id": right["payment_id"],
                        "paid_at": right["ts"],
                        "paid_amount": right["amount"],
                        "_epoch": epoch,
                    }
                )

        for left in fresh_left:
            for right in (*join_right, *fresh_right):
                pair(left, right)
        for left in join_left:
            for right in fresh_right:
                pair(left, right)
        join_left = [x for x in (*join_left, *fresh_left) if wn is None or x["ts"] + PAYMENT_WINDOW > wn]
        join_right = [x for x in (*join_right, *fresh_right) if wn is None or x["ts"] > wn]

        # 5. UnpaidOrders: per key, orders then payments in arrival order; then due timers.
        by_key: dict[str, list[_Rec]] = {}
        for r in sorted((*orders, *payments), key=lambda r: r.position):
            by_key.setdefault(r.fields["order_id"], []).append(r)
        for key, recs in by_key.items():
            st = unpaid.setdefault(key, _UnpaidState())
            for r in recs:
                if r.source == "orders":
                    if st.order is None:  # 5.1 (dedup makes a second order of an id unreachable)
                        st.order = {k: r.fields[k] for k in ("ts", "customer_id", "country", "amount")}
                        st.timers.add(r.fields["ts"] + PAYMENT_WINDOW)
                else:  # 5.2
                    st.payment_times.append(r.fields["ts"])
                    st.timers.add(r.fields["ts"] + PAYMENT_WINDOW)
        if wn is not None:
            for key in sorted(unpaid):
                st = unpaid[key]
                while True:
                    due = [t for t in st.timers if t <= wn]
                    if not due:
                        break
                    timestamp = min(due)
                    st.timers.discard(timestamp)
                    # 5.3 on_timer
                    times = list(st.payment_times)
                    if st.order is not None and timestamp >= st.order["ts"] + PAYMENT_WINDOW:
                        ordered_at = st.order["ts"]
                        deadline = ordered_at + PAYMENT_WINDOW
                        if not any(ordered_at <= t <= deadline for t in times):
                            res.unpaid_orders.append(
                                {
                                    "order_id": key,
                                    "customer_id": st.order["customer_id"],
                                    "country": st.order["country"],
                                    "ordered_at": ordered_at,
                                    "amount": st.order["amount"],
                                    "deadline": deadline,
                                    "_epoch": epoch,
                                }
                            )
                        st.order = None
                    st.payment_times = [t for t in times if t + PAYMENT_WINDOW > timestamp]
        unpaid = {k: st for k, st in unpaid.items() if st.order is not None or st.payment_times or st.timers}

        # 6. FlagLargePayments: broadcast records first, then payments per country in arrival order.
        for r in thresholds:
            if r.fields["limit"] is None:
                limits.pop(r.fields["country"], None)
            else:
                limits[r.fields["country"]] = r.fields["limit"]
        for r in payments:  # per key in arrival order; keys are independent
            country = r.fields["country"]
            limit = limits.get(country)
            if limit is None or r.fields["amount"] <= limit:
                continue
            flagged[country] = flagged.get(country, 0) + 1
            res.flagged_payments.append(
                {
                    "payment_id": r.fields["payment_id"],
                    "order_id": r.fields["order_id"],
                    "country": country,
                    "amount": r.fields["amount"],
                    "limit": limit,
                    "flagged": flagged[country],
                    "_epoch": epoch,
                }
            )

        # 7. Session windows over the union of orders and payments.
        touched: set[str] = set()
        for r in sorted((*orders, *payments), key=lambda r: r.position):
            customer, ts, amount = r.fields["customer_id"], r.fields["ts"], r.fields["amount"]
            if wp is not None and ts + SESSION_GAP <= wp:
                res.late_activity.append({"customer_id": customer, "ts": ts, "amount": amount, "_epoch": epoch})
                continue
            sessions.setdefault(customer, []).append(_Session(ts, ts + SESSION_GAP, [(epoch, r.position, amount)]))
            touched.add(customer)
        for customer in touched:  # merge windows that overlap or touch (gaps and islands by start)
            merged: list[_Session] = []
            for s in sorted(sessions[customer], key=lambda s: s.start):
                if merged and s.start <= merged[-1].end:
                    merged[-1].end = max(merged[-1].end, s.end)
                    merged[-1].values.extend(s.values)
                else:
                    merged.append(_Session(s.start, s.end, list(s.values)))
            sessions[customer] = merged
        if wn is not None:
            for customer in sorted(sessions):
                kept = []
                for s in sessions[customer]:
                    if s.end <= wn:
                        res.customer_sessions.append(
                            {
                                "customer_id": customer,
                                "window_start": s.start,
                                "window_end": s.end,
                                "events": len(s.values),
                                "amount": _fold(s.values),
                                "_epoch": epoch,
                            }
                        )
                    else:
                        kept.append(s)
                sessions[customer] = kept
            sessions = {k: v for k, v in sessions.items() if v}

        # 8. Running totals per country (every deduplicated order, late or not).
        per_country: dict[str | None, list[float]] = {}
        for r in orders:
            per_country.setdefault(r.fields["country"], []).append(r.fields["amount"])
        for country, amounts in per_country.items():
            prev = totals.get(country, {"orders": 0, "revenue": 0.0})
            totals[country] = {"orders": prev["orders"] + len(amounts), "revenue": prev["revenue"] + epoch_sum(amounts)}
            res.country_totals_updates.append({"country": country, **totals[country], "_epoch": epoch})

        watermark = new_watermark

    res.paid_orders = sort_rows(res.paid_orders, "order_id", "payment_id")
    res.late_payments = sort_rows(res.late_payments, "payment_id")
    res.unpaid_orders = sort_rows(res.unpaid_orders, "order_id")
    res.flagged_payments = sort_rows(res.flagged_payments, "country", "flagged")
    res.customer_sessions = sort_rows(res.customer_sessions, "customer_id", "window_start")
    res.late_activity = sort_rows(res.late_activity, "customer_id", "ts", "amount")
    res.country_totals_updates = sort_rows(res.country_totals_updates, "country")
    res.country_totals = totals
    res.fraud_limits = limits
    res.flagged_counts = flagged
    res.open_sessions = {c: [(s.start, s.end, len(s.values), _fold(s.values)) for s in ss] for c, ss in sorted(sessions.items())}
    res.join_left = join_left
    res.join_right = join_right
    res.pending_timers = {k: sorted(st.timers) for k, st in sorted(unpaid.items()) if st.timers}
    return res


def _fold(values: list[tuple[int, tuple[int, int, int], float]]) -> float:
    acc = 0.0
    for _, _, value in sorted(values, key=lambda v: (v[0], v[1])):
        acc += value
    return acc


def run_reference_on_dir(
    landing_dir: str | os.PathLike[str],
    max_files_per_epoch: int,
    out_of_orderness: timedelta = timedelta(seconds=60),
) -> OrdersPaymentsResult:
    """``run_reference(split_epochs(landing_dir, max_files_per_epoch), out_of_orderness)``."""
    return run_reference(split_epochs(landing_dir, max_files_per_epoch), out_of_orderness)
