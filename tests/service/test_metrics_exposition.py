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


#: Enough for raw label values to overflow the 100 kB bound 27 times over (checked by labelling requests with
#: the method and path as sent: /metrics is then 2.7 MB); 10,000 proved nothing more and cost 8 s.
REQUESTS = 2_000


def test_metrics_stay_small_whatever_methods_and_paths_clients_send(tmp_path):
    """Issue 14: 3,300 requests with invented method names once made /metrics 72 MB. Label values from
    clients are normalised (unknown methods -> other, paths -> their route template or unmatched)."""
    import asyncio
    import random
    import string

    import httpx

    from app.main import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path / "data")
    upgraded_database(settings.effective_database_url)
    rng = random.Random(14)
    token = lambda n: "".join(rng.choices(string.ascii_letters + string.digits + "-_.~%", k=n))  # noqa: E731
    methods = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]
    app = create_app(settings)

    async def send_all() -> str:  # one event loop, no thread hop per request
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            for i in range(REQUESTS):
                method = rng.choice(methods) if i % 2 else token(rng.randint(1, 20)).upper().replace("%", "X")
                path = rng.choice([f"/{token(rng.randint(1, 40))}", f"/jobs/{token(36)}", f"/jobs/{token(8)}/trace",
                                   f"/problems/{token(10)}", f"/{token(5)}/{token(5)}/{token(5)}", "/jobs",
                                   "/healthz"])
                await client.request(method, path)
            return (await client.get("/metrics")).text

    text = asyncio.run(send_all())
    app.state.services.close()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    samples = families["mirserve_http_requests"].samples
    assert sum(s.value for s in samples) >= REQUESTS
    assert {s.labels["method"] for s in samples} <= {*methods, "other"}
    assert "other" in {s.labels["method"] for s in samples}
    assert "unmatched" in {s.labels["route"] for s in samples}
    assert all(s.labels["route"] == "unmatched" or s.labels["route"].startswith("/") and "{" in s.labels["route"]
               or s.labels["route"] in ("/jobs", "/healthz", "/metrics") for s in samples), {s.labels["route"] for s in samples}
    assert len(text.encode()) < 100_000, f"/metrics is {len(text.encode())} bytes"
