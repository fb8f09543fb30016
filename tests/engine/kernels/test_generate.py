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
