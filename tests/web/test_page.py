"""The web page in a real browser: submit through the form, watch the job succeed live, read the job page
(summary, trace timeline, memory timeline, graph), download the model, and look at the screenshots."""
from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from collections import Counter
from urllib.parse import urlparse

import pytest

from tests.conftest import CORPUS

MODEL = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
pytestmark = pytest.mark.models


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and pixel rows (RGBA or RGB, 8 bits) of a non-interlaced PNG, such as Chromium writes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, {}
    idat = b""
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IDAT":
            idat += body
        chunks.setdefault(kind, body)
        position += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0
    channels = 4 if colour == 6 else 3
    raw, stride = zlib.decompress(idat), width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, [bytes(r[i:i + channels][:3]) for r in rows for i in range(0, stride, channels)]


def assert_not_blank(shot: bytes, what: str) -> None:
    """More than a background: several colours, and a real share of pixels off the dominant one."""
    width, height, pixels = png_pixels(shot)
    colours = Counter(pixels)
    background, count = colours.most_common(1)[0]
    assert len(colours) >= 16, f"{what}: only {len(colours)} colours"
    assert 1 - count / len(pixels) > 0.02, f"{what}: {count / len(pixels):.1%} of it is {background.hex()}"


def test_a_model_submitted_through_the_form_is_followed_to_its_summary_and_downloaded(real_server, page, tmp_path):
    page.goto(real_server.url + "/")
    assert page.title() == "mirserve: jobs"
    page.set_input_files("input[name=model]", str(MODEL))
    page.fill("input[name=places]", "arm/fp16/nhwc,arm/fp32/nchw")
    page.fill("textarea[name=options]", json.dumps({"input_shapes": {"x": [1, 3, 48, 192]}}))
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}$"), timeout=30_000)
    job_id = urlparse(page.url).path.rsplit("/", 1)[-1]
    statuses = []
    page.on("response", lambda r: statuses.append(r.url) if r.url.endswith(f"/jobs/{job_id}") else None)
    page.wait_for_selector("#job-status.status-succeeded", timeout=120_000)  # live, then the page reloads
    assert statuses or page.locator("#summary").count()  # polled (or it had finished before the first poll)

    summary = page.locator("#summary")
    assert summary.is_visible()
    figures = page.inner_text("#summary-figures")
    assert re.search(r"nodes\s+566 → \d+", figures) and "passed on 1 run(s)" in figures
    assert "arm/fp16/nhwc" in page.inner_text("#summary-places")
    # ARM runs every fused op now; what is on host there is a view ARM's table leaves to the host (the
    # classifier's Reshape to [N, C]), and the page says why
    assert "no kernel for Reshape on arm" in page.inner_text("#summary-fallbacks")
    assert "host" in page.inner_text("#summary-memory") and "Conv" in page.inner_text("#summary-ops")
    for section in ("#trace-timeline img", "#memory-timeline img"):
        page.locator(section).scroll_into_view_if_needed()
        loaded = page.eval_on_selector(section, "img => img.complete && img.naturalWidth > 0")
        assert loaded, f"{section} did not load"
    page.locator("#graph object").scroll_into_view_if_needed()
    graph = page.evaluate(f"fetch('/jobs/{job_id}/graph.svg').then(r => r.headers.get('content-type'))")
    assert graph == "image/svg+xml"

    with page.expect_download() as waiting:
        page.click("#downloads >> text=optimized model")
    saved = tmp_path / "downloaded.onnx"
    waiting.value.save_as(saved)
    job = real_server.client.get(f"/jobs/{job_id}").json()
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == job["artifact"]["sha256"]

    page.locator("#summary").scroll_into_view_if_needed()
    assert_not_blank(page.locator("#summary").screenshot(), "the summary")
    assert_not_blank(page.locator("#trace-timeline").screenshot(), "the trace timeline")
    assert_not_blank(page.locator("#memory-timeline").screenshot(), "the memory timeline")
    assert_not_blank(page.screenshot(full_page=True), "the job page")

    page.goto(real_server.url + "/")
    row = page.locator(f"#jobs tr[data-id='{job_id}']")
    assert row.locator(".status").inner_text() == "succeeded"
    assert_not_blank(page.screenshot(full_page=True), "the job list")


def test_the_job_list_follows_a_job_live(real_server, page):
    page.goto(real_server.url + "/")
    response = real_server.submit(CORPUS / "cls_qdq.onnx", "x86/fp32/nchw", {"input_shapes": {"x": [1, 3, 48, 192]}})
    job_id = response.json()["id"]
    page.wait_for_selector(f"#jobs tr[data-id='{job_id}'] .status-succeeded", timeout=120_000)  # no reload


def test_a_refused_submission_says_why_on_the_page(real_server, page):
    page.goto(real_server.url + "/")
    page.set_input_files("input[name=model]", str(MODEL))
    page.fill("input[name=places]", "arm/fp16/nhwc,tpu/fp32/nchw")
    page.click("button[type=submit]")
    page.wait_for_selector("#submit-status.error")
    assert "bad target 'tpu'" in page.inner_text("#submit-status") and "(field places)" in page.inner_text(
        "#submit-status")


def test_the_api_docs_work_without_internet(real_server, page):
    outside = []

    def only_this_server(route):
        if urlparse(route.request.url).netloc == urlparse(real_server.url).netloc:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    page.goto(real_server.url + "/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
    assert "mirserve" in page.inner_text(".swagger-ui .info .title")
    assert page.locator(".opblock").count() > 10 and outside == []
    assert_not_blank(page.screenshot(), "the API docs")


def test_a_problem_type_leads_to_its_explanation(real_server, page):
    problem = real_server.client.get("/jobs/no-such-job").json()
    page.goto(real_server.url + problem["type"])
    assert page.inner_text("h1") == "Job not found"
    assert "retention" in page.inner_text("main")
