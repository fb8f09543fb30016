"""``/metrics`` is valid Prometheus text exposition by prometheus-client's own parser, whatever was requested."""
from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import upgraded_database


def test_metrics_parse_with_prometheus_clients_parser(tmp_path):
    from app.main import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path / "data")
    upgraded_database(settings.effective_database_url)
    with TestClient(create_app(settings)) as client:
        client.post("/optimize", files={"model": ("m.onnx", b"\x08\x07 model")})
        for path in ("/", "/docs", "/problems/job-not-found", "/jobs/x/graph.svg", "/nowhere", "/jobs?limit=0"):
            client.get(path)
        client.request("BREW", "/jobs")
        text = client.get("/metrics").text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert {"mirserve_http_requests", "mirserve_http_request_duration_seconds", "mirserve_jobs",
            "mirserve_workers"} <= families.keys()
    assert families["mirserve_http_request_duration_seconds"].type == "histogram"
    routes = {s.labels.get("route") for s in families["mirserve_http_requests"].samples}
    assert {"/", "/optimize", "/jobs/{job_id}/graph.svg"} <= routes  # templates, never raw paths
    assert not any("/jobs/x" in str(route) for route in routes)
    for family in families.values():
        assert family.documentation, f"{family.name} has no HELP"
        for sample in family.samples:
            assert sample.value == sample.value  # no NaN
