"""``python -m tests.service.start_engine DIR warm|cold``: start one engine process from a process whose
``__main__`` is a module (as ``python -m app.cli worker`` is), and print the report it wrote."""
import sys
from pathlib import Path

from worker.jobs.engine_process import ChildSpec, EngineProcess, prepare

ENGINE = "tests.service.engines:main_module"

if __name__ == "__main__":
    work, warm = Path(sys.argv[1]), sys.argv[2] == "warm"
    prepare(ENGINE, warm=warm)
    (work / "attempt").mkdir()
    (work / "model.onnx").write_bytes(b"model")
    process = EngineProcess(ChildSpec(engine=ENGINE, model=str(work / "model.onnx"), attempt_dir=str(work / "attempt"),
                                      options={"passes": 1}, memory_bytes=0, nice=0, data_dir=str(work / "data")),
                            warm=warm)
    process.wait(60)
    print((work / "attempt" / "report.json").read_text())
