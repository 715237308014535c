"""Helmline state service: checkpoints, the read model and rollback."""
