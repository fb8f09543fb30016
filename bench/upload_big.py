"""Upload a large model with external data as a ``.tar`` through ``mirserve serve`` and watch the API's memory.

The tar is made on the fly from the model and its data file (headers and file contents streamed, nothing
written to disk), sent as a chunked multipart upload, and the API process's peak resident set (Linux's VmHWM,
reset just before the upload) is compared with its resident set before: issue 13 asks for growth under 100 MB
whatever the upload's size. With ``--engine real`` the job then runs the real engine and its outcome is
printed; with ``--engine fake`` (the service tests' scripted engine) only the upload is measured, so a 12 GB
model needs disk for the upload and its extraction only.

Usage: python bench/upload_big.py [--dir /work/scratch/bigmodel/7b] [--engine fake|real] [--places P]
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.service.server import Server  # noqa: E402

FAKE_ENGINE = "tests.service.engines:scripted"
CHUNK = 1 << 20


class TarStream(io.RawIOBase):
    """A tar of the given files, produced as it is read (no length known in advance: a chunked upload)."""

    def __init__(self, files: list[Path]):
        self.parts = self._parts(files)
        self.pending = b""
        self.sent = 0

    def _parts(self, files: list[Path]):
        for path in files:
            info = tarfile.TarInfo(path.name)
            info.size = path.stat().st_size
            yield info.tobuf(tarfile.PAX_FORMAT)  # ustar sizes stop at 8 GiB
            with open(path, "rb") as f:
                while block := f.read(CHUNK):
                    yield block
            yield bytes(-info.size % 512)
        yield bytes(1024)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            try:
                self.pending = next(self.parts)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        self.sent += n
        return n


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/work/scratch/bigmodel/7b")
    parser.add_argument("--model", default="llama.onnx")
    parser.add_argument("--engine", choices=("fake", "real"), default="fake")
    parser.add_argument("--places", default="arm/fp16/nchw,arm/fp32/nchw")
    parser.add_argument("--options", default='{"atol": 0.02}', help="JSON options of the job")
    args = parser.parse_args()
    model = Path(args.dir) / args.model
    files = [model, model.with_name(model.name + ".data")]
    total = sum(f.stat().st_size for f in files)
    settings = {"max_upload_mb": total // (1 << 20) + 64, "job_time_limit_seconds": 7200, "auth": "none",
                "max_unpacked_mb": total // (1 << 20) + 64}
    if args.engine == "fake":
        settings["engine"] = FAKE_ENGINE
    with tempfile.TemporaryDirectory(prefix="upload-big-", dir=args.dir) as scratch:
        with Server(Path(scratch) / "data", **settings) as server:
            pid = server.process.pid
            server.client.get("/readyz")
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            before = memory_kib(pid, "VmRSS") << 10
            stream = TarStream(files)
            started = time.perf_counter()
            response = server.client.post("/optimize", files={"model": ("llama.tar", stream)},
                                          data={"places": args.places, "options": args.options}, timeout=7200)
            upload_seconds = time.perf_counter() - started
            peak = memory_kib(pid, "VmHWM") << 10
            result = {"upload_bytes": stream.sent, "status": response.status_code,
                      "upload_seconds": round(upload_seconds, 1), "api_rss_before_mb": before >> 20,
                      "api_rss_peak_mb": peak >> 20, "growth_mb": round((peak - before) / (1 << 20), 1)}
            if response.status_code != 202:
                result["response"] = response.text[:500]
            elif args.engine == "real":
                job = server.wait_for(response.json()["id"], timeout=7200)
                result["job"] = {"status": job["status"], "error": job.get("error"),
                                 "verified": (job.get("summary") or {}).get("verified"),
                                 "seconds": round(time.perf_counter() - started - upload_seconds, 1)}
    print(f"{model} as a tar of {result['upload_bytes'] / 1e9:.2f} GB: upload {result['status']} in "
          f"{result['upload_seconds']} s, API RSS {result['api_rss_before_mb']} MB before, peak "
          f"{result['api_rss_peak_mb']} MB during the upload: growth {result['growth_mb']} MB (goal < 100 MB)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
