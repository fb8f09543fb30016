"""The remote commands against ``mirserve serve``: ``submit --wait -o`` gives, byte for byte, the model and
the summary of a local ``mirserve optimize``; a progress bar on a terminal; ``jobs``, ``job``, ``cancel``."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, CORPUS_SHAPES

REPO = Path(__file__).resolve().parents[2]
#: A different mix of targets, precisions and layouts per model.
PLACES = {
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": "arm/fp16/nhwc,arm/fp32/nchw",
    "cls_qdq.onnx": "arm/int8/nchw,arm/fp32/nchw",
    "ch_PP-OCRv4_det_infer.onnx": "x86/fp32/nchw",
    "bert_small_dyn.onnx": "arm/fp16/nchw,x86/fp32/nchw",
}


def mirserve(*args: str, cwd: Path, server=None, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "110"}
    if server is not None:
        env["MIRSERVE_SERVER"] = server.url
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, **popen)


def option_args(name: str) -> list[str]:
    args = ["--places", PLACES[name]]
    for value, dims in CORPUS_SHAPES[name].items():
        args += ["--input-shape", f"{value}={','.join(map(str, dims))}"]
    return args


def without_timing(text: str) -> str:
    """The printed outcome minus what differs between any two runs: wall times."""
    text = re.sub(r" in \d+\.\d\d s;", " in T s;", text)
    return re.sub(r"(?m)^seconds +\d+\.\d\d$", "seconds T", text)


@pytest.mark.models
@pytest.mark.parametrize("name", list(PLACES))
def test_submit_wait_gives_the_local_model_byte_for_byte_and_the_same_summary(real_server, tmp_path, name):
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    model = str(CORPUS / name)
    here = mirserve("optimize", model, "-o", "out.onnx", *option_args(name), cwd=local)
    assert here.returncode == 0, here.stderr
    there = mirserve("submit", model, *option_args(name), "--wait", "-o", "out.onnx", cwd=remote,
                     server=real_server)
    assert there.returncode == 0, there.stderr + real_server.log()
    assert there.stderr == ""  # no progress bar when stderr is not a terminal
    assert (remote / "out.onnx").read_bytes() == (local / "out.onnx").read_bytes()
    assert without_timing(there.stdout) == without_timing(here.stdout)
    assert there.stdout.startswith("wrote out.onnx: ") and "verified on 1 run(s)" in there.stdout


@pytest.fixture(scope="module")
def paced_server(tmp_path_factory):
    """The real engine, each pass held 0.05 s: the bar polls every 0.5 s, and a job of one-second passes
    would otherwise show one or two of them, as many as happened to be running when it looked."""
    from tests.service.server import Server

    with Server(tmp_path_factory.mktemp("paced") / "data", engine="tests.service.engines:slow_optimize",
                test_pass_delay=0.05) as running:
        yield running


@pytest.mark.models
def test_a_terminal_gets_a_progress_bar_per_pass(paced_server, tmp_path):
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MIRSERVE_SERVER": paced_server.url, "COLUMNS": "120"}
    name = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    child = subprocess.Popen([sys.executable, "-m", "app.cli", "submit", str(CORPUS / name), *option_args(name),
                              "--wait"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    assert child.wait(60) == 0, text[-2000:] + paced_server.log()
    passes = set(re.findall(r"[0-9a-f]{8} (\w+) .*?(\d+)/(\d+)", text))
    assert len({p for p, _, _ in passes}) >= 3, text[-2000:]  # several passes were shown as they ran
    assert all(int(i) <= int(n) for _, i, n in passes)


def test_a_model_with_external_data_goes_as_an_archive_and_comes_back_as_one(real_server, tmp_path):
    import tarfile

    import onnx

    from tests.service.archives import model_with_external_data, pack_directory

    source = model_with_external_data(tmp_path / "source")
    (tmp_path / "model.tar.gz").write_bytes(pack_directory("tar.gz", source.parent))
    done = mirserve("submit", "model.tar.gz", "--places", "x86/fp32/nchw", "-o", "out.tar", cwd=tmp_path,
                    server=real_server)
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "out.tar") as archive:
        assert archive.getnames() == ["model.opt.onnx"]  # small weights come back inside the model
        archive.extractall(tmp_path / "out", filter="data")
    optimized = onnx.load(tmp_path / "out" / "model.opt.onnx")
    assert [n.op_type for n in optimized.graph.node] == ["Gemm"]


@pytest.mark.models
def test_jobs_job_and_cancel(real_server, tmp_path):
    name = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    submitted = mirserve("submit", str(CORPUS / name), *option_args(name), cwd=tmp_path, server=real_server)
    assert submitted.returncode == 0, submitted.stderr
    job_id, status = submitted.stdout.split()
    assert status == "queued"
    listed = mirserve("jobs", "--json", cwd=tmp_path, server=real_server)
    assert job_id in [j["id"] for j in json.loads(listed.stdout)["items"]]
    table = mirserve("jobs", cwd=tmp_path, server=real_server).stdout
    assert job_id in table and table.splitlines()[0].endswith("jobs")

    from app.client import Client

    with Client(real_server.url) as client:
        client.job(job_id).wait()
    shown = mirserve("job", job_id, "-o", "got.onnx", "--chrome-trace", "trace.json", cwd=tmp_path,
                     server=real_server)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"{job_id} succeeded\nsummary: 566 -> ")
    assert "nodes per place" in shown.stdout and (tmp_path / "got.onnx").stat().st_size > 0
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    trace = mirserve("job", job_id, "--trace", cwd=tmp_path, server=real_server).stdout
    assert trace.startswith("pass trace") and "type_inference" in trace and "memory_plan" in trace
    memory = mirserve("job", job_id, "--memory", cwd=tmp_path, server=real_server).stdout
    assert memory.startswith("memory per space") and "lower bound" in memory
    report = json.loads(mirserve("job", job_id, "--report", cwd=tmp_path, server=real_server).stdout)
    assert report["summary"]["nodes"]["before"] == 566

    cancel = mirserve("cancel", job_id, cwd=tmp_path, server=real_server)
    assert cancel.returncode == 1
    assert cancel.stderr == (f"mirserve: error: the job is already succeeded; there is nothing to cancel "
                             f"[HTTP 409]\n")
    missing = mirserve("job", "no-such-job", cwd=tmp_path, server=real_server)
    assert missing.returncode == 1 and missing.stderr.startswith("mirserve: error: there is no job 'no-such-job'")


@pytest.mark.models
def test_a_bad_option_is_refused_by_the_service_before_the_upload(real_server, tmp_path):
    done = mirserve("submit", str(CORPUS / "cls_qdq.onnx"), "--places", "arm/fp16/nhwc,tpu/fp32/nchw", "--wait",
                    cwd=tmp_path, server=real_server)
    assert done.returncode == 1
    assert done.stderr.startswith("mirserve: error: bad target 'tpu' in place 'tpu/fp32/nchw'")
    failed = mirserve("submit", str(CORPUS / "bert_small_dyn.onnx"), "--cut-end", "nope", "-o", "x.onnx",
                      cwd=tmp_path, server=real_server)
    assert failed.returncode == 1 and not (tmp_path / "x.onnx").exists()
    assert re.match(r"mirserve: error: job \S+ failed: OptionsError: cut_end names 'nope', which is no value of "
                    r"the model's graph .* \(field cut_end\)", failed.stderr)
