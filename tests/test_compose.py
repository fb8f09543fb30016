"""``compose.yaml``: Docker Compose accepts it (``docker compose config``, where the docker CLI has the compose
plugin), and it has what a scaled-out deployment needs: the shared services with health checks, the migration
before any API or worker, two APIs behind the proxy, and a worker service that can be scaled.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "compose.yaml"
MIRSERVE_SERVICES = ("migrate", "api1", "api2", "worker")


def compose_cli() -> list[str]:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this machine")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"the docker CLI has no compose plugin: {(probe.stderr or probe.stdout).strip()[:200]}")
    return [docker, "compose"]


def test_docker_compose_accepts_the_file():
    result = subprocess.run([*compose_cli(), "-f", str(COMPOSE), "config", "--quiet"], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_the_deployment_has_every_part_with_health_checks_and_a_scalable_worker():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert set(services) >= {"db", "queue", "minio", "bucket", "migrate", "api1", "api2", "proxy", "worker"}
    for name in ("db", "queue", "minio", "api1", "api2", "proxy", "worker"):
        assert "test" in services[name].get("healthcheck", {}), f"{name} has no health check"
    assert services["migrate"]["command"] == ["mirserve", "db", "upgrade"]
    environments = [services[name]["environment"] for name in MIRSERVE_SERVICES]
    assert all(env == environments[0] for env in environments), "every mirserve process must see one configuration"
    env = environments[0]
    assert env["MIRSERVE_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["MIRSERVE_REDIS_URL"].startswith("redis://queue:")
    assert env["MIRSERVE_STORAGE_URL"].startswith("s3://") and env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    for name in ("api1", "api2", "worker"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert [services[name]["command"][:2] for name in ("api1", "api2")] == [["mirserve", "api"]] * 2
    assert set(services["proxy"]["depends_on"]) == {"api1", "api2"}
    proxy = yaml.safe_load(COMPOSE.read_text())["configs"]["proxy"]["content"]
    assert "server api1:8000" in proxy and "server api2:8000" in proxy
    worker = services["worker"]
    assert worker["command"][:2] == ["mirserve", "worker"]
    # Anything fixed per container (a name, a published port, a volume) would stop `--scale worker=N`.
    assert not {"container_name", "ports", "volumes"} & set(worker)
    grace = float(env["MIRSERVE_SHUTDOWN_GRACE_SECONDS"])
    assert float(worker["stop_grace_period"].rstrip("s")) > grace, "compose must wait for the worker to drain"
