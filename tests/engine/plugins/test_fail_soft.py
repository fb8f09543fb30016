"""A plugin pass that raises mid-rewrite: undone byte for byte, the run goes on, verifies and warns."""
from __future__ import annotations

import onnx
import pytest

from tests.conftest import CORPUS, CORPUS_SHAPES
from tests.engine.plugins.conftest import load_path, write_plugin
from worker.engine.api import optimize
from worker.engine.cli import main
from worker.engine.ir import model_to_proto
from worker.engine.options import OptimizeOptions

#: Rewrites part of the graph the way a real pass would (fuses, renames, retypes, annotates), then fails.
BREAKS_MIDWAY = """
    import numpy as np
    from worker.engine.plugins import PassResult, default_steps, pipeline_builder, register_pass

    @register_pass(name="breaks_midway", kind="program", description="rewrites half the graph, then raises")
    def breaks_midway(ctx):
        graph = ctx.graph
        for index, node in enumerate(list(graph)):
            if index == 40:
                raise RuntimeError("the plugin met a node it was not written for")
            node.metadata["acme.seen"] = "yes"
            for value in node.outputs:
                value.shape = None
            if node.op_type == "Add":
                node.op_type = "Sub"
            elif node.domain == "mirserve" or node.op_type in ("Relu", "Sigmoid"):
                sigmoid = graph.add_node("Sigmoid", [node.input(0)], [node.output()], before=node)
                graph.remove_node(node)
                sigmoid.set_attr("acme", 1)
        graph.add_initializer("acme_table", np.arange(4, dtype=np.float32))
        ctx.model.metadata["acme.tuned"] = "yes"
        return PassResult(rewrites=1)

    @pipeline_builder(name="breaking", description="the default pipeline with breaks_midway after the rewrites")
    def breaking(options):
        steps = list(default_steps(options))
        steps.insert(steps.index("filter_domain"), "breaks_midway")
        return steps
"""

MODEL = "ch_PP-OCRv4_det_infer.onnx"


@pytest.fixture
def breaking(tmp_path, monkeypatch):
    load_path(monkeypatch, write_plugin(tmp_path / "plugins", "acme_breaks.py", BREAKS_MIDWAY))


class Snapshots:
    """An instrument keeping the serialized model before and after one pass."""

    def __init__(self, name: str):
        self.name, self.before, self.after = name, None, None

    def before_pass(self, ctx, pass_):
        if pass_.name == self.name:
            self.before = model_to_proto(ctx.model).SerializeToString(deterministic=True)

    def after_pass(self, ctx, pass_, entry):
        if pass_.name == self.name:
            self.after = model_to_proto(ctx.model).SerializeToString(deterministic=True)


@pytest.mark.models
def test_the_failed_pass_leaves_the_model_byte_for_byte_as_before_it(breaking, monkeypatch, tmp_path):
    from worker.engine import api
    from worker.engine.passes import PassManager

    snapshots = Snapshots("breaks_midway")
    monkeypatch.setattr(api, "PassManager", lambda **kw: PassManager(instruments=[snapshots], **kw))
    options = OptimizeOptions(pipeline="breaking", input_shapes=CORPUS_SHAPES[MODEL], strict=False, verify=False)
    optimize(CORPUS / MODEL, tmp_path / "det.onnx", options)
    assert snapshots.before is not None and snapshots.after == snapshots.before


@pytest.mark.models
def test_the_run_goes_on_verifies_and_writes_what_it_would_without_the_pass(breaking, tmp_path):
    shapes = CORPUS_SHAPES[MODEL]
    report = optimize(CORPUS / MODEL, tmp_path / "with.onnx",
                      OptimizeOptions(pipeline="breaking", input_shapes=shapes, strict=False))
    optimize(CORPUS / MODEL, tmp_path / "without.onnx",
             OptimizeOptions(pipeline="breaking", input_shapes=shapes, disabled_passes=("breaks_midway",)))
    # the same file, but for the pipeline it records (which names the disabled pass in one run only)
    with_pass, without_pass = (_without_pipeline_record(tmp_path / f"{n}.onnx") for n in ("with", "without"))
    assert with_pass == without_pass
    assert report["verification"]["passed"] is True
    [warning] = report["warnings"]
    assert warning["kind"] == "pass_failed" and warning["pass"] == "breaks_midway"
    assert warning["error"] == "RuntimeError: the plugin met a node it was not written for"
    assert warning["node"] is not None and warning["where"].endswith("acme_breaks.py:10")
    assert warning["message"].startswith("pass 'breaks_midway' from ")
    entry = next(e for e in report["trace"] if e["pass"] == "breaks_midway")
    assert entry["failed"] == {k: warning[k] for k in ("error", "node", "op", "where")}
    assert entry["rewrites"] == 0 and entry["nodes_after"] == entry["nodes_before"]


def _without_pipeline_record(path) -> bytes:
    model = onnx.load(str(path))
    kept = [p for p in model.metadata_props if p.key != "mirserve.pipeline"]
    assert len(kept) == len(model.metadata_props) - 1
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model.SerializeToString(deterministic=True)


@pytest.mark.models
def test_the_cli_warns_and_strict_fails(breaking, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIRSERVE_STRICT", "0")
    args = ["optimize", str(CORPUS / "ch_ppocr_mobile_v2.0_cls_infer.onnx"), "-o", str(tmp_path / "cls.onnx"),
            "--input-shape", "x=1,3,48,192", "--pipeline", "breaking"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "mirserve: warning: pass 'breaks_midway' from " in err and "RuntimeError: the plugin met" in err
    args[3] = str(tmp_path / "strict.onnx")
    assert main(args + ["--strict"]) == 1
    err = capsys.readouterr().err
    assert "mirserve: error: pass 'breaks_midway' from " in err and not (tmp_path / "strict.onnx").exists()


def test_strict_is_an_option_the_service_accepts():
    assert OptimizeOptions.from_dict({"strict": True}).strict is True
    with pytest.raises(Exception, match="option strict must be true or false"):
        OptimizeOptions.from_dict({"strict": "yes"})
