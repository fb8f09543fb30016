"""The offset planner: lower bound, best fit, orderings, determinism, and soundness checked independently."""
import random

import pytest

from tests.engine.memory.plan_checker import check_arena
from worker.engine.memory import Buffer, aligned, arena_report, live_profile, plan_arena, plan_spaces
from worker.engine.memory.planner import ORDERINGS, PADDLE_LITE_CLUSTERS, place_in_order


def random_buffers(rng: random.Random, count: int, steps: int = 10) -> list[Buffer]:
    buffers = []
    for index in range(count):
        first = rng.randrange(steps)
        buffers.append(Buffer(f"v{index:03d}", 64 * rng.choice([1, 2, 3, 4, 8, 16]), first,
                              min(steps - 1, first + rng.randrange(5))))
    return buffers


def test_aligned_rounds_up_to_64_bytes():
    assert [aligned(n) for n in (0, 1, 63, 64, 65, 4000)] == [0, 64, 64, 64, 128, 4032]
    with pytest.raises(ValueError):
        aligned(-1)


def test_lower_bound_is_the_largest_live_sum_and_its_first_step():
    buffers = [Buffer("a", 64, 0, 2), Buffer("b", 128, 1, 1), Buffer("c", 128, 2, 3), Buffer("d", 64, 4, 4)]
    profile = live_profile(buffers, steps=6)
    assert profile.timeline == (64, 192, 192, 128, 64, 0)
    assert (profile.lower_bound, profile.peak_step) == (192, 1)


def test_live_profile_rejects_a_buffer_past_the_last_step():
    with pytest.raises(ValueError, match="past the last step"):
        live_profile([Buffer("a", 64, 0, 5)], steps=3)


def test_best_fit_takes_the_smallest_gap_that_holds_the_buffer():
    # g1 and g2 die at step 0, leaving a 256-byte gap at 64 and a 64-byte gap at 384 while a, b, c live on:
    # x (64 bytes, steps 2-3) goes into the tight gap, not the first one.
    order = [Buffer("a", 64, 0, 5), Buffer("g1", 256, 0, 0), Buffer("b", 64, 0, 5), Buffer("g2", 64, 0, 0),
             Buffer("c", 64, 0, 5), Buffer("x", 64, 2, 3)]
    offsets, arena = place_in_order(order)
    assert offsets == [0, 64, 320, 384, 448, 384]
    assert arena == 512


def test_a_buffer_too_large_for_every_gap_goes_on_top():
    order = [Buffer("a", 64, 0, 5), Buffer("g", 64, 0, 0), Buffer("b", 64, 0, 5), Buffer("x", 128, 1, 1)]
    assert place_in_order(order) == ([0, 64, 128, 192], 320)


def test_a_buffer_reuses_the_bytes_of_one_that_died():
    buffers = [Buffer("a", 1024, 0, 1), Buffer("b", 1024, 2, 3), Buffer("c", 64, 1, 2)]
    plan = plan_arena("host", buffers)
    assert plan.arena_bytes == plan.lower_bound_bytes == 1088
    assert plan.offset_of("a") == plan.offset_of("b")


def test_another_ordering_is_kept_when_largest_first_misses_the_bound():
    # Found by search: largest-first needs 640 bytes here, longest-lived-first reaches the 576-byte bound.
    buffers = [Buffer("a", 64, 1, 2), Buffer("b", 64, 3, 4), Buffer("c", 192, 4, 7), Buffer("d", 128, 5, 6),
               Buffer("e", 256, 2, 5), Buffer("f", 256, 1, 3)]
    assert place_in_order(sorted(buffers, key=ORDERINGS["size"]))[1] == 640
    plan = plan_arena("host", buffers)
    assert (plan.arena_bytes, plan.lower_bound_bytes, plan.ordering) == (576, 576, "lifetime")
    assert check_arena(arena_report(plan)) == []


def test_the_plan_is_the_same_whatever_order_the_buffers_come_in():
    rng = random.Random(7)
    buffers = random_buffers(rng, 60, steps=30)
    first = plan_arena("host", buffers)
    for _ in range(5):
        rng.shuffle(buffers)
        assert plan_arena("host", buffers) == first


def test_random_plans_are_sound_never_below_the_bound_and_never_above_paddle_lite():
    rng = random.Random(11)
    for _ in range(300):
        plan = plan_arena("host", random_buffers(rng, rng.randint(1, 25)))
        assert check_arena(arena_report(plan)) == []
        assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.paddle_lite_style_bytes


def test_promoting_the_buffers_on_top_improves_on_every_ordering():
    # Found by search over random intervals: the three greedy orderings need 3904 bytes, the clustering 3840;
    # placing the buffers that reach the top first, and the rest again, needs 3584.
    spec = [(256, 5, 8), (512, 6, 10), (1024, 7, 11), (256, 5, 8), (256, 6, 9), (64, 8, 12), (512, 2, 2),
            (192, 8, 11), (1024, 4, 6), (64, 6, 10), (1024, 2, 5), (512, 4, 7)]
    buffers = [Buffer(f"v{i:02d}", size, first, last) for i, (size, first, last) in enumerate(spec)]
    assert min(place_in_order(sorted(buffers, key=key))[1] for key in ORDERINGS.values()) == 3904
    plan = plan_arena("host", buffers)
    assert (plan.arena_bytes, plan.paddle_lite_style_bytes, plan.ordering) == (3584, 3840, "size+promoted")
    assert check_arena(arena_report(plan)) == []


def test_two_phases_sharing_large_offsets_reach_the_bound():
    # The shape of cls_qdq's int8 tail: ping-pong pairs of large buffers in two phases, each phase with a small
    # long-lived buffer, the two small ones overlapping at the one step between the phases.
    big, small = 2560, 128
    buffers = [Buffer(f"p{i}", big, i, i + 1) for i in range(2, 8)] + [Buffer("a", small, 0, 10)]
    buffers += [Buffer(f"q{i}", big, i, i + 1) for i in range(12, 18)] + [Buffer("b", small, 10, 20)]
    assert min(place_in_order(sorted(buffers, key=key))[1] for key in ORDERINGS.values()) == 2 * big + 2 * small
    plan = plan_arena("host", buffers)
    assert plan.arena_bytes == plan.lower_bound_bytes == 2 * big + small
    assert check_arena(arena_report(plan)) == []


def test_the_clustering_layout_is_kept_when_it_beats_every_ordering():
    # Found by search over random intervals: greedy (every ordering, then promotion) needs more than the
    # clustering's 1536 bytes.
    spec = [(128, 5, 8), (512, 3, 6), (192, 0, 4), (256, 6, 10), (256, 1, 6), (256, 4, 7), (192, 1, 5),
            (64, 4, 7)]
    buffers = [Buffer(f"v{i:02d}", size, first, last) for i, (size, first, last) in enumerate(spec)]
    assert min(place_in_order(sorted(buffers, key=key))[1] for key in ORDERINGS.values()) > 1536
    plan = plan_arena("host", buffers)
    assert (plan.arena_bytes, plan.ordering) == (1536, PADDLE_LITE_CLUSTERS)
    assert check_arena(arena_report(plan)) == []


def test_zero_size_buffers_take_no_bytes():
    plan = plan_arena("host", [Buffer("empty", 0, 0, 3), Buffer("a", 64, 0, 3)])
    assert plan.arena_bytes == 64
    assert check_arena(arena_report(plan)) == []


def test_an_empty_arena_is_planned_at_zero():
    plan = plan_arena("host", [], steps=4)
    assert (plan.arena_bytes, plan.lower_bound_bytes, plan.ratio) == (0, 0, 1.0)
    assert plan.profile.timeline == (0, 0, 0, 0)


def test_duplicate_buffer_ids_are_refused():
    with pytest.raises(ValueError, match="appears twice"):
        plan_arena("host", [Buffer("a", 64, 0, 0), Buffer("a", 64, 1, 1)])


def test_each_space_gets_its_own_arena():
    buffers = [Buffer("h1", 128, 0, 1, "host"), Buffer("c1", 256, 1, 2, "cuda"), Buffer("h2", 64, 2, 2, "host")]
    plans = plan_spaces(buffers, steps=3)
    assert [(p.space, p.arena_bytes) for p in plans] == [("cuda", 256), ("host", 128)]
    assert plans[0].profile.timeline == (0, 256, 256)


def test_the_report_lists_every_buffer_with_its_offset_and_steps():
    plan = plan_arena("host", [Buffer("a", 64, 0, 1), Buffer("b", 128, 1, 2)], steps=3, naive_bytes=500)
    report = arena_report(plan, ["n0", "n1", "n2"])
    assert report["peak_node"] == "n1" and report["naive_bytes"] == 500
    assert sorted((v["name"], v["size"], v["first"], v["last"]) for v in report["values"]) == [
        ("a", 64, 0, 1), ("b", 128, 1, 2)]
