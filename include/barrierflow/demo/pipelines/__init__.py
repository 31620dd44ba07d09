"""Pipelines that ship with barrierflow."""
