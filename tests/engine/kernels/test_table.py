"""Kernel table loading, validation, lookups and plugin additions."""
import json

import pytest

from worker.engine.kernels import KernelTable, KernelTableError, default_table
from worker.engine.kernels.table import DATA_DIR
from worker.engine.kernels.ops import ACTIVATIONS, FUSED_BASES
from worker.engine.places import Layout, Precision, register_target, unregister_target

ALL_TARGETS = ["arm", "cuda", "host", "npu", "opencl", "x86"]


def conv_entry(**overrides):
    entry = {"op": "Conv", "domain": "", "since": 11, "until": None, "precision": "fp16", "layout": "nchw",
             "inputs": [{"name": "X"}, {"name": "W"}, {"name": "B", "optional": True}],
             "outputs": [{"name": "Y"}], "origin": "test"}
    entry.update(overrides)
    return entry


def test_default_table_loads_every_target_once():
    table = default_table()
    assert table is default_table()
    assert table.targets() == ALL_TARGETS
    for target in ALL_TARGETS:
        assert table.by_target(target), target
        assert table.source(target)


def test_lookup_filters_by_opset_and_target():
    table = default_table()
    x86_conv = table.kernels("Conv", "", opset=11, targets=["x86"])
    assert [k.id for k in x86_conv] == ["x86:Conv:11-21:fp32:nchw"]
    assert table.kernels("Conv", "", opset=10, targets=["x86"])[0].until == 10
    assert table.kernels("Gelu", "", opset=18, targets=["arm"]) == []
    assert table.kernels("Gelu", "", opset=20, targets=["arm"])
    assert table.has_kernel("Conv", "", ["arm"])
    assert not table.has_kernel("NoSuchOp", "", ALL_TARGETS)
    assert not table.has_kernel("QLinearConv", "", ["arm"], opset=9)


def test_arm_declares_nhwc_conv_with_xnnpack_constraints():
    kernels = default_table().kernels("Conv", "", opset=13, targets=["arm"])
    places = {(k.precision, k.layout) for k in kernels}
    assert places == {(p, l) for p in (Precision.FP32, Precision.FP16) for l in (Layout.NCHW, Layout.NHWC)}
    nhwc = next(k for k in kernels if k.layout is Layout.NHWC)
    assert nhwc.constraints["rank"] == (4,)
    assert nhwc.constraints["constant_inputs"] == (1, 2)
    assert [p.layout for p in nhwc.inputs] == ["same", "same", "nchw"]  # data and weights NHWC, bias plain


def test_shape_inputs_of_device_kernels_are_read_from_host():
    reshape = default_table().kernels("Reshape", "", opset=13, targets=["opencl"])[0]
    assert reshape.inputs[1].target == "host" and reshape.inputs[1].precision == "int64"
    assert reshape.inputs[0].target is None


def test_every_target_has_cast_kernels():
    table = default_table()
    for target in ALL_TARGETS:
        for op in ("io_copy", "calib", "layout"):
            assert table.kernels(op, "mirserve", targets=[target]), (target, op)
    variants = {k.variant for k in table.kernels("io_copy", "mirserve", targets=["opencl"])}
    assert variants == {"host_to_device", "device_to_host"}


def test_host_runs_every_fused_op_and_targets_what_their_docs_give_or_their_bodies_run():
    table = default_table()
    for base in FUSED_BASES:
        for act in ACTIVATIONS:
            assert table.has_kernel(f"{base}{act}", "mirserve", ["host"])
    arm = [k for k in table.by_target("arm") if k.domain == "mirserve" and k.op.startswith("FusedConv")]
    documented = {k.op for k in arm if not k.origin.startswith("derived")}
    assert {"FusedConvRelu", "FusedConvRelu6", "FusedConvLeakyRelu", "FusedConvHardSwish"} <= documented
    assert "FusedConvGelu" not in documented
    # derived from the body (Conv, Div, Erf, Add, Mul): ARM's Erf takes float only, so fp32 only
    gelu = {(k.precision.value, k.layout.value) for k in arm if k.op == "FusedConvGelu"}
    assert gelu == {("fp32", "nchw"), ("fp32", "nhwc")}
    assert table.has_kernel("FusedConvSigmoid", "mirserve", ["x86"])
    # no Relu kernel of its own on NNAPI's list, but MatMul and Relu are both there
    assert table.has_kernel("FusedMatMulRelu", "mirserve", ["npu"])


def test_add_validates_and_registers():
    table = KernelTable()
    [kernel] = table.add([conv_entry()], origin="plugin-a", target="arm")
    assert kernel.id == "arm:Conv:11-:fp16:nchw"
    assert table.get(kernel.id) is kernel
    assert table.has_kernel("Conv", "", ["arm"], opset=13)


def test_add_refuses_a_clash_naming_both_origins():
    table = KernelTable()
    table.add([conv_entry()], origin="first-plugin", target="arm")
    with pytest.raises(KernelTableError) as info:
        table.add([conv_entry(since=13)], origin="second-plugin", target="arm")
    message = str(info.value)
    assert "first-plugin" in message and "second-plugin" in message and "arm/fp16/nchw" in message
    # a non-overlapping opset range, or another variant, is a different kernel
    table.add([conv_entry(since=1, until=10, origin="old")], origin="c", target="arm")
    table.add([conv_entry(variant="winograd", origin="w")], origin="d", target="arm")


def test_a_plugin_clashing_with_a_committed_table_names_the_file():
    table = KernelTable()
    table.load_file(DATA_DIR / "arm.json")
    with pytest.raises(KernelTableError, match=r"from my-plugin clashes with .* from arm\.json"):
        table.add([conv_entry(since=13)], origin="my-plugin", target="arm")


def test_add_is_all_or_nothing():
    table = KernelTable()
    with pytest.raises(KernelTableError):
        table.add([conv_entry(), conv_entry(precision="fp13")], origin="p", target="arm")
    assert len(table) == 0
    with pytest.raises(KernelTableError, match="clashes"):
        table.add([conv_entry(), conv_entry()], origin="p", target="arm")
    assert len(table) == 0


@pytest.mark.parametrize("bad, message", [
    ({"precision": "fp13"}, "bad precision 'fp13'"),
    ({"layout": "nwhc"}, "bad layout"),
    ({"since": 0}, "'since' must be an opset version"),
    ({"until": 5}, "'until' must be null or an opset version >= since"),
    ({"origin": ""}, "needs an 'origin'"),
    ({"outputs": []}, "at least one output"),
    ({"constraints": {"rank": "4"}}, "constraint 'rank'"),
    ({"constraints": {"speed": [1]}}, "unknown constraint 'speed'"),
    ({"types": ["float"]}, "only applies to precision 'any'"),
    ({"inputs": [{"name": "X", "layout": "hwcn"}]}, "bad port layout"),
    ({"colour": "red"}, "unknown field"),
])
def test_bad_entries_are_refused_with_a_sentence(bad, message):
    with pytest.raises(KernelTableError, match=message):
        KernelTable().add([conv_entry(**bad)], origin="plugin", target="arm")


def test_unknown_target_is_refused_until_registered():
    table = KernelTable()
    with pytest.raises(KernelTableError, match="target 'dsp' is not registered"):
        table.add([conv_entry()], origin="dsp-plugin", target="dsp")
    register_target("dsp", description="test DSP", origin="dsp-plugin")
    try:
        table.add([conv_entry()], origin="dsp-plugin", target="dsp")
        assert table.has_kernel("Conv", "", ["dsp"])
        assert table.remove_origin("dsp-plugin") == 1
        assert not table.has_kernel("Conv", "", ["dsp"])
    finally:
        unregister_target("dsp")


def test_load_file_reports_a_missing_field(tmp_path):
    path = tmp_path / "dsp.json"
    path.write_text(json.dumps({"target": "arm", "kernels": []}), encoding="utf-8")
    with pytest.raises(KernelTableError, match="has no 'source' field"):
        KernelTable().load_file(path)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(KernelTableError, match="cannot read kernel table"):
        KernelTable().load_file(path)


def test_a_target_table_is_read_when_a_lookup_first_names_it():
    from worker.engine.kernels.table import load_tables

    table = load_tables(lazily=True)
    assert table.kernels("Conv", targets=["x86"])
    assert {k.target for k in table._by_id.values()} == {"x86"}  # the other five files are not read yet
    assert table.source("arm") and {k.target for k in table._by_id.values()} == {"arm", "x86"}
    assert table.targets() == ALL_TARGETS  # seeing the whole table reads the rest
    assert len(table) == len(load_tables())


def test_a_plugin_clashing_with_a_table_not_read_yet_is_still_refused():
    from worker.engine.kernels.table import load_tables

    table = load_tables(lazily=True)
    entry = conv_entry(precision="fp32", since=1, until=None)
    with pytest.raises(KernelTableError, match="arm.json"):
        table.add([entry], origin="plugin.py", target="arm")
