"""Operators: each a node of the pipeline graph with its spec and its one kernel over Arrow data (``base``)."""
