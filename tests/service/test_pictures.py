"""A job's pictures over HTTP: the Chrome trace, the trace and memory timelines, the graph coloured by place."""
from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from tests.conftest import CORPUS
from tests.engine.test_trace_events import check_trace_event_format

SVG = "{http://www.w3.org/2000/svg}"
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def finished(real_server):
    """The classifier optimized for ARM fp16/NHWC by the real service."""
    model = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    response = real_server.submit(model, "arm/fp16/nhwc,arm/fp32/nchw", {"input_shapes": {"x": [1, 3, 48, 192]}})
    job = real_server.wait_for(response.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    return job


@pytest.mark.models
def test_the_chrome_trace_follows_the_trace_event_format(real_server, finished):
    response = real_server.client.get(f"/jobs/{finished['id']}/trace", params={"format": "chrome"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    events = check_trace_event_format(response.json())
    trace = real_server.client.get(f"/jobs/{finished['id']}/trace").json()
    assert [e["name"] for e in events if e["ph"] == "X" and e["tid"] == 1] == [t["pass"] for t in trace
                                                                                 if not t["skipped"]]
    process = next(e for e in events if e["name"] == "process_name")
    assert process["args"]["name"] == f"mirserve job {finished['id']} (ch_ppocr_mobile_v2.0_cls_infer.onnx)"


@pytest.mark.models
def test_trace_and_memory_timelines_are_svg(real_server, finished):
    trace = real_server.client.get(f"/jobs/{finished['id']}/trace.svg")
    assert trace.status_code == 200 and trace.headers["content-type"] == "image/svg+xml"
    bars = [r for r in ET.fromstring(trace.text).iter(f"{SVG}rect") if r.get("class") == "pass"]
    ran = [t for t in real_server.client.get(f"/jobs/{finished['id']}/trace").json()
           if not t["skipped"] and t["kind"] != "fixed_point"]
    assert len(bars) == len(ran)
    memory = real_server.client.get(f"/jobs/{finished['id']}/memory/timeline.svg", params={"space": "host"})
    assert memory.status_code == 200 and memory.headers["content-type"] == "image/svg+xml"
    texts = [t.text or "" for t in ET.fromstring(memory.text).iter(f"{SVG}text")]
    assert any(t.startswith("peak ") for t in texts)
    missing = real_server.client.get(f"/jobs/{finished['id']}/memory/timeline.svg", params={"space": "gpu"})
    assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM
    assert missing.json()["field"] == "space" and "has host" in missing.json()["detail"]


@pytest.mark.models
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")
def test_the_graph_is_drawn_once_in_a_child_and_then_served_from_the_file(real_server, finished):
    first = real_server.client.get(f"/jobs/{finished['id']}/graph.svg")
    assert first.status_code == 200 and first.headers["content-type"] == "image/svg+xml"
    nodes = [g for g in ET.fromstring(first.text).iter(f"{SVG}g") if g.get("class") == "node"]
    assert len([g for g in nodes if g.find(f"{SVG}title").text.startswith("n")]) == finished["summary"]["nodes_after"]
    again = real_server.client.get(f"/jobs/{finished['id']}/graph.svg")
    assert again.content == first.content and again.headers.get("last-modified") == first.headers.get("last-modified")
    cached = list(real_server.data_dir.glob(f"jobs/{finished['id']}/**/graph.svg"))
    assert len(cached) == 1 and not list(real_server.data_dir.glob(f"jobs/{finished['id']}/**/.graph-*"))


def test_without_graphviz_the_graph_is_a_503_that_says_why(tmp_path, monkeypatch):
    from app import pictures
    from app.errors import Unavailable

    model = tmp_path / "model.onnx"
    shutil.copy(CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx", model)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Unavailable) as raised:
        pictures._draw(model, tmp_path / "graph.svg", SimpleNamespace(id="j", input_filename="model.onnx"))
    assert raised.value.code == "graphviz-missing" and "apt-get install graphviz" in raised.value.detail
    assert not (tmp_path / "graph.svg").exists()


def test_pictures_of_an_unfinished_or_unknown_job(tmp_path):
    from app.main import create_app
    from app.settings import Settings
    from tests.service.conftest import FAKE_ENGINE, upgraded_database

    settings = Settings(data_dir=tmp_path / "data", engine=FAKE_ENGINE)
    upgraded_database(settings.effective_database_url)
    with TestClient(create_app(settings)) as client:
        job = client.post("/optimize", files={"model": ("m.onnx", b"\x08\x07 model")}).json()
        for suffix in ("trace.svg", "memory/timeline.svg", "graph.svg", "trace?format=chrome"):
            response = client.get(f"/jobs/{job['id']}/{suffix}")
            assert response.status_code == 409 and response.headers["content-type"] == PROBLEM, suffix
            assert response.json()["job_status"] == "queued"
            assert client.get(f"/jobs/nope/{suffix}").status_code == 404
        bad = client.get(f"/jobs/{job['id']}/trace", params={"format": "perfetto"})
        assert bad.status_code == 422 and bad.json()["field"] == "query.format"
