"""The Paddle-Lite-style comparison figure: name-order clustering, sizes ignored."""
import random

from worker.engine.memory import Buffer, paddle_lite_clusters, paddle_lite_style_bytes, plan_arena


def clusters_as_paddle_lite_builds_them(buffers):
    """Straight from the description: open a cluster at the first unclustered name, then sweep the rest."""
    nodes = sorted(buffers, key=lambda b: b.id)
    cluster_of = {}
    clusters = []
    for i, seed in enumerate(nodes):
        if seed.id in cluster_of:
            continue
        members = [seed]
        cluster_of[seed.id] = len(clusters)
        for other in nodes[i + 1:]:
            if other.id not in cluster_of and not any(other.overlaps_in_time(m) for m in members):
                members.append(other)
                cluster_of[other.id] = len(clusters)
        clusters.append([m.id for m in members])
    return clusters


def test_clusters_match_the_cluster_by_cluster_construction():
    rng = random.Random(3)
    for _ in range(200):
        buffers = []
        for index in range(rng.randint(1, 30)):
            first = rng.randrange(12)
            buffers.append(Buffer(f"t{rng.randrange(1000):03d}_{index}", 64 * rng.randint(1, 8), first,
                                  first + rng.randrange(4)))
        assert paddle_lite_clusters(buffers) == clusters_as_paddle_lite_builds_them(buffers)


def test_name_order_can_pair_a_small_buffer_with_a_large_one():
    # "a" (small) and "b" (large) never overlap, so they share a cluster that must be as large as "b"; "c"
    # (large) overlaps "a" and opens a second large cluster: 2 x 4096 where 4096 + 64 suffices.
    buffers = [Buffer("a", 64, 0, 0), Buffer("b", 4096, 1, 1), Buffer("c", 4096, 0, 0)]
    assert paddle_lite_clusters(buffers) == [["a", "b"], ["c"]]
    assert paddle_lite_style_bytes(buffers) == 8192
    plan = plan_arena("host", buffers)
    assert (plan.arena_bytes, plan.lower_bound_bytes, plan.paddle_lite_style_bytes) == (4160, 4160, 8192)


def test_buffers_that_never_overlap_share_one_cluster():
    buffers = [Buffer(f"v{i}", 64 * (i + 1), i, i) for i in range(5)]
    assert paddle_lite_clusters(buffers) == [["v0", "v1", "v2", "v3", "v4"]]
    assert paddle_lite_style_bytes(buffers) == 320
