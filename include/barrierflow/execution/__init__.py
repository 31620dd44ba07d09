"""Execution: Spark sessions and the runner of an epoch's operators."""
