"""rotary_embedding_fuse: the rotate-half rotary embedding (full and partial) becomes RotaryEmbedding at opset
23+, checked against the chain on onnxruntime; each refusal is a sentence."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

from tests.engine.passes.fuse.harness import optimize

PASS = "rotary_embedding_fuse"
B, H, S, D = 2, 4, 5, 8


def factors(rot=D, repeat=True, per_head=False, seed=0):
    """cos, sin of shape (1, 1, S, rot) (``per_head``: (1, H, S, rot), different per head)."""
    angles = np.random.default_rng(seed).uniform(0, 6, (H if per_head else 1, S, rot // 2)).astype(np.float32)
    if repeat:
        angles = np.concatenate([angles, angles], -1)
    else:
        angles = np.concatenate([angles, angles[..., ::-1] + 0.5], -1)
    return np.cos(angles)[None], np.sin(angles)[None]


def rotary_model(*, rot=D, opset=23, cos=None, sin=None, halves=None, concat_axis=-1, neg_first=True):
    """x (B, H, S, D) -> x * cos + rotate_half(x) * sin, on the first ``rot`` head dims (the rest passes)."""
    half = rot // 2
    halves = halves or [half, rot - half]
    swapped = "Concat <axis = %d> (nb, a)" % concat_axis if neg_first else "Concat <axis = %d> (a, nb)" % concat_axis
    if rot == D:
        body = f"""
            a, b = Split <axis = -1> (x, halves)
            nb = Neg (b)
            c = {swapped}
            xc = Mul (x, cos)
            cs = Mul (c, sin)
            y = Add (xc, cs)"""
    else:
        body = f"""
            r, rest = Split <axis = 3> (x, outer)
            a, b = Split <axis = -1> (r, halves)
            nb = Neg (b)
            c = {swapped}
            xc = Mul (cos, r)
            cs = Mul (sin, c)
            e = Add (cs, xc)
            y = Concat <axis = -1> (e, rest)"""
    model = parser.parse_model(f'<ir_version: 10, opset_import: ["" : {opset}]> '
                               f'g (float[{B}, {H}, {S}, {D}] x) => (float[{B}, {H}, {S}, {D}] y) {{{body}\n}}')
    default_cos, default_sin = factors(rot)
    inits = {"halves": np.array(halves, np.int64), "outer": np.array([rot, D - rot], np.int64),
             "cos": default_cos if cos is None else cos, "sin": default_sin if sin is None else sin}
    used = {name for node in model.graph.node for name in node.input}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items() if k in used)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_rotate_half_becomes_rotary_embedding(tmp_path):
    out = optimize(tmp_path, rotary_model(), [PASS])
    assert out.ops == ["RotaryEmbedding"]
    node = out.node("RotaryEmbedding")
    cos, sin = factors()
    np.testing.assert_array_equal(node.input(1).constant_value(), np.broadcast_to(cos[0, :, :, :D // 2], (B, S, D // 2)))
    np.testing.assert_array_equal(node.input(2).constant_value(), np.broadcast_to(sin[0, :, :, :D // 2], (B, S, D // 2)))
    assert not node.attr("rotary_embedding_dim")


def test_partial_rotary_sets_the_rotary_dim(tmp_path):
    out = optimize(tmp_path, rotary_model(rot=4), [PASS])
    assert out.ops == ["RotaryEmbedding"] and out.node("RotaryEmbedding").attr("rotary_embedding_dim") == 4


def test_cos_of_rank_two_broadcasts(tmp_path):
    cos, sin = factors()
    assert optimize(tmp_path, rotary_model(cos=cos[0, 0], sin=sin[0, 0]), [PASS]).ops == ["RotaryEmbedding"]


def test_opset_22_is_refused_pointing_at_target_opset(tmp_path):
    out = optimize(tmp_path, rotary_model(opset=22), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("RotaryEmbedding needs opset 23, and the model imports opset 22 (raise it with "
                       "--target-opset 23)")


def test_raised_by_target_opset(tmp_path):
    assert optimize(tmp_path, rotary_model(opset=18), [PASS], target_opset=23).ops == ["RotaryEmbedding"]


def test_halves_that_differ_are_refused(tmp_path):
    """cos whose second half is not its first: not one frequency per pair, the chain stays."""
    cos, sin = factors(repeat=False)
    out = optimize(tmp_path, rotary_model(cos=cos, sin=sin), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("the cos factor 'cos' does not broadcast to [2, 4, 5, 8] the same for every head with its "
                       "first half repeated in its second")


def test_factors_per_head_are_refused(tmp_path):
    cos, sin = factors(per_head=True)
    out = optimize(tmp_path, rotary_model(cos=cos, sin=sin), [PASS])
    assert "RotaryEmbedding" not in out.ops and out.refused("the cos factor 'cos' does not broadcast")


def test_uneven_split_is_refused(tmp_path):
    out = optimize(tmp_path, rotary_model(halves=[3, 5]), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("does not cut the rotated head dims of 'x' in two halves")


def test_swapped_halves_without_negation_first_do_not_match(tmp_path):
    """Concat(a, -b) is a rotation the other way: no match, nothing changes."""
    out = optimize(tmp_path, rotary_model(neg_first=False), [PASS])
    assert "RotaryEmbedding" not in out.ops


def test_no_kernel_in_any_valid_place_is_refused(tmp_path):
    out = optimize(tmp_path, rotary_model(), [PASS], places="npu/fp32/nchw", host_fallback=False)
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("no valid place (npu) has a RotaryEmbedding kernel at opset 23")


def interleaved_model(*, cos=None, sin=None, odd_start=1):
    """x (B, H, S, D) -> x * cos + rotate_every_two(x) * sin (GPT-J), cos repeating each value twice."""
    body = f"""
        a = Slice (x, zero, big, last, two)
        b = Slice (x, start_odd, big, last, two)
        nb = Neg (b)
        un = Unsqueeze (nb, last)
        ua = Unsqueeze (a, last)
        c = Concat <axis = -1> (un, ua)
        r = Reshape (c, shape)
        xc = Mul (x, cos)
        rs = Mul (r, sin)
        y = Add (xc, rs)"""
    model = parser.parse_model(f'<ir_version: 10, opset_import: ["" : 23]> '
                               f'g (float[{B}, {H}, {S}, {D}] x) => (float[{B}, {H}, {S}, {D}] y) {{{body}\n}}')
    angles = np.random.default_rng(1).uniform(0, 6, (1, 1, S, D // 2)).astype(np.float32).repeat(2, axis=-1)
    inits = {"zero": np.array([0], np.int64), "start_odd": np.array([odd_start], np.int64),
             "big": np.array([1 << 30], np.int64), "last": np.array([-1], np.int64), "two": np.array([2], np.int64),
             "shape": np.array([B, H, S, D], np.int64),
             "cos": np.cos(angles) if cos is None else cos, "sin": np.sin(angles) if sin is None else sin}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def test_interleaved_form_becomes_rotary_embedding_interleaved(tmp_path):
    out = optimize(tmp_path, interleaved_model(), [PASS])
    assert out.ops == ["RotaryEmbedding"] and out.node("RotaryEmbedding").attr("interleaved") == 1


def test_interleaved_cos_not_repeated_in_pairs_is_refused(tmp_path):
    cos, sin = factors()  # halves repeated, not neighbours
    out = optimize(tmp_path, interleaved_model(cos=cos, sin=sin), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("with each value repeated in its odd neighbour")


def test_interleaved_slices_not_even_and_odd_are_refused(tmp_path):
    out = optimize(tmp_path, interleaved_model(odd_start=0), [PASS], check=False, valid=False)
    assert "RotaryEmbedding" not in out.ops and out.refused("do not take the even and odd head dims")
