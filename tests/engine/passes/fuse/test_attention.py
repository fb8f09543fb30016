"""attention_fuse: scaled dot-product attention chains (scaled by Mul or Div or not at all, with zero, one or
two additive masks, grouped-query with repeat_kv) become Attention at opset 23+, checked against the chain on
onnxruntime; each refusal is a sentence."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

from tests.engine.passes.fuse.harness import optimize

PASS = "attention_fuse"
# fuse_consecutive_transposes and eliminate_nop_transpose cancel the key transpose the op needs against kT's.
CLEANUP = ["fuse_consecutive_transposes", "eliminate_nop_transpose"]
B, H, KV, S, D = 2, 4, 2, 5, 8


def attention_model(*, scale="mul", masks=1, opset=23, c=0.35355, gqa=False, softmax_axis=-1, k_perm="0, 1, 3, 2",
                    symbolic=False):
    """q (B, H, S, D), k (B, H|KV, S, D) (or (B, S, H, D) for k_perm "0, 2, 3, 1"), v, mask (B, 1, S, S);
    ``symbolic``: batch and sequence are the dims "batch" and "seq"."""
    B, S = ("batch", "seq") if symbolic else (globals()["B"], globals()["S"])
    heads = KV if gqa else H
    k_shape = f"{B}, {S}, {heads}, {D}" if k_perm == "0, 2, 3, 1" else f"{B}, {heads}, {S}, {D}"
    inputs = [f"float[{B}, {H}, {S}, {D}] q", f"float[{k_shape}] k", f"float[{B}, {heads}, {S}, {D}] v"]
    inputs += [f"float[{B}, 1, {S}, {S}] m{i}" for i in range(masks)]
    lines = []
    key, value = "k", "v"
    if gqa:
        for name in ("k", "v"):
            lines += [f"{name}u = Unsqueeze ({name}, two)", f"{name}e = Expand ({name}u, eshape)",
                      f"{name}r = Reshape ({name}e, rshape)"]
        key, value = "kr", "vr"
    lines += [f"kt = Transpose <perm = [{k_perm}]> ({key})", "s = MatMul (q, kt)"]
    last = "s"
    if scale != "none":
        lines.append(f"sc = {'Mul' if scale == 'mul' else 'Div'} ({last}, c)")
        last = "sc"
    for i in range(masks):
        lines.append(f"a{i} = Add (m{i}, {last})")
        last = f"a{i}"
    lines += [f"p = Softmax <axis = {softmax_axis}> ({last})", f"y = MatMul (p, {value})"]
    text = (f'<ir_version: 10, opset_import: ["" : {opset}]> g ({", ".join(inputs)}) => (float[{B}, {H}, {S}, {D}] y)'
            " {\n" + "\n".join(lines) + "\n}")
    model = parser.parse_model(text)
    inits = {"c": np.array(c, np.float32)}
    if gqa and symbolic:  # the shapes a dynamic-axes export writes
        inits.update({"two": np.array([2], np.int64), "eshape": np.array([1, 1, H // KV, 1, 1], np.int64),
                      "rshape": np.array([0, H, -1, D], np.int64)})
    elif gqa:
        inits.update({"two": np.array([2], np.int64), "eshape": np.array([B, KV, H // KV, S, D], np.int64),
                      "rshape": np.array([B, H, S, D], np.int64)})
    used = {name for node in model.graph.node for name in node.input}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items() if k in used)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("masks", [0, 1, 2])
@pytest.mark.parametrize("scale", ["mul", "div", "none"])
def test_chain_becomes_attention(tmp_path, scale, masks):
    out = optimize(tmp_path, attention_model(scale=scale, masks=masks), [PASS, *CLEANUP])
    assert sorted(out.ops) == sorted(["Attention"] + ["Add"] * (masks == 2))
    expected = {"mul": 0.35355, "div": 1 / 0.35355, "none": 1.0}[scale]
    node = out.node("Attention")
    assert node.attr("scale") == pytest.approx(expected, rel=1e-6)
    assert node.input(1).name == "k" and len(node.inputs) == 3 + (masks > 0)


def test_transposed_keys_of_another_layout_keep_one_transpose(tmp_path):
    """BERT's keys: Transpose(0, 2, 3, 1) of (B, S, H, D) -> the op reads Transpose(0, 2, 1, 3) of it."""
    out = optimize(tmp_path, attention_model(k_perm="0, 2, 3, 1"), [PASS, *CLEANUP])
    assert sorted(out.ops) == ["Attention", "Transpose"]
    assert out.node("Transpose").attr("perm") == [0, 2, 1, 3]


def test_grouped_query_attention_drops_repeat_kv(tmp_path):
    out = optimize(tmp_path, attention_model(gqa=True), [PASS, *CLEANUP, PASS])
    assert out.ops == ["Attention"]
    node = out.node("Attention")
    assert [v.name for v in node.inputs[:3]] == ["q", "k", "v"]


def test_opset_22_is_refused_pointing_at_target_opset(tmp_path):
    out = optimize(tmp_path, attention_model(opset=22), [PASS])
    assert "Attention" not in out.ops
    assert out.refused("Attention needs opset 23, and the model imports opset 22 (raise it with --target-opset 23)")


def test_raised_by_target_opset(tmp_path):
    out = optimize(tmp_path, attention_model(opset=18), [PASS, *CLEANUP], target_opset=23)
    assert out.ops == ["Attention"]


def test_softmax_over_queries_is_refused(tmp_path):
    out = optimize(tmp_path, attention_model(softmax_axis=2), [PASS])
    assert "Attention" not in out.ops
    assert out.refused("does not normalize over the keys (axis 2)")


def test_a_zero_scale_is_refused(tmp_path):
    out = optimize(tmp_path, attention_model(scale="div", c=0.0), [PASS], check=False)
    assert "Attention" not in out.ops
    assert out.refused("the scale 'c' of Div")


def test_no_kernel_in_any_valid_place_is_refused(tmp_path):
    out = optimize(tmp_path, attention_model(), [PASS], places="npu/fp32/nchw", host_fallback=False)
    assert "Attention" not in out.ops
    assert out.refused("no valid place (npu) has a Attention kernel at opset 23")


def test_symbolic_batch_and_sequence(tmp_path):
    out = optimize(tmp_path, attention_model(symbolic=True), [PASS, *CLEANUP])
    assert out.ops == ["Attention"]


def test_half_precision_softmax_in_float_sets_softmax_precision(tmp_path):
    """fp16 scores cast to float for the Softmax and back (make_llama's form): softmax_precision=1."""
    text = (f'<ir_version: 10, opset_import: ["" : 23]> g (float16[{B}, {H}, {S}, {D}] q, float16[{B}, {H}, {D}, {S}] kt, '
            f'float16[{B}, {H}, {S}, {D}] v) => (float16[{B}, {H}, {S}, {D}] y) {{\n'
            "s = MatMul (q, kt)\nu = Cast <to = 1> (s)\np = Softmax <axis = -1> (u)\nd = Cast <to = 10> (p)\n"
            "y = MatMul (d, v)\n}")
    out = optimize(tmp_path, parser.parse_model(text), [PASS], check=False)
    assert sorted(out.ops) == ["Attention", "Transpose"]
    assert out.node("Attention").attr("softmax_precision") == 1 and out.node("Attention").attr("scale") == 1.0


def test_casts_that_do_not_go_back_are_refused(tmp_path):
    text = (f'<ir_version: 10, opset_import: ["" : 23]> g (float16[{B}, {H}, {S}, {D}] q, float16[{B}, {H}, {D}, {S}] kt, '
            f'float[{B}, {H}, {S}, {D}] v) => (float[{B}, {H}, {S}, {D}] y) {{\n'
            "s = MatMul (q, kt)\nu = Cast <to = 1> (s)\np = Softmax <axis = -1> (u)\nd = Cast <to = 1> (p)\n"
            "y = MatMul (d, v)\n}")
    out = optimize(tmp_path, parser.parse_model(text), [PASS], check=False)
    assert "Attention" not in out.ops and out.refused("to float and back")


def test_grouped_query_attention_with_symbolic_batch_and_sequence(tmp_path):
    out = optimize(tmp_path, attention_model(gqa=True, symbolic=True), [PASS, *CLEANUP, PASS])
    assert out.ops == ["Attention"]
    assert [v.name for v in out.node("Attention").inputs[:3]] == ["q", "k", "v"]


def heads_model(*, q_shape=(0, 0, H, D), allowzero=0, out_shape=(0, 0, -1), out_type=None):
    """q3, k3, v3 (B, S, H*D | KV*D) split into heads, Attention, heads joined back (BERT's layout)."""
    text = (f'<ir_version: 10, opset_import: ["" : 23]> g (float[{B}, {S}, {H * D}] q3, float[{B}, {S}, {KV * D}] k3, '
            f'float[{B}, {S}, {KV * D}] v3, float[{B}, 1, {S}, {S}] m) => (float[{out_type or f"{B}, {S}, {H * D}"}] y) {{\n'
            f"qr = Reshape <allowzero = {allowzero}> (q3, qs)\nq = Transpose <perm = [0, 2, 1, 3]> (qr)\n"
            "kr = Reshape (k3, ks)\nk = Transpose <perm = [0, 2, 1, 3]> (kr)\n"
            "vr = Reshape (v3, ks)\nv = Transpose <perm = [0, 2, 1, 3]> (vr)\n"
            "a = Attention <scale = 0.3> (q, k, v, m)\nt = Transpose <perm = [0, 2, 1, 3]> (a)\ny = Reshape (t, ys)\n}")
    model = parser.parse_model(text)
    inits = {"qs": np.array(q_shape, np.int64), "ks": np.array([0, 0, KV, D], np.int64),
             "ys": np.array(out_shape, np.int64)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("q_shape", [(0, 0, H, D), (B, S, -1, D), (B, -1, H, D)])
def test_heads_split_from_hidden_go_into_the_op(tmp_path, q_shape):
    out = optimize(tmp_path, heads_model(q_shape=q_shape), [PASS])
    assert out.ops == ["Attention"]
    node = out.node("Attention")
    assert (node.attr("q_num_heads"), node.attr("kv_num_heads"), node.attr("scale")) == (H, KV, pytest.approx(0.3))
    assert [v.name for v in node.inputs] == ["q3", "k3", "v3", "m"]



def test_heads_joined_into_another_shape_keep_one_reshape(tmp_path):
    """GPT-2 joins the heads straight into (batch * seq, hidden) for its Gemm: the op's 3-D output reshaped."""
    model = heads_model(out_shape=(B * S, H * D), out_type=f"{B * S}, {H * D}")
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == ["Attention", "Reshape"]
    assert out.node("Attention").attr("q_num_heads") == H
