"""The timeline SVG: well-formed, one panel per arena, the peak marked, names escaped."""
import xml.etree.ElementTree as ET

from worker.engine.memory import Buffer, arena_report, plan_arena, render_timeline
from worker.engine.memory.timeline_svg import human_bytes

SVG = "{http://www.w3.org/2000/svg}"


def memory_section():
    host = plan_arena("host", [Buffer("a", 1024, 0, 1), Buffer("b", 2048, 1, 2)], steps=4)
    cuda = plan_arena("cuda", [Buffer("g", 4096, 2, 3)], steps=4)
    names = ["conv<0>", "relu&1", "io_copy", "gemm"]
    return {"arenas": [arena_report(cuda, names), arena_report(host, names)],
            "unplanned": [{"space": "npu", "reason": "dims batch, seq are symbolic"}]}


def test_the_svg_parses_and_has_a_panel_and_a_peak_marker_per_arena():
    root = ET.fromstring(render_timeline(memory_section()))
    assert root.tag == f"{SVG}svg"
    assert len(root.findall(f"{SVG}path")) == 2
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "peak 3.0 KiB at step 1 (relu&1)" in texts
    assert "peak 4.0 KiB at step 2 (io_copy)" in texts
    assert any(t.startswith("host: arena 3.0 KiB, lower bound 3.0 KiB") for t in texts)
    assert "not planned (npu): dims batch, seq are symbolic" in texts
    assert len(root.findall(f"{SVG}circle")) == 2


def test_the_staircase_follows_the_timeline():
    memory = {"arenas": [arena_report(plan_arena("host", [Buffer("a", 64, 1, 1)], steps=2))]}
    path = ET.fromstring(render_timeline(memory)).find(f"{SVG}path").get("d").split()
    heights = sorted({float(point.split(",")[1].lstrip("L")) for point in path[:-1] if "," in point})
    assert len(heights) == 2  # zero at step 0, 64 bytes at step 1


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 3 * 2 ** 20, 5 * 2 ** 30)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 MiB", "5.0 GiB"]
