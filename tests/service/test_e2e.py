"""End to end over real HTTP: ``python -m app.cli serve`` (API + embedded worker) in its own process, the real
engine, every corpus model submitted with places, the artifact run on onnxruntime against the input model.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from tests.conftest import CORPUS, CORPUS_SHAPES, random_feeds, run_onnxruntime
from tests.service.server import Server

#: Places per corpus model: each run asks for a different mix of targets, precisions and layouts.
PLACES = {
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": "arm/fp32/nchw",
    "cls_qdq.onnx": "arm/int8/nchw,arm/fp32/nchw",
    "ch_PP-OCRv4_det_infer.onnx": "arm/fp16/nhwc,arm/fp32/nchw",
    "bert_small_dyn.onnx": "x86/fp32/nchw",
}
CAP_MB = 24  # above every corpus model (bert is 21 MB)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("e2e") / "data", max_upload_mb=CAP_MB) as running:
        yield running


@pytest.fixture(scope="module")
def passes(server):
    response = server.client.get("/passes")
    assert response.status_code == 200
    return {p["name"]: p for p in response.json()["passes"]}


def stored_job_files(server) -> set[str]:
    jobs = server.data_dir / "jobs"
    return {str(p.relative_to(jobs)) for p in jobs.rglob("*")} if jobs.exists() else set()


def assert_problem(response, status: int, field: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["title"]
    if field is not None:
        assert body["field"] == field
    return body


@pytest.mark.parametrize("name", list(CORPUS_SHAPES))
def test_a_corpus_model_is_optimized_downloaded_and_runs_like_its_input(server, passes, tmp_path, name):
    model = CORPUS / name
    shapes = CORPUS_SHAPES[name]
    response = server.submit(model, PLACES[name], {"input_shapes": shapes})
    assert response.status_code == 202, response.text
    job = server.wait_for(response.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 1 and job["progress"]["index"] == job["progress"]["total"]

    artifact = server.client.get(job["links"]["artifact"])
    assert artifact.status_code == 200
    assert hashlib.sha256(artifact.content).hexdigest() == job["artifact"]["sha256"]
    assert artifact.headers["etag"] == f'"{job["artifact"]["sha256"]}"'
    assert server.client.get(job["links"]["artifact"], headers={"If-None-Match": artifact.headers["etag"]}
                             ).status_code == 304
    optimized = tmp_path / "optimized.onnx"
    optimized.write_bytes(artifact.content)

    report = server.client.get(job["links"]["report"]).json()
    tolerance = report["verification"]
    feeds = random_feeds(model, shapes, seed=7)
    for expected, actual in zip(run_onnxruntime(model, feeds), run_onnxruntime(optimized, feeds), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=tolerance["rtol"], atol=tolerance["atol"])
    assert report["places"][:len(PLACES[name].split(","))] == PLACES[name].split(",")
    assert os.sep not in report["model"]["input"]["path"]  # no server paths over HTTP

    trace = server.client.get(job["links"]["trace"]).json()
    run = [entry for entry in trace if entry["kind"] != "fixed_point"]  # groups of passes have entries too
    assert run and {entry["pass"] for entry in run} <= set(passes)
    assert job["summary"]["passes_run"] == sum(1 for entry in run if not entry["skipped"])
    summary = job["summary"]  # the readable summary, as the CLI prints it
    assert sum(r["after"] for r in summary["op_types"]) == summary["nodes_after"] == report["summary"]["nodes"]["after"]
    assert sum(summary["nodes_per_place"].values()) == summary["nodes_after"]
    assert summary["casts"] == report["summary"]["casts"]
    # the only warnings: nodes the placement plan put on host by choice (the casts elsewhere cost more)
    assert all("by the placement plan" in w for w in summary["warnings"]), summary["warnings"]

    memory = server.client.get(job["links"]["memory"])
    assert memory.status_code == 200 and memory.json() == report["memory"]
    assert job["summary"]["arena_bytes"] == sum(a["arena_bytes"] for a in memory.json()["arenas"]) > 0


def test_passes_lists_the_registry_with_positions(passes):
    assert "type_inference" in passes
    assert passes["type_inference"]["position"] == 1
    assert all({"name", "kind", "description", "level", "targets", "position"} <= set(p) for p in passes.values())


def test_an_upload_over_the_cap_is_413_while_streaming_and_leaves_no_file(server):
    size = (CAP_MB + 8) << 20

    def chunks():  # no Content-Length: the server can only find out by counting
        for _ in range(size // (1 << 20)):
            yield b"\0" * (1 << 20)

    stored = stored_job_files(server)
    boundary = "capboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"; filename=\"big.onnx\"\r\n\r\n").encode()

    def body():
        yield head
        yield from chunks()
        yield f"\r\n--{boundary}--\r\n".encode()

    response = server.client.post("/optimize", content=body(),
                                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert_problem(response, 413, "model")
    declared = server.client.post("/optimize", files={"model": ("big.onnx", b"\0" * size)})
    assert_problem(declared, 413, "model")
    assert stored_job_files(server) == stored  # nothing kept, not even a part
    assert server.client.get("/jobs", params={"status": "queued"}).json()["total"] == 0


def test_a_file_that_is_not_onnx_ends_as_a_failed_job_that_says_so(server):
    response = server.submit(b"this is a text file, not a model\n" * 20, "x86/fp32/nchw", filename="notes.onnx")
    assert response.status_code == 202
    job = server.wait_for(response.json()["id"])
    assert job["status"] == "failed" and job["attempt"] == 1
    assert job["error"]["type"] == "ModelError" and "not an ONNX model" in job["error"]["message"]
    assert job["error"]["message"].startswith("notes.onnx:")  # the user's name, not the server's path
    assert_problem(server.client.get(job["links"]["artifact"]), 409)


def test_an_unknown_place_is_422_naming_it(server):
    body = assert_problem(server.submit(CORPUS / "cls_qdq.onnx", "arm/fp16/nhwc,dsp/fp32/nchw"), 422, "places")
    assert "'dsp'" in body["detail"]


def test_an_unknown_job_is_404(server):
    assert_problem(server.client.get("/jobs/00000000-0000-4000-8000-000000000000"), 404, "job_id")
    assert_problem(server.client.get("/no/such/path"), 404)


def test_metrics_and_readiness_over_http(server):
    assert server.client.get("/readyz").json()["checks"]["worker"]["ok"]
    metrics = server.client.get("/metrics").text
    assert "mirserve_workers 1" in metrics.splitlines()
    assert 'mirserve_jobs{status="succeeded"}' in metrics


def test_an_upload_naming_a_server_file_as_external_data_fails_and_reads_nothing(server, tmp_path):
    """The job table sits in the data dir; Constant, ConstantOfShape, initializer and sparse forms name it."""
    import onnx
    from onnx import TensorProto, helper

    database = server.data_dir.resolve() / "mirserve.db"

    def external(location: str, dims=(16,)) -> TensorProto:
        tensor = TensorProto(name="v", data_type=TensorProto.UINT8, dims=list(dims))
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value=location)
        return tensor

    out = helper.make_tensor_value_info("y", TensorProto.UINT8, [16])
    shape = helper.make_tensor("s", TensorProto.INT64, [1], [16])
    forms = {
        "constant": lambda loc: ([helper.make_node("Constant", [], ["y"], value=external(loc))], []),
        "constant_of_shape": lambda loc: ([helper.make_node("ConstantOfShape", ["s"], ["y"],
                                                            value=external(loc, (1,)))], [shape]),
        "initializer": lambda loc: ([helper.make_node("Identity", ["v"], ["y"])], [external(loc)]),
    }
    for form, build in forms.items():
        for location in ("mirserve.db", str(database), "../../mirserve.db"):
            nodes, initializers = build(location)
            model = helper.make_model(helper.make_graph(nodes, "g", [], [out], initializer=initializers),
                                      opset_imports=[helper.make_opsetid("", 17)])
            response = server.submit(model.SerializeToString(), "x86/fp32/nchw", filename=f"{form}.onnx")
            assert response.status_code == 202, response.text
            job = server.wait_for(response.json()["id"])
            assert job["status"] == "failed", (form, location, job)
            assert "never from an upload" in job["error"]["message"], job["error"]
            assert server.client.get(f"/jobs/{job['id']}/artifact").status_code in (404, 409)
