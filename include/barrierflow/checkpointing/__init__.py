"""Checkpointing: barriers, manifests, the checkpoint log, the lease and the coordinator that drives epochs."""
