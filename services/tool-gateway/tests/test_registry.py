"""The MCP servers file, the registry built from listings, and the breaker's states."""

from __future__ import annotations

from pathlib import Path

import pytest

from helmline.contracts import Risk, ToolDefinition
from helmline.tool_gateway import ServersFile, load_servers
from helmline.tool_gateway._config import Rate, RateLimit, ServerConfig
from helmline.tool_gateway._registry import (
    ServerView,
    rate_limit_of,
    registry_event,
    tool_specs,
)
from helmline.tool_gateway._resilience import CircuitBreaker, backoff_s
from helmline.yamlfile import YamlFileError

SERVERS = """\
servers:
  - id: git
    stdio: {command: python, args: [-m, mcp_server_git]}
    risk: medium
    tools:
      git_create_branch:
        risk: high
        required_permission: repo.write
        timeout_s: 5
        inverse: {tool: git__git_delete_branch, arguments: {name: /arguments/branch_name}}
  - id: tickets
    http: {url: "http://127.0.0.1:9/mcp", headers: {Authorization: Bearer x}}
"""


def _load(tmp_path: Path, text: str) -> ServersFile:
    path = tmp_path / "servers.yaml"
    path.write_text(text)
    return load_servers(path)


def test_a_valid_file_loads_with_transports_and_overrides(tmp_path: Path) -> None:
    servers = _load(tmp_path, SERVERS)
    git, tickets = servers.servers
    assert (git.transport, tickets.transport) == ("stdio", "http")
    assert git.tools["git_create_branch"].risk == "high"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("servers:\n  - id: Bad_Id\n    stdio: {command: x}\n", ":2: servers[0].id: String"),
        ("servers:\n  - id: a\n", ":2: servers[0]: give exactly one of `stdio` or `http`"),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n    risk: extreme\n",
            ":4: servers[0].risk: Input should be",
        ),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n    colour: red\n",
            ":4: servers[0].colour: unknown field",
        ),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n  - id: a\n    stdio: {command: y}\n",
            "server id 'a' is used twice",
        ),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n    tools:\n"
            "      t: {required_permission: ' '}\n",
            ":5: servers[0].tools.t.required_permission:",
        ),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n    tools:\n"
            "      t: {pure: true, effect: external}\n",
            ":5: servers[0].tools.t: a pure tool changes nothing: drop `effect: external`",
        ),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n    tools:\n"
            "      t: {pure: true, idempotent: false}\n",
            ":5: servers[0].tools.t: a pure tool is idempotent",
        ),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n"
            "    rate_limit: {calls: 5, tenants: {Acme: {calls: 9}}}\n",
            ":4: servers[0].rate_limit.tenants.Acme: String should match pattern",
        ),
        (
            "servers:\n  - id: a\n    stdio: {command: x}\n"
            "    rate_limit: {calls: 5, tenants: {acme: {calls: 0}}}\n",
            ":4: servers[0].rate_limit.tenants.acme.calls: Input should be greater than",
        ),
        ("servers: [\n", ":2: invalid YAML"),
    ],
)
def test_every_problem_of_a_file_names_its_line_and_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(YamlFileError) as raised:
        _load(tmp_path, text)
    assert expected in str(raised.value)


def test_the_same_tool_on_two_servers_keeps_both_under_their_prefix(tmp_path: Path) -> None:
    listed = [ToolDefinition(name="get_time", description="What time it is.")]
    one = ServerConfig.model_validate({"id": "one", "stdio": {"command": "x"}, "risk": "low"})
    two = ServerConfig.model_validate({"id": "two", "stdio": {"command": "x"}})
    registry = registry_event(
        [
            ServerView(one, tool_specs(one, listed), available=True, error=None),
            ServerView(two, tool_specs(two, listed), available=True, error=None),
        ]
    )
    tools = {tool.name: tool for tool in registry.tools}
    assert {"one__get_time", "two__get_time", "echo"} <= set(tools)
    # A server that says nothing of its risk is high risk: a person decides its calls.
    assert (tools["one__get_time"].risk, tools["two__get_time"].risk) == ("low", "high")
    assert tools["two__get_time"].remote_name == "get_time"


def test_overrides_fill_the_tool_spec(tmp_path: Path) -> None:
    git = _load(tmp_path, SERVERS).servers[0]
    [spec] = tool_specs(
        git, [ToolDefinition(name="git_create_branch", description="Create a branch.")]
    )
    assert spec.name == "git__git_create_branch"
    assert (spec.risk, spec.required_permission, spec.timeout_s) == ("high", "repo.write", 5)
    assert spec.inverse is not None
    assert spec.inverse.resolve({"branch_name": "b1"}, None) == {"name": "b1"}
    assert (spec.executor, spec.server, spec.idempotent, spec.effect) == (
        "mcp",
        "git",
        False,
        "external",
    )


def test_an_unavailable_server_is_listed_with_its_error() -> None:
    down = ServerConfig.model_validate({"id": "down", "http": {"url": "http://127.0.0.1:9/"}})
    registry = registry_event([ServerView(down, error="connection refused")])
    [status] = registry.servers
    assert (status.available, status.error, status.tools) == (False, "connection refused", 0)
    assert status.health == "dead"


def test_the_breaker_opens_after_n_failures_probes_after_the_window_and_closes() -> None:
    breaker = CircuitBreaker(threshold=3, reset_s=10)
    assert breaker.failed(0, "t") is None
    assert breaker.failed(1, "t") is None
    opened = breaker.failed(2, "t")
    assert opened is not None
    assert (opened.previous, opened.state, opened.retry_at) == ("closed", "open", 12)
    assert breaker.admit(5) == (False, None)
    admitted, probing = breaker.admit(12)
    assert admitted
    assert probing is not None
    assert probing.state == "half_open"
    assert breaker.admit(12.5) == (False, None)  # one probe at a time
    closed = breaker.succeeded()
    assert closed is not None
    assert closed.state == "closed"
    assert breaker.admit(13) == (True, None)


def test_a_failed_probe_opens_the_breaker_again() -> None:
    breaker = CircuitBreaker(threshold=1, reset_s=1)
    breaker.failed(0, "t")
    breaker.admit(1)
    reopened = breaker.failed(1, "t again")
    assert reopened is not None
    assert (reopened.previous, reopened.state) == ("half_open", "open")


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    pauses = [backoff_s(3, base_s=0.1, cap_s=5) for _ in range(200)]
    assert all(0 <= pause <= 0.4 for pause in pauses)
    assert max(pauses) > 0.2
    assert all(backoff_s(20, base_s=0.1, cap_s=5) <= 5 for _ in range(50))


def test_a_tool_declared_pure_changes_nothing_may_be_sent_again_and_keeps_its_action() -> None:
    config = ServerConfig.model_validate(
        {
            "id": "docs",
            "stdio": {"command": "x"},
            "tools": {"lookup": {"pure": True, "action": "read"}},
        }
    )
    listed = [ToolDefinition(name=name) for name in ("lookup", "publish")]
    lookup, publish = tool_specs(config, listed)
    assert (lookup.pure, lookup.effect, lookup.idempotent) == (True, "none", True)
    assert (publish.pure, publish.effect, publish.idempotent) == (False, "external", False)
    # What kind of action each does, only as declared.
    assert (lookup.action, publish.action) == ("read", None)


def test_mcp_tools_are_untrusted_unless_declared_and_built_in_tools_are_trusted() -> None:
    listed = [ToolDefinition(name=name) for name in ("fetch", "status")]
    web = ServerConfig.model_validate({"id": "web", "stdio": {"command": "x"}})
    ours = ServerConfig.model_validate(
        {
            "id": "ours",
            "stdio": {"command": "x"},
            "trust": "trusted",
            "tools": {"fetch": {"trust": "untrusted"}},
        }
    )
    assert [spec.trust for spec in tool_specs(web, listed)] == ["untrusted", "untrusted"]
    assert [spec.trust for spec in tool_specs(ours, listed)] == ["untrusted", "trusted"]
    builtin = {tool.name: tool.trust for tool in registry_event([]).tools}
    assert set(builtin.values()) == {"trusted"}


def test_a_tool_declared_read_only_may_be_sent_again_unless_declared_not_idempotent() -> None:
    declared: dict[str, dict[str, object]] = {
        "get": {"action": "read"},
        "inspect": {"effect": "none"},
        "fetch_once": {"action": "read", "idempotent": False},
        "mark_read": {"action": "read", "effect": "external"},
        "put": {"action": "write", "idempotent": True},
        "post": {"action": "write"},
    }
    config = ServerConfig.model_validate(
        {"id": "api", "stdio": {"command": "x"}, "tools": declared}
    )
    listed = [ToolDefinition(name=name) for name in declared]
    resendable = {spec.remote_name: spec.idempotent for spec in tool_specs(config, listed)}
    assert resendable == {
        "get": True,
        "inspect": True,
        "fetch_once": False,
        "mark_read": False,
        "put": True,
        "post": False,
    }


def test_annotations_set_the_defaults_and_the_file_overrides_each_field() -> None:
    listed = [
        ToolDefinition(name="look", annotations={"readOnlyHint": True}),
        ToolDefinition(name="drop", annotations={"destructiveHint": True}),
        ToolDefinition(name="put", annotations={"idempotentHint": True, "readOnlyHint": False}),
        # Read-only wins: a destructive hint means nothing on a tool that changes nothing.
        ToolDefinition(name="both", annotations={"readOnlyHint": True, "destructiveHint": True}),
        ToolDefinition(name="plain", annotations={"title": "Plain"}),
    ]
    bare = ServerConfig.model_validate({"id": "api", "stdio": {"command": "x"}, "risk": "low"})
    specs = {spec.remote_name: spec for spec in tool_specs(bare, listed)}
    fields = {
        name: (spec.effect, spec.action, spec.risk, spec.idempotent) for name, spec in specs.items()
    }
    assert fields == {
        "look": ("none", "read", "low", True),
        "drop": ("external", "delete", "high", False),
        "put": ("external", None, "low", True),
        "both": ("none", "read", "low", True),
        "plain": ("external", None, "low", False),
    }
    overridden = ServerConfig.model_validate(
        {
            "id": "api",
            "stdio": {"command": "x"},
            "risk": "low",
            "tools": {
                "look": {"effect": "external", "idempotent": False},
                "drop": {"risk": "medium", "action": "write"},
                "put": {"idempotent": False},
            },
        }
    )
    specs = {spec.remote_name: spec for spec in tool_specs(overridden, listed)}
    # Each field the file names is the file's; the others still follow the annotations.
    assert (specs["look"].effect, specs["look"].action, specs["look"].idempotent) == (
        "external",
        "read",
        False,
    )
    assert (specs["drop"].risk, specs["drop"].action) == ("medium", "write")
    assert specs["put"].idempotent is False


def test_a_definition_digest_ignores_key_order_and_follows_every_part() -> None:
    one = ToolDefinition(name="t", description="d", input_schema={"type": "object", "required": []})
    reordered = ToolDefinition(
        name="t", description="d", input_schema={"required": [], "type": "object"}
    )
    assert one.digest == reordered.digest
    assert len(one.digest) == 64
    changed = {
        one.model_copy(update={"description": "d2"}).digest,
        one.model_copy(update={"input_schema": {"type": "object"}}).digest,
        one.model_copy(update={"annotations": {"readOnlyHint": True}}).digest,
        one.model_copy(update={"name": "u"}).digest,
    }
    assert one.digest not in changed
    assert len(changed) == 4


def test_a_tenant_named_in_a_limit_has_its_own_rate(tmp_path: Path) -> None:
    (server,) = _load(
        tmp_path,
        "servers:\n  - id: a\n    stdio: {command: x}\n"
        "    rate_limit: {calls: 5, tenants: {acme: {calls: 50, per_s: 10}}}\n"
        "    tools:\n      lookup: {rate_limit: {calls: 7}}\n",
    ).servers
    by_risk: dict[Risk, RateLimit] = {
        "low": RateLimit(calls=100, tenants={"acme": Rate(calls=1000)})
    }

    def rate(server: ServerConfig, tool: str, risk: Risk, tenant: str) -> tuple[int, float] | None:
        found = rate_limit_of(server, tool, risk, by_risk, tenant)
        return (found.calls, found.per_s) if found is not None else None

    assert rate(server, "write", "low", "acme") == (50, 10)
    assert rate(server, "write", "low", "other") == (5, 60)
    # The tool's own limit names no tenant: it holds for every tenant, acme too.
    assert rate(server, "lookup", "low", "acme") == (7, 60)
    server = server.model_copy(update={"rate_limit": None, "tools": {}})
    assert rate(server, "write", "low", "acme") == (1000, 60)
    assert rate(server, "write", "low", "other") == (100, 60)
    assert rate(server, "write", "high", "acme") is None
