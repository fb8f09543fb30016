"""A job whose plugin pass fails: the job succeeds without the pass, says so in its summary, and is counted."""
from __future__ import annotations

import textwrap

import pytest

from tests.conftest import CORPUS
from tests.engine.plugins.test_fail_soft import BREAKS_MIDWAY
from tests.service.server import Server


@pytest.mark.models
def test_a_job_succeeds_without_the_pass_that_failed_and_warns(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "acme_breaks.py").write_text(textwrap.dedent(BREAKS_MIDWAY))
    with Server(tmp_path / "data", plugin_path=plugins, strict=0) as server:
        response = server.submit(CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx", "arm/fp32/nchw",
                                 {"input_shapes": {"x": [1, 3, 48, 192]}, "pipeline": "breaking"})
        assert response.status_code == 202, response.text
        job = server.wait_for(response.json()["id"])
        assert job["status"] == "succeeded", job["error"]
        summary = job["summary"]
        assert summary["verified"] is True and summary["pass_failures"] == 1
        [warning] = summary["warnings"]
        assert warning.startswith("pass 'breaks_midway' from ")  # the plugin's file, as /passes lists it
        assert "acme_breaks.py failed: RuntimeError: the plugin met a node it was not written for" in warning
        trace = server.client.get(job["links"]["trace"]).json()
        assert next(e for e in trace if e["pass"] == "breaks_midway")["failed"]["error"].startswith("RuntimeError")
        metrics = server.client.get("/metrics").text
        assert "# TYPE mirserve_pass_failures_total counter" in metrics
        assert "\nmirserve_pass_failures_total 1\n" in metrics
