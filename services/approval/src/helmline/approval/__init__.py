"""Helmline approval service: policy decisions and human approvals."""
