"""A job's summary keeps MACs null, never 0, when the engine could not count them, and says why."""
from worker.engine.summary import build_summary
from worker.jobs.report import Report


def test_unknown_macs_reach_the_job_summary_as_null_with_the_reasons():
    memory = {"macs": {"total": None, "known_total": 5000, "nodes": [{"node": "c", "op": "Conv", "macs": 5000}],
                       "unknown": [{"node": "x", "op": "com.acme.Op",
                                    "reason": "com.acme.Op is neither a standard op nor defined by a function, "
                                              "so its MACs are unknown"}]}}
    report = {"memory": memory}
    report["summary"] = build_summary(report)
    summary = Report.model_validate(report).summary()
    assert summary["macs"] is None
    assert summary["macs_unknown"] == ["com.acme.Op is neither a standard op nor defined by a function, so its "
                                       "MACs are unknown (node x)"]
    known = {"memory": {"macs": {"total": 5000, "known_total": 5000, "nodes": [], "unknown": []}}}
    known["summary"] = build_summary(known)
    summary = Report.model_validate(known).summary()
    assert summary["macs"] == 5000 and summary["macs_unknown"] == []


def test_the_nodes_auto_mixed_precision_kept_in_fp32_reach_the_job_summary():
    report = {"precision_fallback": {"failure": "the optimized model does not compute what the input computed",
                                     "nodes": [{"node": "softmax", "op": "Softmax", "place": "arm/fp32/nchw",
                                                "why": "in fp16 its output leaves fp16's range (65504)"}],
                                     "runs": 4, "seconds": 2.5}}
    report["summary"] = build_summary(report)
    summary = Report.model_validate(report).summary()
    # a section without its precisions (written before int8 places were searched) was an fp16 one
    assert summary["precision_fallback"] == {"nodes": ["softmax"], "precisions": ["fp16"], "runs": 4,
                                             "seconds": 2.5}
    report["precision_fallback"]["precisions"] = ["int8"]
    report["summary"] = build_summary(report)
    assert Report.model_validate(report).summary()["precision_fallback"]["precisions"] == ["int8"]
    assert Report.model_validate({"summary": build_summary({})}).summary()["precision_fallback"] is None
