"""Every cleanup pass is registered as a level-1 program pass, listed with its place in the default pipeline."""
from worker.api import list_passes
from worker.passes.pipelines import CLEANUP


def test_cleanup_passes_are_listed_in_pipeline_order():
    listed = {p["name"]: p for p in list_passes()}
    positions = [listed[name]["position"] for name in CLEANUP]
    assert all(isinstance(p, int) for p in positions) and positions == sorted(positions)
    for name in CLEANUP:
        info = listed[name]
        assert (info["kind"], info["level"], info["portable"]) == ("program", 1, True), name
        assert info["description"] and "\n" not in info["description"]
    assert len(set(CLEANUP)) == len(CLEANUP) == 29
