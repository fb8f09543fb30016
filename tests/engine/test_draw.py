"""`mirserve draw`: the optimized graph coloured by place with casts marked, as DOT or (with Graphviz) SVG."""
from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import CORPUS
from worker.engine.cli import main
from worker.engine.draw import CAST_BORDERS, PALETTE, UNPLACED

CLS = CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
SVG = "{http://www.w3.org/2000/svg}"
needs_graphviz = pytest.mark.skipif(shutil.which("dot") is None,
                                    reason="Graphviz's dot is not installed (apt-get install graphviz)")


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    """The classifier placed on ARM fp16/NHWC (casts of two kinds, a host fallback), with its report."""
    out = tmp_path_factory.mktemp("draw")
    code = main(["optimize", str(CLS), "-o", str(out / "cls.onnx"), "--input-shape", "x=1,3,48,192",
                 "--places", "arm/fp16/nhwc,arm/fp32/nchw", "--no-verify", "--report", str(out / "r.json"),
                 "--quiet"])
    assert code == 0
    return out / "cls.onnx", json.loads((out / "r.json").read_text())


def svg_nodes(path) -> dict[str, ET.Element]:
    """Graphviz SVG: one ``<g class="node">`` per DOT node, its DOT id in ``<title>``."""
    root = ET.parse(path).getroot()
    return {g.find(f"{SVG}title").text: g for g in root.iter(f"{SVG}g") if g.get("class") == "node"}


def shape_of(group: ET.Element) -> ET.Element:
    return next(e for e in group.iter() if e.tag in (f"{SVG}polygon", f"{SVG}ellipse", f"{SVG}path"))


@pytest.mark.models
@needs_graphviz
def test_svg_colours_each_node_by_its_place_and_marks_every_cast(placed, tmp_path, capsys):
    model, report = placed
    out = tmp_path / "graph.svg"
    assert main(["draw", str(model), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    nodes = svg_nodes(out)
    drawn = {k: g for k, g in nodes.items() if re.fullmatch(r"n\d+", k)}
    assert len(drawn) == report["model"]["output"]["nodes"]
    order = sorted(report["kernels"]["places"].items(), key=lambda kv: -kv[1])
    colour = {place: PALETTE[i] for i, (place, _) in enumerate(order)}
    fills: dict[str, int] = {}
    for group in drawn.values():
        fill = shape_of(group).get("fill")
        fills[fill] = fills.get(fill, 0) + 1
    assert fills == {colour[place]: count for place, count in report["kernels"]["places"].items()}
    casts = [g for g in drawn.values() if shape_of(g).get("stroke") in CAST_BORDERS.values()]
    assert len(casts) == len(report["kernels"]["casts"])
    texts = [" ".join(t.text for t in g.iter(f"{SVG}text")) for g in casts]
    assert sum(t.startswith("layout ") for t in texts) == report["summary"]["casts"]["layout"]
    assert "calib input -> arm/fp16/nchw" in texts  # the model input is converted to fp16 first
    legend = [" ".join(t.text for t in g.iter(f"{SVG}text")) for k, g in nodes.items() if k.startswith("legend")]
    assert {f"{place}: {count} node(s)" for place, count in order} <= set(legend)


@pytest.mark.models
def test_dot_needs_nothing_installed_and_names_kernel_and_place_in_tooltips(placed, tmp_path, monkeypatch):
    model, report = placed
    monkeypatch.setenv("PATH", str(tmp_path))  # no Graphviz
    out = tmp_path / "graph.dot"
    assert main(["draw", str(model), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("digraph model {")
    first = report["kernels"]["nodes"][0]
    assert f"kernel {first['kernel']}" in text and f"place {first['place']}" in text


@pytest.mark.models
def test_without_graphviz_an_svg_is_refused_with_how_to_get_it(placed, tmp_path, monkeypatch, capsys):
    model, _ = placed
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["draw", str(model), "-o", str(tmp_path / "graph.svg")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mirserve: error: drawing SVG needs Graphviz's 'dot' program, which is not installed")
    assert "apt-get install graphviz" in err and "-o graph.dot" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "graph.svg").exists()


@needs_graphviz
def test_an_unplaced_model_is_drawn_grey(tmp_path):
    from tests.conftest import make_model, save_proto, vinfo
    from onnx import helper

    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vinfo("x", shape=[2])],
                       [vinfo("y", shape=[2])])
    out = tmp_path / "g.svg"
    assert main(["draw", str(save_proto(model, tmp_path / "m.onnx")), "-o", str(out)]) == 0
    nodes = svg_nodes(out)
    assert shape_of(nodes["n0"]).get("fill") == UNPLACED and not any(k.startswith("legend") for k in nodes)
    assert {"input0", "output0"} <= set(nodes)


@pytest.mark.parametrize("args, message", [
    (["-o", "{tmp}/g.jpeg"], "cannot tell the picture's format from the name"),
    (["-o", "{tmp}/missing/g.svg"], "the directory"),
    (["-o", "{tmp}/g.dot", "--max-nodes", "0"], "the graph has 1 nodes, more than the 0 a picture is drawn for"),
])
def test_bad_requests_are_one_line(tmp_path, capsys, args, message):
    from tests.conftest import make_model, save_proto, vinfo
    from onnx import helper

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", shape=[2])], [vinfo("y", shape=[2])])
    path = save_proto(model, tmp_path / "m.onnx")
    assert main(["draw", str(path), *[a.format(tmp=tmp_path) for a in args]]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
