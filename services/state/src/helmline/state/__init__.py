"""Helmline state service: checkpoints, the read model and rollback."""

from helmline.state._rebuild import PROJECTIONS, RebuildError, RebuildReport, rebuild_read_model
from helmline.state._verify import caught_up, read_model_differences

__all__ = [
    "PROJECTIONS",
    "RebuildError",
    "RebuildReport",
    "caught_up",
    "read_model_differences",
    "rebuild_read_model",
]
