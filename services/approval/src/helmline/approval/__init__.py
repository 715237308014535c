"""Helmline approval service: policy decisions and human approvals.

The policy file format and its evaluation are public so that the CLI can check a file and
explain a decision exactly as the service makes it.
"""

from helmline.approval._document import (
    ApprovalTerms,
    PolicyDocument,
    RuleDocument,
    parse_duration,
)
from helmline.approval._policy import as_the_plan_asks, uses_by_rule
from helmline.approval._policy_file import (
    BUILT_IN,
    PolicyFileError,
    default_policy,
    load_policy,
    parse_policy,
    policy_hash,
)
from helmline.approval._rules import CallFacts, Policy, RuleCheck, Verdict
from helmline.yamlfile import Problem

__all__ = [
    "BUILT_IN",
    "ApprovalTerms",
    "CallFacts",
    "Policy",
    "PolicyDocument",
    "PolicyFileError",
    "Problem",
    "RuleCheck",
    "RuleDocument",
    "Verdict",
    "as_the_plan_asks",
    "default_policy",
    "load_policy",
    "parse_duration",
    "parse_policy",
    "policy_hash",
    "uses_by_rule",
]
