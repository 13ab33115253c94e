"""docker-compose.yml validates against the Compose Specification, and its services are
complete: health checks everywhere, pinned images, the profiles docs/deploy.md names, mounts that
exist. No Docker engine runs on these machines: this is what validates the file.

The validator is ``compose-spec`` from PyPI (bindings to the maintained ``compose_spec`` Rust
crate, with the specification's Pydantic models), a test dependency: nothing is read from
outside the repository.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import compose_spec
import pytest
import yaml

from cascade.settings import Settings
from tests.deploy import promql

COMPOSE = promql.REPO / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return promql.load_yaml(COMPOSE)


def errors(document: dict[str, Any]) -> list[str]:
    """The validator's complaint about ``document`` (YAML merge keys applied, as Compose does),
    or nothing."""
    try:
        parsed = compose_spec.PyOptions(apply_merge=True).from_yaml(yaml.safe_dump(document))
        parsed.validate()
        parsed.to_spec()
    except ValueError as exc:  # the parser's and Pydantic's errors both are ValueErrors
        return [str(exc)]
    return []


def test_validates_against_the_compose_spec(compose: dict[str, Any]) -> None:
    assert errors(compose) == []


def test_schema_rejects_a_misspelt_key(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["grafana"]["healthcheck"]["intervall"] = "10s"
    assert any("intervall" in e for e in errors(broken))


def test_every_service_has_a_health_check_and_a_pinned_image(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        check = service["healthcheck"]
        assert check["test"][0] == "CMD" and not check.get("disable"), name
        image = service["image"]
        # A release, or PostgreSQL's MAJOR.MINOR (its own numbering has no third part).
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+|postgres:\d+\.\d+", image), (name, image)


def test_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    profiles = {name: tuple(s.get("profiles", ())) for name, s in services.items()}
    assert profiles == {
        "gateway": ("gpu",),
        "clef": ("gpu",),
        "demo": ("demo",),
        "ollama": ("ollama",),
        "gateway-ollama": ("ollama",),
        "postgres": ("fleet",),
        "fleet-a": ("fleet",),
        "fleet-b": ("fleet",),
        "prometheus": (),
        "grafana": (),
    }
    # The demo needs no GPU: nothing reserves one.
    assert "deploy" not in services["demo"] and "--demo" in services["demo"]["entrypoint"]
    # Ollama (>= 0.35.1 serves clef-flash on /v1/systemone) replaces the clef service.
    version = tuple(int(p) for p in services["ollama"]["image"].split(":")[1].split("."))
    assert version >= (0, 35, 1)
    assert services["gateway-ollama"]["command"] == ["--policy", "policies/compose-ollama.toml"]
    assert list(services["gateway-ollama"]["depends_on"]) == ["ollama"]
    policy = (promql.REPO / "policies" / "compose-ollama.toml").read_text()
    assert 'urls = ["http://ollama:11434"]' in policy


def test_mounted_files_exist_and_agree(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and source != "./models":
                assert (promql.REPO / source).exists(), (name, volume)
        build = service.get("build")
        if build:
            assert (promql.REPO / build["dockerfile"]).exists(), name
        command = service.get("command") or []
        if "--policy" in command:
            assert (promql.REPO / command[command.index("--policy") + 1]).exists(), name
    for secret in compose["secrets"].values():
        assert (promql.REPO / secret["file"]).exists()
    # Prometheus reads deploy/prometheus as /etc/prometheus (rule_files are relative to it).
    assert "./deploy/prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    # Grafana's dashboard provider reads the folder the dashboards are mounted at.
    (provider,) = promql.load_yaml(
        promql.DEPLOY / "grafana" / "provisioning" / "dashboards" / "cascade.yml"
    )["providers"]
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"


# Services that are a cascade gateway (auth by API key): the only ones published on every
# interface. The rest have no auth of their own.
GATEWAYS = {"gateway", "gateway-ollama", "demo", "fleet-a", "fleet-b"}


def published(port: str) -> tuple[str, str]:
    """(host address, host port) of a short-syntax port mapping; "" is every interface."""
    parts = port.split(":")
    assert len(parts) in (2, 3), port
    return ("" if len(parts) == 2 else parts[0]), parts[-2]


def test_only_gateways_listen_on_every_interface(compose: dict[str, Any]) -> None:
    seen = set()
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            address, host_port = published(port)
            seen.add(name)
            if name in GATEWAYS:  # the fleet's second replica on the next port
                assert host_port == ("8001" if name == "fleet-b" else "8000"), (name, port)
            else:
                assert address == "127.0.0.1", (name, port)
    assert seen >= {"clef", "ollama", "prometheus", "grafana"}


def test_grafana_has_no_default_password(compose: dict[str, Any]) -> None:
    """Grafana's own default is admin/admin: the compose file must set the password, and only
    from a variable compose refuses to start without (``${VAR:?message}``, no ``:-`` default)."""
    env = compose["services"]["grafana"]["environment"]
    password = env["GF_SECURITY_ADMIN_PASSWORD"]
    match = re.fullmatch(r"\$\{(\w+):\?(.+)\}", password)
    assert match and match.group(1) in match.group(2), password
    text = COMPOSE.read_text()
    assert "admin/admin" not in text
    assert f"export {match.group(1)}=" in text  # the header says how to set it


def test_demo_builds_on_a_cpu_base_image(compose: dict[str, Any]) -> None:
    demo = compose["services"]["demo"]
    dockerfile = (promql.REPO / demo["build"]["dockerfile"]).read_text()
    bases = re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE)
    assert bases == ["python:3.11-slim"], bases
    commands = [c for c in dockerfile.replace("\\\n", " ").splitlines() if not c.startswith("#")]
    assert not re.search(r"cuda|nvidia", "\n".join(commands), re.IGNORECASE)
    # The serving lock with hashes, and its torch is the CPU build.
    (install,) = [c for c in commands if "pip install" in c and "deploy/lock/serve.txt" in c]
    assert "--require-hashes" in install and "--no-deps" in install, install
    lock = (promql.REPO / "deploy" / "lock" / "serve.txt").read_text()
    assert re.search(r"^torch==[\d.]+\+cpu ", lock, re.MULTILINE)
    assert demo["image"].startswith("cascade-demo:")


def test_fleet_gateways_share_the_postgres_service(compose: dict[str, Any]) -> None:
    """The fleet profile: PostgreSQL 15 (official image, a named volume, ``pg_isready``, the
    password from a secret file), and gateway replicas that log to it once it is healthy,
    reading the same secret as CASCADE_DECISION_LOG_PASSWORD_FILE."""
    services = compose["services"]
    postgres = services["postgres"]
    fleet = [services["fleet-a"], services["fleet-b"]]
    assert postgres["image"].split(":")[0] == "postgres"
    assert postgres["image"].split(":")[1].split(".")[0] == "15"
    assert "ports" not in postgres  # reached on the compose network only
    volume, _, data = postgres["volumes"][0].partition(":")
    assert volume in compose["volumes"] and data == "/var/lib/postgresql/data"
    check = postgres["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"]
    env = postgres["environment"]
    user, database = env["POSTGRES_USER"], env["POSTGRES_DB"]
    assert check[check.index("-U") + 1] == user and check[check.index("-d") + 1] == database
    assert "POSTGRES_PASSWORD" not in env
    (secret,) = postgres["secrets"]
    assert env["POSTGRES_PASSWORD_FILE"] == f"/run/secrets/{secret}"
    password = (promql.REPO / compose["secrets"][secret]["file"]).read_text().split()
    assert len(password) == 1  # one line: both sides read the file whole

    fields = {f"CASCADE_{f.upper()}" for f in Settings.__struct_fields__}
    for gateway in fleet:
        assert gateway["depends_on"] == {"postgres": {"condition": "service_healthy"}}
        assert secret in gateway["secrets"] and "--demo" in gateway["entrypoint"]
        gateway_env = gateway["environment"]
        assert "PGPASSWORD" not in gateway_env
        # The same database, no password in the URL: it comes from the secret.
        url = gateway_env["CASCADE_DECISION_LOG"]
        assert url == f"postgresql://{user}@postgres:5432/{database}"
        assert gateway_env["CASCADE_DECISION_LOG_PASSWORD_FILE"] == f"/run/secrets/{secret}"
        assert {"CASCADE_DECISION_LOG", "CASCADE_DECISION_LOG_PASSWORD_FILE"} <= fields
