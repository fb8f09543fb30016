"""The independent plan checker must catch every kind of broken plan, or passing it would mean nothing."""
import copy

from tests.engine.memory.plan_checker import check_memory_report


def sound_report():
    values = [{"name": "a", "offset": 0, "size": 128, "first": 0, "last": 1},
              {"name": "b", "offset": 128, "size": 64, "first": 1, "last": 2},
              {"name": "c", "offset": 0, "size": 128, "first": 2, "last": 2}]
    arena = {"space": "host", "naive_bytes": 320, "lower_bound_bytes": 192, "arena_bytes": 192, "ratio": 1.0,
             "peak_step": 1, "peak_node": "n1", "timeline": [128, 192, 192], "values": values}
    return {"arenas": [arena]}


def broken(change):
    report = copy.deepcopy(sound_report())
    change(report["arenas"][0])
    return check_memory_report(report)


def test_a_sound_plan_passes():
    assert check_memory_report(sound_report()) == []


def test_values_sharing_bytes_while_both_live_are_caught():
    problems = broken(lambda arena: arena["values"][2].update(first=1))
    assert any("c and a share bytes" in p or "a and c share bytes" in p for p in problems)


def test_a_value_outside_the_arena_is_caught():
    problems = broken(lambda arena: arena["values"][1].update(offset=160))
    assert any("does not fit the 192-byte arena" in p for p in problems)


def test_a_misaligned_value_is_caught():
    assert any("aligned" in p for p in broken(lambda arena: arena["values"][1].update(offset=100)))


def test_a_wrong_timeline_or_lower_bound_is_caught():
    assert broken(lambda arena: arena.update(timeline=[128, 192, 128]))
    assert broken(lambda arena: arena.update(lower_bound_bytes=128))
    assert broken(lambda arena: arena.update(peak_step=0))
    assert broken(lambda arena: arena.update(ratio=1.5))


def test_two_arenas_for_one_space_are_caught():
    report = sound_report()
    report["arenas"].append(copy.deepcopy(report["arenas"][0]))
    assert any("more than one arena" in p for p in check_memory_report(report))
