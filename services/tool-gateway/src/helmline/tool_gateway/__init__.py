"""Helmline tool-gateway service: the one door to tools: validation, policy outcome, routing."""
