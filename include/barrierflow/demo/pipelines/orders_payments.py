"""The reference pipeline ``orders_payments``: two streams, a join, timers, broadcast rules and sessions.

Input under ``landing_dir``, JSON Lines: ``orders/`` ``{"order_id", "customer_id", "country", "ts",
"amount"}``, ``payments/`` (the same and a ``payment_id``) and ``thresholds/`` ``{"country", "limit"}``,
the fraud limit per country (a null ``limit`` removes it). Each stream is deduplicated by its id and has
its own watermark (max ``ts`` - out-of-orderness); the pipeline's is the lower. Outputs:

1. ``paid_orders`` (append): each order joined with the payments of its ``order_id`` made within
   ``PAYMENT_WINDOW`` (15 minutes, bounds inclusive) after it; later payments go to ``late_payments``.
2. ``unpaid_orders`` (append): an order whose window the watermark passed without a payment in it (:class:`UnpaidOrders`).
3. ``flagged_payments`` (append): payments above their country's broadcast limit (:class:`FlagLargePayments`).
4. ``customer_sessions`` (append): session windows (``SESSION_GAP``, 10 minutes) over each customer's
   orders and payments, with the event count and the amount; late ones go to ``late_activity``.
5. ``country_totals`` (upsert by ``country``): running count and sum of each country's orders.

Malformed lines are dead letters. ``barrierflow generate --pipeline orders_payments`` writes a messy sample."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Callable

import pyarrow as pa

from barrierflow import (
    BroadcastContext,
    Count,
    DeltaSink,
    EventTimeSessionWindows,
    FileSource,
    KeyedBroadcastProcessFunction,
    KeyedContext,
    KeyedCoProcessFunction,
    LateFiles,
    ListStateDescriptor,
    MapStateDescriptor,
    Param,
    PipelineBuilder,
    Sum,
    ValueStateDescriptor,
    pipeline,
)
from barrierflow.demo.pipelines.sensor_stats import LATE_FILES, PARALLELISM

__all__ = [
    "orders_payments", "ORDER_SCHEMA", "PAYMENT_SCHEMA", "THRESHOLD_SCHEMA", "FRAUD_LIMITS", "PAYMENT_WINDOW",
    "SESSION_GAP", "UnpaidOrders", "FlagLargePayments",
]  # fmt: skip

TS = pa.timestamp("us", tz="UTC")
ORDER_SCHEMA = pa.schema([
    ("order_id", pa.string()), ("customer_id", pa.string()), ("country", pa.string()),
    pa.field("ts", TS, nullable=False), pa.field("amount", pa.float64(), nullable=False),
])  # fmt: skip
PAYMENT_SCHEMA = pa.schema([
    ("payment_id", pa.string()), ("order_id", pa.string()), ("customer_id", pa.string()), ("country", pa.string()),
    pa.field("ts", TS, nullable=False), pa.field("amount", pa.float64(), nullable=False),
])  # fmt: skip
# A threshold without a country is a dead letter (missing_field): a broadcast map state has no null key.
THRESHOLD_SCHEMA = pa.schema([pa.field("country", pa.string(), nullable=False), pa.field("limit", pa.float64())])
FRAUD_LIMITS = MapStateDescriptor("fraud_limits", pa.string(), pa.float64())
PAYMENT_WINDOW = timedelta(minutes=15)
SESSION_GAP = timedelta(minutes=10)


class UnpaidOrders(KeyedCoProcessFunction):
    """Keyed by ``order_id``: orders on side 1, payments on side 2; an "unpaid" row when an order's window closes unpaid.

    1. An order stores its fields and registers an event-time timer at its deadline, ``ts + PAYMENT_WINDOW``.
    2. A payment stores its ``ts`` and registers a timer at ``ts + PAYMENT_WINDOW``, after which no order
       it could pay is still undecided, so that it is not kept forever.
    3. On a timer at or after the order's deadline: unless a stored payment has ``ts`` in ``[order ts, deadline]``, emit the order
       as unpaid; the order is forgotten either way, and so are payments whose own timer time has passed. An order arriving after
       the watermark passed its deadline is decided in its epoch, with the payments held then."""

    ordered_at = ValueStateDescriptor("ordered_at", TS)
    customer_id = ValueStateDescriptor("customer_id", pa.string())
    country = ValueStateDescriptor("country", pa.string())
    amount = ValueStateDescriptor("amount", pa.float64())
    payment_times = ListStateDescriptor("payment_times", TS)
    output_schema = pa.schema([
        ("order_id", pa.string()), ("customer_id", pa.string()), ("country", pa.string()),
        ("ordered_at", TS), ("amount", pa.float64()), ("deadline", TS),
    ])  # fmt: skip

    def process_element1(self, order: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        if ctx.get_state(self.ordered_at).value() is not None:
            return  # dedup upstream makes this unreachable; the first order of an id stands
        # 1.
        ctx.get_state(self.ordered_at).update(order["ts"])
        for detail in (self.customer_id, self.country, self.amount):
            ctx.get_state(detail).update(order[detail.name])
        ctx.timer_service().register_event_time_timer(order["ts"] + PAYMENT_WINDOW)

    def process_element2(self, payment: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        # 2.
        ctx.get_state(self.payment_times).add(payment["ts"])
        ctx.timer_service().register_event_time_timer(payment["ts"] + PAYMENT_WINDOW)

    def on_timer(self, timestamp: datetime, ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        # 3.
        ordered_at = ctx.get_state(self.ordered_at).value()
        payments = ctx.get_state(self.payment_times)
        times = payments.get()
        if ordered_at is not None and timestamp >= ordered_at + PAYMENT_WINDOW:
            deadline = ordered_at + PAYMENT_WINDOW
            if not any(ordered_at <= t <= deadline for t in times):
                order = {d.name: ctx.get_state(d).value() for d in (self.customer_id, self.country, self.amount)}
                out({"order_id": ctx.key[0], **order, "ordered_at": ordered_at, "deadline": deadline})
            for state in (self.ordered_at, self.customer_id, self.country, self.amount):
                ctx.get_state(state).clear()
        kept = [t for t in times if t + PAYMENT_WINDOW > timestamp]
        if len(kept) != len(times):
            payments.update(kept)


class FlagLargePayments(KeyedBroadcastProcessFunction):
    """Keyed by ``country``: a payment above its country's broadcast limit is flagged, with the country's running count."""

    flagged = ValueStateDescriptor("flagged", pa.int64())
    output_schema = pa.schema([
        ("payment_id", pa.string()), ("order_id", pa.string()), ("country", pa.string()),
        ("amount", pa.float64()), ("limit", pa.float64()), ("flagged", pa.int64()),
    ])  # fmt: skip

    def process_broadcast_element(
        self, rule: dict[str, Any], ctx: BroadcastContext, out: Callable[[dict[str, Any]], None]
    ) -> None:
        limits = ctx.get_broadcast_state(FRAUD_LIMITS)
        if rule["limit"] is None:
            limits.remove(rule["country"])
        else:
            limits.put(rule["country"], rule["limit"])

    def process_element(self, payment: dict[str, Any], ctx: KeyedContext, out: Callable[[dict[str, Any]], None]) -> None:
        limit = ctx.get_broadcast_state(FRAUD_LIMITS).get(ctx.key[0])
        if limit is None or payment["amount"] <= limit:
            return
        flagged = ctx.get_state(self.flagged)
        count = (flagged.value() or 0) + 1
        flagged.update(count)
        row = {k: payment[k] for k in ("payment_id", "order_id", "amount")}
        out({**row, "country": ctx.key[0], "limit": limit, "flagged": count})


@pipeline(
    "orders_payments",
    params=[
        Param("landing_dir", str, description="directory with orders/, payments/ and thresholds/ of *.jsonl files"),
        Param("max_files_per_epoch", int, 20, "files per epoch and source at most (bounds an epoch after a backlog)", minimum=1),
        PARALLELISM,
        Param("out_of_orderness_seconds", int, 60, "watermark bound of each stream", minimum=0),
        LATE_FILES,
    ],
    description=__doc__ or "",
)
def orders_payments(p: PipelineBuilder, params: dict[str, Any]) -> None:
    def source(name: str, schema: pa.Schema) -> Any:
        return p.source(
            FileSource(
                name,
                f"{params['landing_dir'].rstrip('/')}/{name}",
                schema=schema,
                max_files_per_epoch=params["max_files_per_epoch"],
                suffixes=(".jsonl",),
                late_files=LateFiles(params["late_files"]),
            )
        )

    bound = timedelta(seconds=params["out_of_orderness_seconds"])
    orders = (
        source("orders", ORDER_SCHEMA)
        .deduplicate("order_dedup", key="order_id")
        .with_watermark("ts", bound, operator_id="order_watermark")
    )
    payments = (
        source("payments", PAYMENT_SCHEMA)
        .deduplicate("payment_dedup", key="payment_id")
        .with_watermark("ts", bound, operator_id="payment_watermark")
    )
    thresholds = source("thresholds", THRESHOLD_SCHEMA)

    # 1.
    (
        orders.key_by("order_id")
        .interval_join(payments.select("payment_id", "order_id", "ts", "amount").key_by("order_id"))
        .between(timedelta(0), PAYMENT_WINDOW, operator_id="payment_join", right_late_output="late_payments")
        .select(
            "order_id",
            "customer_id",
            "country",
            "left_ts as ordered_at",
            "left_amount as order_amount",
            "payment_id",
            "right_ts as paid_at",
            "right_amount as paid_amount",
        )
        .sink_to(DeltaSink.append("paid_orders"))
    )
    # 2.
    (
        orders.key_by("order_id")
        .connect(payments.key_by("order_id"))
        .process("unpaid_timers", UnpaidOrders())
        .sink_to(DeltaSink.append("unpaid_orders"))
    )
    # 3.
    (
        payments.key_by("country")
        .connect(thresholds.broadcast(FRAUD_LIMITS))
        .process("fraud_check", FlagLargePayments())
        .sink_to(DeltaSink.append("flagged_payments"))
    )
    # 4.
    activity = orders.select("customer_id", "ts", "amount").union(payments.select("customer_id", "ts", "amount"))
    (
        activity.key_by("customer_id")
        .window(
            "customer_sessions",
            EventTimeSessionWindows.with_gap(SESSION_GAP),
            events=Count(),
            amount=Sum("amount"),
            late_output="late_activity",
        )
        .sink_to(DeltaSink.append("customer_sessions"))
    )
    # 5.
    orders.key_by("country").aggregate("country_totals", orders=Count(), revenue=Sum("amount")).sink_to(
        DeltaSink.upsert("country_totals", key="country")
    )
