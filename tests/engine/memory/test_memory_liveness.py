"""Live intervals and in-place aliasing on hand-written execution orders (one rule per test)."""
import math

import pytest

from worker.engine.memory import Step, ValueFacts, analyze

FLOAT, INT64 = 1, 7


def fact(name, shape, dtype=FLOAT, space="host", role=None):
    itemsize = 8 if dtype == INT64 else 4
    return ValueFacts(name, math.prod(shape) * itemsize, dtype, tuple(shape), space, role)


def facts_of(*facts):
    return {f.name: f for f in facts}


def intervals_by_id(liveness):
    return {i.id: (i.values, i.first, i.last) for i in liveness.intervals}


def refusals(liveness):
    return [(d.node, d.input, d.reason) for d in liveness.decisions if not d.accepted]


def test_each_value_lives_from_its_producer_to_its_last_reader():
    steps = [Step("n0", "Conv", ("x", "w"), ("a",)), Step("n1", "MaxPool", ("a",), ("b",)),
             Step("n2", "Concat", ("a", "b"), ("c",)), Step("n3", "Softmax", ("c",), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("w", [8], role="initializer"), fact("a", [8]),
                     fact("b", [8]), fact("c", [16]), fact("y", [16], role="graph output"))
    liveness = analyze(steps, facts)
    assert intervals_by_id(liveness) == {"a": (("a",), 0, 2), "b": (("b",), 1, 2), "c": (("c",), 2, 3)}
    assert liveness.steps == 4


def test_an_output_nobody_reads_still_needs_memory_at_its_step():
    steps = [Step("n0", "Split", ("x",), ("a", "unused")), Step("n1", "Relu", ("a",), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [4]), fact("unused", [4]),
                     fact("y", [4], role="graph output"))
    assert intervals_by_id(analyze(steps, facts))["unused"] == (("unused",), 0, 0)


@pytest.mark.parametrize("op", ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"])
def test_a_view_shares_its_input_buffer_and_extends_its_life(op):
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", op, ("a", "shape"), ("v",)),
             Step("n2", "Relu", ("x",), ("r",)), Step("n3", "Add", ("v", "r"), ("y",))]
    facts = facts_of(fact("x", [2, 8], role="graph input"), fact("a", [2, 8]), fact("v", [16]),
                     fact("r", [2, 8]), fact("y", [16], role="graph output"))
    assert intervals_by_id(analyze(steps, facts))["a"] == (("a", "v"), 0, 3)


def test_dropout_mask_gets_a_buffer_of_its_own():
    steps = [Step("n0", "Relu", ("x",), ("a",)), Step("n1", "Dropout", ("a",), ("d", "mask")),
             Step("n2", "Mul", ("d", "z"), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [8]), fact("d", [8]),
                     fact("mask", [8], dtype=9), fact("z", [8], role="graph input"),
                     fact("y", [8], role="graph output"))
    assert intervals_by_id(analyze(steps, facts)) == {"a": (("a", "d"), 0, 2), "mask": (("mask",), 1, 1)}


def test_a_view_of_a_graph_input_or_weight_is_not_planned():
    steps = [Step("n0", "Reshape", ("x", "s"), ("v",)), Step("n1", "Flatten", ("w",), ("f",)),
             Step("n2", "MatMul", ("v", "f"), ("y",))]
    facts = facts_of(fact("x", [4, 4], role="graph input"), fact("w", [4, 4], role="initializer"),
                     fact("v", [16]), fact("f", [16]), fact("y", [4, 4], role="graph output"))
    liveness = analyze(steps, facts)
    assert liveness.intervals == ()
    assert ("x", "v") in liveness.external and ("w", "f") in liveness.external


def test_a_buffer_that_becomes_a_graph_output_through_a_view_is_not_planned():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "Reshape", ("a", "s"), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [8]), fact("y", [8], role="graph output"))
    liveness = analyze(steps, facts)
    assert liveness.intervals == () and ("a", "y") in liveness.external


def test_an_elementwise_op_writes_over_its_input_at_its_last_use():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "Relu", ("a",), ("b",)),
             Step("n2", "Add", ("b", "bias"), ("c",)), Step("n3", "Softmax", ("c",), ("y",))]
    facts = facts_of(fact("x", [1, 8], role="graph input"), fact("a", [1, 8]), fact("b", [1, 8]),
                     fact("bias", [8], role="initializer"), fact("c", [1, 8]),
                     fact("y", [1, 8], role="graph output"))
    liveness = analyze(steps, facts)
    # The bias is broadcast, but it is the other operand: b itself has the output's shape.
    assert intervals_by_id(liveness) == {"a": (("a", "b", "c"), 0, 3)}
    assert [d.accepted for d in liveness.decisions] == [True, True]


def test_fused_elementwise_ops_of_the_mirserve_domain_write_in_place_too():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "FusedAddRelu", ("a", "b"), ("c",), "mirserve"),
             Step("n2", "FusedMatMulRelu", ("c", "w"), ("d",), "mirserve"), Step("n3", "Softmax", ("d",), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("b", [8], role="graph input"),
                     fact("w", [8, 8], role="initializer"), fact("a", [8]), fact("c", [8]), fact("d", [8]),
                     fact("y", [8], role="graph output"))
    assert intervals_by_id(analyze(steps, facts)) == {"a": (("a", "c"), 0, 2), "d": (("d",), 2, 3)}


def test_in_place_is_refused_when_the_output_is_a_graph_output():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "Relu", ("a",), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [8]), fact("y", [8], role="graph output"))
    liveness = analyze(steps, facts)
    assert intervals_by_id(liveness) == {"a": (("a",), 0, 1)}
    assert refusals(liveness) == [("n1", "a", "the output 'y' is a graph output")]


@pytest.mark.parametrize("role", ["graph input", "initializer"])
def test_in_place_is_refused_over_a_graph_input_or_initializer(role):
    steps = [Step("n0", "Sigmoid", ("x",), ("a",)), Step("n1", "Softmax", ("a",), ("y",))]
    facts = facts_of(fact("x", [8], role=role), fact("a", [8]), fact("y", [8], role="graph output"))
    liveness = analyze(steps, facts)
    assert intervals_by_id(liveness) == {"a": (("a",), 0, 1)}
    assert refusals(liveness) == [("n0", "x", f"the input 'x' is a {role}")]


def test_in_place_is_refused_over_a_broadcast_input():
    steps = [Step("n0", "Relu", ("x",), ("a",)), Step("n1", "Relu", ("z",), ("b",)),
             Step("n2", "Add", ("a", "b"), ("c",)), Step("n3", "Softmax", ("c",), ("y",))]
    facts = facts_of(fact("x", [3, 1], role="graph input"), fact("z", [1, 3], role="graph input"),
                     fact("a", [3, 1]), fact("b", [1, 3]), fact("c", [3, 3]),
                     fact("y", [3, 3], role="graph output"))
    liveness = analyze(steps, facts)
    assert intervals_by_id(liveness)["c"] == (("c",), 2, 3)
    assert refusals(liveness)[-2:] == [
        ("n2", "a", "the input 'a' of shape [3, 1] is broadcast to [3, 3]"),
        ("n2", "b", "the input 'b' of shape [1, 3] is broadcast to [3, 3]")]


def test_in_place_is_refused_when_the_input_is_read_later():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "Relu", ("a",), ("b",)),
             Step("n2", "Add", ("a", "b"), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [8]), fact("b", [8]),
                     fact("y", [8], role="graph output"))
    liveness = analyze(steps, facts)
    assert intervals_by_id(liveness) == {"a": (("a",), 0, 2), "b": (("b",), 1, 2)}
    assert ("n1", "a", "the input 'a' is read again at step 2 (node 'n2')") in refusals(liveness)


def test_in_place_is_refused_when_a_view_of_the_input_is_read_later():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "Reshape", ("a", "s"), ("v",)),
             Step("n2", "Relu", ("a",), ("b",)), Step("n3", "Concat", ("v", "b"), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [8]), fact("v", [2, 4]), fact("b", [8]),
                     fact("y", [16], role="graph output"))
    liveness = analyze(steps, facts)
    assert intervals_by_id(liveness) == {"a": (("a", "v"), 0, 3), "b": (("b",), 2, 3)}
    assert refusals(liveness) == [("n2", "a", "the input 'a' is read again at step 3 (node 'n3')")]


def test_in_place_is_refused_across_element_types():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "Where", ("cond", "a", "z"), ("b",)),
             Step("n2", "Softmax", ("b",), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("cond", [8], dtype=9, role="graph input"),
                     fact("z", [8], dtype=11, role="graph input"), fact("a", [8]), fact("b", [8], dtype=11),
                     fact("y", [8], role="graph output"))
    liveness = analyze(steps, facts)
    assert ("n1", "a", "the input 'a' has element type 1, the output 11") in refusals(liveness)
    assert intervals_by_id(liveness)["b"] == (("b",), 1, 2)


def test_io_copy_inside_one_memory_space_is_a_view():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "io_copy", ("a",), ("a_arm",), "mirserve"),
             Step("n2", "Relu", ("a_arm",), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [8]), fact("a_arm", [8]),
                     fact("y", [8], role="graph output"))
    assert intervals_by_id(analyze(steps, facts)) == {"a": (("a", "a_arm"), 0, 2)}


def test_a_value_crossing_memory_spaces_lives_in_both_at_its_io_copy():
    steps = [Step("n0", "Conv", ("x",), ("a",)), Step("n1", "io_copy", ("a",), ("a_gpu",), "mirserve"),
             Step("n2", "Relu", ("a_gpu",), ("b_gpu",)), Step("n3", "io_copy", ("b_gpu",), ("y",), "mirserve")]
    facts = facts_of(fact("x", [8], role="graph input"), fact("a", [8]), fact("a_gpu", [8], space="cuda"),
                     fact("b_gpu", [8], space="cuda"), fact("y", [8], role="graph output"))
    liveness = analyze(steps, facts)
    spans = {i.id: (i.space, i.first, i.last) for i in liveness.intervals}
    assert spans == {"a": ("host", 0, 1), "a_gpu": ("cuda", 1, 3)}
    assert liveness.buffer_of["b_gpu"] == "a_gpu"


def test_subgraph_reads_keep_outer_values_alive_and_bodies_are_charged_at_the_parent():
    steps = [Step("n0", "Relu", ("x",), ("a",)), Step("n1", "Sigmoid", ("x",), ("b",)),
             Step("n2", "If", ("cond",), ("y",), implicit_inputs=("a",), scratch={"host": 4096})]
    facts = facts_of(fact("x", [8], role="graph input"), fact("cond", [1], dtype=9, role="graph input"),
                     fact("a", [8]), fact("b", [8]), fact("y", [8], role="graph output"))
    spans = {i.id: (i.values, i.first, i.last, i.nbytes) for i in analyze(steps, facts).intervals}
    assert spans == {"a": (("a",), 0, 2, 32), "b": (("b",), 1, 1, 32), "n2:scratch:host": ((), 2, 2, 4096)}


def test_unknown_sizes_reach_the_interval_and_cannot_become_buffers():
    steps = [Step("n0", "NonZero", ("x",), ("idx",)), Step("n1", "Transpose", ("idx",), ("y",))]
    facts = facts_of(fact("x", [8], role="graph input"), ValueFacts("idx", None, INT64, (1, None)),
                     fact("y", [1], role="graph output"))
    (interval,) = analyze(steps, facts).intervals
    assert interval.nbytes is None
    with pytest.raises(ValueError, match="no known size"):
        interval.to_buffer()
