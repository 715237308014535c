"""Helmline planner service: turns goals into plans and schedules their steps."""
