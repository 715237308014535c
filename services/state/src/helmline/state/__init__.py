"""Helmline state service: checkpoints, the read model and rollback."""

from helmline.state._verify import read_model_differences

__all__ = ["read_model_differences"]
