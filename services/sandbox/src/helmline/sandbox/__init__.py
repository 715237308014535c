"""Helmline sandbox service: isolated execution of built-in tools."""
