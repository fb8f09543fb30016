"""The pass trace as a Chrome trace-event file: every event checked against the Trace Event Format."""
from __future__ import annotations

import json

import pytest

from tests.conftest import CORPUS
from worker.engine.cli import main
from worker.engine.trace_events import MAX_DETAILS, chrome_trace

BERT = CORPUS / "bert_small_dyn.onnx"


def check_trace_event_format(document: dict) -> list[dict]:
    """The JSON Object Format of the Trace Event Format: ``traceEvents`` and valid events, nothing else assumed.

    Every event has ``name``, ``ph``, ``ts``, ``pid`` and ``tid`` of the right types; complete events ("X")
    have a non-negative ``dur``; instant events ("i") a scope; metadata ("M") names a process or a thread.
    """
    assert isinstance(document, dict) and isinstance(document["traceEvents"], list)
    assert document.get("displayTimeUnit", "ms") in ("ms", "ns")
    for event in document["traceEvents"]:
        assert isinstance(event["name"], str) and event["name"]
        assert event["ph"] in ("X", "i", "M"), event
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert isinstance(event.get("args", {}), dict)
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
            assert isinstance(event.get("cat", ""), str)
        elif event["ph"] == "i":
            assert event["s"] in ("g", "p", "t")
        else:
            assert event["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
    json.dumps(document, allow_nan=False)  # loadable by any JSON parser: no NaN or Infinity
    return document["traceEvents"]


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    code = main(["optimize", str(BERT), "-o", str(out / "bert.onnx"), "--input-shape", "input_ids=2,64",
                 "--input-shape", "attention_mask=2,64", "--report", str(out / "report.json"),
                 "--chrome-trace", str(out / "trace.json"), "--quiet"])
    assert code == 0
    return json.loads((out / "report.json").read_text()), json.loads((out / "trace.json").read_text())


@pytest.mark.models
def test_the_cli_writes_one_slice_per_pass_that_ran(bert_run):
    report, document = bert_run
    events = check_trace_event_format(document)
    ran = [e for e in report["trace"] if not e["skipped"]]
    slices = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
    assert [e["name"] for e in slices] == [e["pass"] for e in ran]
    assert [e["ts"] for e in slices] == [round(e["start"] * 1e6) for e in ran]
    skipped = [e for e in events if e["ph"] == "i"]
    assert len(skipped) == sum(1 for e in report["trace"] if e["skipped"])
    assert all(e["args"]["skipped"] for e in skipped)
    names = {(e["ph"], e["name"], e["args"].get("name")) for e in events if e["ph"] == "M"}
    assert ("M", "process_name", "mirserve optimize bert_small_dyn.onnx") in names


@pytest.mark.models
def test_slices_carry_their_rewrites_and_nest_inside_their_fixed_point_group(bert_run):
    report, document = bert_run
    slices = [e for e in document["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    rewritten = [e for e in slices if e["args"].get("rewrites")]
    assert rewritten and all(e["args"]["nodes_before"] >= e["args"]["nodes_after"] for e in rewritten
                             if e["cat"] == "program")
    entry = next(e for e in report["trace"] if e.get("details"))
    event = next(e for e in slices if e["name"] == entry["pass"] and e["args"].get("iteration") == entry.get("iteration"))
    assert event["args"]["details"] == entry["details"][:MAX_DETAILS]
    for group in (e for e in slices if e["cat"] == "fixed_point"):
        inside = [e for e in slices if "iteration" in e["args"] and e is not group
                  and group["ts"] <= e["ts"] < group["ts"] + group["dur"]]
        assert inside and all(e["ts"] + e["dur"] <= group["ts"] + group["dur"] + 1 for e in inside)
    ordered = [e for e in slices if e["cat"] != "fixed_point"]
    for earlier, later in zip(ordered, ordered[1:]):
        assert earlier["ts"] + earlier["dur"] <= later["ts"] + 1  # passes run one after another
    (verify,) = [e for e in document["traceEvents"] if e["name"] == "verification" and e["ph"] == "X"]
    assert verify["ts"] >= max(e["ts"] + e["dur"] for e in slices) and verify["args"]["passed"] is True


def test_a_report_without_start_times_is_laid_out_pass_after_pass():
    trace = [{"pass": "a", "kind": "stmt", "seconds": 0.5, "skipped": None},
             {"pass": "b", "kind": "program", "seconds": 0.25, "skipped": None, "iteration": 1, "details": []},
             {"pass": "c", "kind": "program", "seconds": 0.0, "skipped": "disabled", "iteration": 1},
             {"pass": "b", "kind": "program", "seconds": 0.25, "skipped": None, "iteration": 2, "details": []},
             {"pass": "simplify", "kind": "fixed_point", "seconds": 0.6, "skipped": None},
             {"pass": "d", "kind": "stmt", "seconds": 0.125, "skipped": None}]
    events = check_trace_event_format(chrome_trace({"trace": trace, "version": "x"}))
    timed = [(e["name"], e["ph"], e["ts"], e.get("dur")) for e in events if e["ph"] != "M"]
    assert timed == [("a", "X", 0, 500_000), ("b", "X", 500_000, 250_000), ("c", "i", 750_000, None),
                     ("b", "X", 750_000, 250_000), ("simplify", "X", 500_000, 600_000),
                     ("d", "X", 1_000_000, 125_000)]


def test_long_rewrite_lists_are_cut_and_counted():
    details = [{"rule": "r", "node": f"n{i}"} for i in range(MAX_DETAILS + 7)]
    trace = [{"pass": "fold", "kind": "program", "start": 0.0, "seconds": 1.0, "skipped": None,
              "rewrites": len(details), "details": details}]
    (event,) = [e for e in chrome_trace({"trace": trace})["traceEvents"] if e["ph"] == "X"]
    assert event["args"]["details"] == details[:MAX_DETAILS] and event["args"]["details_not_shown"] == 7
    assert event["args"]["rewrites"] == MAX_DETAILS + 7
