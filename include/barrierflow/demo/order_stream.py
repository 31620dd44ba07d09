"""Deterministic, messy order and payment streams for ``orders_payments``: tests, demos and benchmarks.

File index ``k`` is ``part-<k:06d>.jsonl`` in ``orders/``, ``payments/`` and ``thresholds/``, covering
event times ``[start + k·span, start + (k+1)·span)``; as in :mod:`barrierflow.demo.datagen`, it depends
only on ``(seed, k)`` and the spec. A stream exercises every rule of the pipeline:

1. Orders up to ``out_of_order_s`` out of order, over ``n_customers`` customers and ``COUNTRIES``.
2. Per order, from its own random stream: no payment (``unpaid_rate``), one 16-25 minutes late (``overdue_rate``), two halves
   (``split_rate``), or one within 15 minutes, sometimes exactly at 0 or 15 (the join's inclusive bounds). A payment lands in the
   file of its event time, or one file before its order (``early_rate``).
3. Late records: an order 40 minutes behind its file (``late_rate``), and a payment of an order four files back.
4. Duplicates of the previous file's lines (``duplicate_rate``), blank lines, and malformed lines of random ``MALFORMED_KINDS``.
5. Thresholds: file 0 sets every country's limit; later files sometimes change or remove one
   (``"limit": null``), or hold a malformed limit or no country.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

from barrierflow.demo.datagen import file_count, publish_files

__all__ = [
    "OrderStreamSpec", "COUNTRIES", "MALFORMED_KINDS", "SOURCES", "generate_order_files", "order_files",
    "write_order_files",
]  # fmt: skip

SOURCES = ("orders", "payments", "thresholds")
COUNTRIES = ("de", "fr", "it", "es", "nl")
MALFORMED_KINDS = ("not_json", "json_array", "missing_id", "empty_id", "null_country", "string_amount", "missing_ts",
                   "unparseable_ts")  # fmt: skip
_OFFSETS = ((0, "Z"), (120, "+02:00"), (-300, "-05:00"))
_WINDOW_S = 15 * 60


@dataclass(frozen=True)
class OrderStreamSpec:
    """Shape of a generated order stream; rates are per order (payments) or per line (the rest)."""

    n_files: int
    orders_per_file: int = 40
    seed: int = 0
    start: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc)
    span_s: int = 300
    n_customers: int = 100
    out_of_order_s: int = 45
    unpaid_rate: float = 0.12
    overdue_rate: float = 0.06
    split_rate: float = 0.08
    early_rate: float = 0.05
    late_rate: float = 0.04
    duplicate_rate: float = 0.05
    malformed_rate: float = 0.03
    blank_line_rate: float = 0.01

    def __post_init__(self) -> None:
        if self.n_files < 0 or self.orders_per_file < 1 or self.span_s < 1 or self.n_customers < 1:
            raise ValueError("n_files must be >= 0; orders_per_file, span_s and n_customers >= 1")
        rates = (self.unpaid_rate, self.overdue_rate, self.split_rate, self.early_rate, self.late_rate,
                 self.duplicate_rate, self.malformed_rate, self.blank_line_rate)  # fmt: skip
        if any(not 0.0 <= r <= 1.0 for r in rates) or self.unpaid_rate + self.overdue_rate + self.split_rate > 1.0:
            raise ValueError("rates must lie in [0, 1], and unpaid_rate + overdue_rate + split_rate must be <= 1")


def _ts(spec: OrderStreamSpec, seconds: float, rng: random.Random) -> str:
    """ISO-8601 with an offset; the same instant in one of several zones."""
    minutes, suffix = rng.choice(_OFFSETS)
    zone = timezone(timedelta(minutes=minutes))
    return (spec.start + timedelta(seconds=seconds)).astimezone(zone).isoformat(timespec="milliseconds").replace("+00:00", suffix)


def _orders(spec: OrderStreamSpec, k: int) -> list[dict[str, Any]]:
    """(1.) File k's fresh orders, with event times in seconds from ``spec.start``."""
    if k < 0:
        return []
    rng = random.Random(f"{spec.seed}:{k}:orders")
    out = []
    for i in range(spec.orders_per_file):
        seconds = k * spec.span_s + (i + rng.random()) * spec.span_s / spec.orders_per_file
        if rng.random() < 0.3:
            seconds -= rng.uniform(0, spec.out_of_order_s)
        out.append({"order_id": f"o{k}-{i}", "customer_id": f"c{rng.randrange(spec.n_customers):02d}",
                    "country": rng.choice(COUNTRIES), "seconds": round(max(seconds, 0.0), 3),
                    "amount": round(rng.uniform(5, 500), 2)})  # fmt: skip
    return out


def _payments_of(spec: OrderStreamSpec, k: int, i: int, order: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(2.) The payments of order ``i`` of file ``k``, each with the index of the file it lands in."""
    rng = random.Random(f"{spec.seed}:{k}:{i}:pay")
    u = rng.random()
    if u < spec.unpaid_rate:
        return []
    if u < spec.unpaid_rate + spec.overdue_rate:
        delays = [rng.uniform(_WINDOW_S + 60, _WINDOW_S + 600)]
    elif u < spec.unpaid_rate + spec.overdue_rate + spec.split_rate:
        delays = sorted(rng.uniform(0, _WINDOW_S) for _ in range(2))
    else:
        edge = rng.random()
        delays = [0.0 if edge < 0.03 else float(_WINDOW_S) if edge < 0.06 else rng.uniform(0, _WINDOW_S)]
    amounts = [order["amount"]] if len(delays) == 1 else [round(order["amount"] / 2, 2)] * 2
    out = []
    for n, (delay, amount) in enumerate(zip(delays, amounts)):
        seconds = round(order["seconds"] + delay, 3)
        lands = int(seconds // spec.span_s)
        if rng.random() < spec.early_rate:
            lands = max(k - 1, 0)
        payment = {"payment_id": f"p{k}-{i}-{n}", "order_id": order["order_id"], "customer_id": order["customer_id"],
                   "country": order["country"], "seconds": seconds, "amount": amount}  # fmt: skip
        out.append((lands, payment))
    return out


def _payments(spec: OrderStreamSpec, k: int) -> list[dict[str, Any]]:
    """(2.) File k's fresh payments: those of earlier and next files' orders that land in it, by event time."""
    if k < 0:
        return []
    reach = (_WINDOW_S + 600) // spec.span_s + 2
    landed = [
        payment
        for j in range(k - reach, k + 2)
        for i, order in enumerate(_orders(spec, j))
        for lands, payment in _payments_of(spec, j, i, order)
        if lands == k
    ]
    return sorted(landed, key=lambda p: (p["seconds"], p["payment_id"]))


def _late(spec: OrderStreamSpec, k: int, rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(3.) A late order and a late payment, or neither."""
    if k < 4 or rng.random() >= spec.late_rate * spec.orders_per_file / 4:
        return [], []
    old = _orders(spec, k - 4)[0]
    order = {**_orders(spec, k)[0], "order_id": f"late-o{k}", "seconds": max(k * spec.span_s - 2400.0, 0.0)}
    payment = {"payment_id": f"late-p{k}", "order_id": old["order_id"], "customer_id": old["customer_id"],
               "country": old["country"], "seconds": old["seconds"] + 60, "amount": 1.0}  # fmt: skip
    return [order], [payment]


def _line(spec: OrderStreamSpec, record: dict[str, Any], rng: random.Random) -> str:
    obj = {k: v for k, v in record.items() if k != "seconds"}
    if "seconds" in record:
        obj["ts"] = _ts(spec, record["seconds"], rng)
    return json.dumps(obj)


def _malformed(kind: str, good: dict[str, Any], id_field: str) -> str:
    """(4.) One bad line of a kind."""
    bad = dict(good)
    if kind == "not_json":
        return json.dumps(good)[:-7]
    if kind == "json_array":
        return json.dumps(list(good.values()))
    if kind == "missing_id":
        bad.pop(id_field)
    elif kind == "empty_id":
        bad[id_field] = ""
    elif kind == "null_country":
        bad["country"] = None
    elif kind == "string_amount":
        bad["amount"] = str(bad.get("amount", "1.5"))
    elif kind == "missing_ts":
        bad.pop("ts", None)
    elif kind == "unparseable_ts":
        bad["ts"] = "yesterday at noon"
    return json.dumps(bad)


def _stream_lines(spec: OrderStreamSpec, k: int, source: str, fresh: list[str], previous: list[str]) -> list[str]:
    """(4.) Fresh lines mixed with duplicates of the previous file's, blanks and malformed lines."""
    rng = random.Random(f"{spec.seed}:{k}:{source}:mix")
    id_field = "order_id" if source == "orders" else "payment_id"
    lines = list(fresh)
    for _ in fresh:
        u = rng.random()
        at = rng.randrange(len(lines) + 1)
        if u < spec.duplicate_rate and (previous or fresh):
            lines.insert(at, rng.choice(previous or fresh))
        elif u < spec.duplicate_rate + spec.malformed_rate and fresh:
            kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
            lines.insert(at, _malformed(kind, json.loads(rng.choice(fresh)), id_field))
        elif u < spec.duplicate_rate + spec.malformed_rate + spec.blank_line_rate:
            lines.insert(at, rng.choice(("", "   ")))
    return lines


def _fresh_lines(spec: OrderStreamSpec, k: int) -> dict[str, list[str]]:
    """File k's fresh orders and payments, late ones included, as lines."""
    rng = random.Random(f"{spec.seed}:{k}:lines")
    late_orders, late_payments = _late(spec, k, rng)
    orders = [_line(spec, o, rng) for o in _orders(spec, k) + late_orders]
    payments = [_line(spec, p, rng) for p in _payments(spec, k) + late_payments]
    return {"orders": orders, "payments": payments}


def _thresholds(spec: OrderStreamSpec, k: int) -> list[str]:
    """(5.) File k's threshold records."""
    rng = random.Random(f"{spec.seed}:{k}:thresholds")
    if k == 0:
        return [json.dumps({"country": c, "limit": float(rng.randrange(300, 460, 10))}) for c in COUNTRIES]
    u = rng.random()
    country = rng.choice(COUNTRIES)
    if u < 0.25:
        return [json.dumps({"country": country, "limit": float(rng.randrange(200, 500, 10))})]
    if u < 0.35:
        return [json.dumps({"country": country, "limit": None})]
    if u < 0.4:
        return [json.dumps({"country": country, "limit": "high"})]
    if u < 0.45:
        return [json.dumps({"country": None, "limit": 100.0})]
    return []


def generate_order_files(spec: OrderStreamSpec, k: int) -> dict[str, list[str]]:
    """The lines of file index ``k`` of each source, ``{"orders": [...], "payments": [...], "thresholds": [...]}``."""
    fresh, previous = _fresh_lines(spec, k), _fresh_lines(spec, k - 1) if k > 0 else {"orders": [], "payments": []}
    out = {source: _stream_lines(spec, k, source, fresh[source], previous[source]) for source in ("orders", "payments")}
    out["thresholds"] = _thresholds(spec, k)
    return out


def order_files(spec: OrderStreamSpec, start_index: int, count: int) -> Iterator[tuple[str, str]]:
    """The path (``<source>/<name>``) and text of every source's files ``start_index ..``, for a writer of any store."""
    for k in range(start_index, start_index + count):
        for source, lines in generate_order_files(spec, k).items():
            yield f"{source}/part-{k:06d}.jsonl", "".join(line + "\n" for line in lines)


def write_order_files(
    landing_dir: str | os.PathLike[str], spec: OrderStreamSpec, start_index: int = 0, count: int | None = None
) -> list[pathlib.Path]:
    """Publish indexes ``start_index ..`` (``count``, default up to ``spec.n_files``) to ``landing_dir/<source>``."""
    return publish_files(landing_dir, order_files(spec, start_index, file_count(spec.n_files, start_index, count)))
