"""Keyed state tables: what a state table is, and the backends that read and stage them."""

from barrierflow.state.spec import KEY_GROUP, KeyGroups, StateSpec, StateTablePlan

__all__ = ["KEY_GROUP", "KeyGroups", "StateSpec", "StateTablePlan"]
