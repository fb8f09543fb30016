"""The committed tables are exactly what the generator derives from their sources."""
import json

import onnxruntime
import pytest
from onnx import defs
from onnxruntime.capi import onnxruntime_pybind11_state as C

from worker.engine.kernels import generate
from worker.engine.kernels.table import DATA_DIR, default_table


def committed(target: str) -> dict:
    return json.loads((DATA_DIR / f"{target}.json").read_text(encoding="utf-8"))


def test_x86_table_matches_installed_onnxruntime():
    assert committed("x86") == json.loads(generate.render(generate.build_x86()))


def test_x86_table_covers_every_cpu_kernel_onnxruntime_registers():
    table = default_table()
    missing = []
    for kdef in C.get_all_opkernel_def():
        since, end = kdef.version_range
        if not table.has_kernel(kdef.op_name, kdef.domain, ["x86"], opset=since):
            missing.append(f"{kdef.domain}.{kdef.op_name}@{since}")
    assert missing == []
    assert onnxruntime.__version__ in committed("x86")["source"]


def test_x86_table_runs_every_element_type_onnxruntime_registers():
    """A registration over every type (Concat, Transpose, Slice, Split, Clip) is one ``any`` kernel over all of
    them: the float ones were once dropped, so float data movement fell back to the host on x86."""
    from worker.engine.kernels import ports as P

    entries: dict[tuple, list[dict]] = {}
    for item in committed("x86")["kernels"]:
        entries.setdefault((item["domain"], item["op"], item["since"]), []).append(item)
    missing = []
    for kdef in C.get_all_opkernel_def():
        if kdef.provider != "CPUExecutionProvider":
            continue
        since = kdef.version_range[0]
        sig = generate.signature_at(kdef.op_name, kdef.domain, since)
        primary = P.primary_param(sig, kdef.op_name) if sig is not None else None
        if primary is None:
            continue
        for name in filter(None, (P.element_name(t) for t in dict(kdef.type_constraints).get(primary, ()))):
            precision = P.TYPE_PRECISION.get(name, "any")
            if not any(e["precision"] == precision or (e["precision"] == "any" and name in (e.get("types") or [name]))
                       for e in entries.get((kdef.domain, kdef.op_name, since), [])):
                missing.append(f"{kdef.domain}.{kdef.op_name}@{since}:{name}")
    assert missing == []


@pytest.mark.parametrize("target", ["host", "arm", "cuda", "opencl", "npu"])
def test_committed_table_matches_its_source(target):
    assert committed(target) == json.loads(generate.render(generate.BUILDERS[target]()))


@pytest.mark.parametrize("target", ["host", "x86", "arm", "cuda", "opencl", "npu"])
def test_every_table_cites_its_source_at_the_top(target):
    text = (DATA_DIR / f"{target}.json").read_text(encoding="utf-8")
    head = text[:300]
    assert '"target"' in head and '"source"' in head
    assert len(committed(target)["source"]) > 40


def test_host_runs_every_standard_op_at_every_live_version():
    table = default_table()
    missing = []
    for schema in defs.get_all_schemas_with_history():
        if schema.domain not in ("", "ai.onnx.ml") or schema.deprecated:
            continue
        if not table.has_kernel(schema.name, schema.domain, ["host"], opset=schema.since_version):
            missing.append(f"{schema.domain}.{schema.name}-{schema.since_version}")
    assert missing == []


def test_generator_check_mode_reports_a_stale_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(generate, "DATA_DIR", tmp_path)
    (tmp_path / "npu.json").write_text("{}\n", encoding="utf-8")
    assert generate.main(["--check", "npu"]) == 1
    assert "npu" in capsys.readouterr().err
    assert generate.main(["npu"]) == 0
    assert generate.main(["--check", "npu"]) == 0


# --- fused ops derived from their bodies ------------------------------------------------------------------
def _standard(op: str, precision: str, layout: str = "nchw", constraints: dict | None = None) -> dict:
    from worker.engine.kernels.generate import entry
    from worker.engine.kernels.schema import PortSpec

    return entry(op, "", 1, None, precision, layout, [PortSpec("X")], [PortSpec("Y")], "test",
                 constraints=constraints)


def test_body_compute_ops_skip_the_constant_makers():
    from worker.engine.kernels.generate import body_compute_ops

    assert body_compute_ops("FusedConvSilu") == ["Conv", "Sigmoid", "Mul"]
    assert body_compute_ops("FusedConvRelu6") == ["Conv", "Clip"]          # its bounds are constants
    assert body_compute_ops("FusedGemmGelu") == ["Gemm", "Div", "Erf", "Add", "Mul", "Mul"]


def test_a_fused_op_is_derived_where_every_body_op_runs_in_that_precision_and_layout():
    from worker.engine.kernels.generate import derived_fused_entries

    conv_nhwc = {"rank": [4], "constant_inputs": [1, 2], "attributes": {"auto_pad": ["NOTSET"]}}
    table = [_standard("Conv", "fp32"), _standard("Conv", "fp16"), _standard("Conv", "fp16", "nhwc", conv_nhwc),
             _standard("Sigmoid", "fp32", "any"), _standard("Mul", "fp32", "any"), _standard("Mul", "fp16", "any")]
    derived = derived_fused_entries("arm", table)
    silu = {(e["precision"], e["layout"]): e for e in derived if e["op"] == "FusedConvSilu"}
    assert set(silu) == {("fp32", "nchw")}  # Sigmoid has no fp16 kernel, Conv no fp32 nhwc one
    assert silu[("fp32", "nchw")]["origin"].startswith("derived")
    sigmoid = {(e["precision"], e["layout"]): e for e in derived if e["op"] == "FusedConvSigmoid"}
    assert set(sigmoid) == {("fp32", "nchw")}
    assert not any(e["op"] == "FusedConvRelu" for e in derived)  # no Relu kernel at all
    # with fp16 Sigmoid the nhwc Conv's constraints carry over, except auto_pad (the fused op has none)
    derived = derived_fused_entries("arm", table + [_standard("Sigmoid", "fp16", "any")])
    silu = {(e["precision"], e["layout"]): e for e in derived if e["op"] == "FusedConvSilu"}
    assert set(silu) == {("fp32", "nchw"), ("fp16", "nchw"), ("fp16", "nhwc")}
    assert silu[("fp16", "nhwc")]["constraints"] == {"rank": [4], "constant_inputs": [1, 2]}


def test_the_table_says_otherwise_explicitly_or_by_the_underived_list():
    from worker.engine.kernels.generate import derived_fused_entries, own_domain_entries

    table = [_standard("Conv", "fp32"), _standard("Sigmoid", "fp32", "any"), _standard("Mul", "fp32", "any")]
    explicit = own_domain_entries("arm", {"ops": [{"domain": "mirserve", "ops": ["FusedConvSilu"],
                                                   "precisions": ["fp32"], "origin": "documented"}]})
    assert not any(e["op"] == "FusedConvSilu" for e in derived_fused_entries("arm", table + explicit))
    assert not any(e["op"] == "FusedConvSilu" for e in derived_fused_entries("arm", table, {"FusedConvSilu"}))
    assert any(e["op"] == "FusedConvSilu" for e in derived_fused_entries("arm", table))
