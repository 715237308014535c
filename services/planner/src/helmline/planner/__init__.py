"""Helmline planner service: turns goals into plans and schedules their steps."""

from helmline.planner._settings import PlannerSettings
from helmline.planner._shadow import Divergence, ShadowReport, shadow_replay

__all__ = ["Divergence", "PlannerSettings", "ShadowReport", "shadow_replay"]
