"""deploy/k8s: ``kubectl kustomize`` renders every overlay; the built-in kinds pass
``kubernetes-validate --strict`` (bundled schemas, no cluster).

kubernetes-validate has no schemas for CRDs, so it cannot check the Prometheus Operator's
ServiceMonitor and PrometheusRule: they are split off before it runs and checked here instead
(the PrometheusRule's spec must be deploy/prometheus/alerts.yml itself; the ServiceMonitor must
select the Services and name their port). kubectl is not a Debian package: CI machines have it
installed; without it these tests fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import promql
from tests.servers import require_tool

K8S = promql.DEPLOY / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
CRDS = {"ServiceMonitor", "PrometheusRule"}
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
# Pod volume sources that name another object of the overlay: (its kind, the naming field).
REFERENCES = {"configMap": ("ConfigMap", "name"), "secret": ("Secret", "secretName"),
              "persistentVolumeClaim": ("PersistentVolumeClaim", "claimName")}
# The Kubernetes versions the README says the manifests are validated against: 1.29 (an old
# release still widely run) and kubernetes-validate's newest schemas.
VERSIONS = ("1.29", "1.37")


def render(path: Path) -> list[dict[str, Any]]:
    """Plain ``kubectl kustomize`` (README, Deploy)."""
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(path)],
        capture_output=True, text=True, timeout=60,
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
        capture_output=True, text=True, timeout=60,
    )
    out = (result.stdout + result.stderr).strip()
    return out or (f"exit status {result.returncode}" if result.returncode else "")


def test_overlays_render(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert OVERLAYS == ["cpu-demo", "gpu"]
    common = ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "Namespace",
              "PodDisruptionBudget", "PrometheusRule", "Secret", "Service", "ServiceMonitor"]
    assert kinds(rendered["cpu-demo"]) == common
    assert kinds(rendered["gpu"]) == sorted(
        common + ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim",
                  "PodDisruptionBudget", "Service"])
    assert {d["metadata"].get("namespace") for d in rendered["gpu"]
            if d["kind"] != "Namespace"} == {"cascade"}


@pytest.mark.parametrize("version", VERSIONS)
def test_builtin_kinds_pass_kubernetes_validate_strict(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path, version: str
) -> None:
    for name, docs in rendered.items():
        builtin = [d for d in docs if d["kind"] not in CRDS]
        assert len(builtin) == len(docs) - 2
        assert validate(builtin, tmp_path, version) == "", name


def test_validator_rejects_an_unknown_field(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    deployment = one(rendered["gpu"], "Deployment", "cascade-gateway")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["retries"] = 3
    assert "'retries' was unexpected" in validate([deployment], tmp_path, VERSIONS[-1])


def test_prometheus_rule_is_the_rule_file(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rules = promql.load_yaml(promql.RULES)
    for docs in rendered.values():
        rule = one(docs, "PrometheusRule", "cascade")
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["spec"] == rules


def test_service_monitor_scrapes_every_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():
        monitor = one(docs, "ServiceMonitor", "cascade")
        wanted = monitor["spec"]["selector"]["matchLabels"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        services = [d for d in docs if d["kind"] == "Service"]
        for service in services:
            assert wanted.items() <= service["metadata"]["labels"].items()
            assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        # job = Service name: the jobs the alert rules and the dashboard expect.
        assert {s["metadata"]["name"] for s in services} <= {"cascade-gateway", "cascade-clef"}


def test_workloads_are_wired(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():
        deployments = [d for d in docs if d["kind"] == "Deployment"]
        for deployment in deployments:
            name = deployment["metadata"]["name"]
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
            service = one(docs, "Service", name)
            assert service["spec"]["selector"].items() <= labels.items()
            pdb = one(docs, "PodDisruptionBudget", name)
            assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
            target = one(docs, "HorizontalPodAutoscaler", name)["spec"]["scaleTargetRef"]
            assert (target["kind"], target["name"]) == ("Deployment", name)
            pod = deployment["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in pod["volumes"]}
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
        env = {e["name"]: e["value"] for e in gateway["env"]}
        mounts = {m["mountPath"]: m["name"] for m in gateway["volumeMounts"]}
        for init in exports:
            init_env = {e["name"]: e["value"] for e in init["env"]}
            assert init_env["CASCADE_CACHE"] == env["CASCADE_CACHE"]
            cache_mount = next(m for m in init["volumeMounts"]
                               if init_env["CASCADE_CACHE"].startswith(m["mountPath"]))
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
    policy = one(docs, "ConfigMap", next(d["metadata"]["name"] for d in docs
                                         if d["metadata"]["name"].startswith("cascade-policy")))
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
        [str(Path(sys.executable).parent / "cascade"), "policy", "check",
         str(K8S / "base" / "policy.toml")], capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
