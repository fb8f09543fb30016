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
#: What a float mask given as an input gets in front of the op (lift_lowest_mask_fill: its lowest values one ulp up).
LIFT = ["Equal", "Where"]


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
    assert sorted(out.ops) == sorted(["Attention"] + ["Add"] * (masks == 2) + LIFT * (masks > 0))
    expected = {"mul": 0.35355, "div": 1 / 0.35355, "none": 1.0}[scale]
    node = out.node("Attention")
    assert node.attr("scale") == pytest.approx(expected, rel=1e-6)
    assert node.input(1).name == "k" and len(node.inputs) == 3 + (masks > 0)


def test_transposed_keys_of_another_layout_keep_one_transpose(tmp_path):
    """BERT's keys: Transpose(0, 2, 3, 1) of (B, S, H, D) -> the op reads Transpose(0, 2, 1, 3) of it."""
    out = optimize(tmp_path, attention_model(k_perm="0, 2, 3, 1"), [PASS, *CLEANUP])
    assert sorted(out.ops) == sorted(["Attention", "Transpose", *LIFT])
    assert out.node("Transpose").attr("perm") == [0, 2, 1, 3]


def test_grouped_query_attention_drops_repeat_kv(tmp_path):
    out = optimize(tmp_path, attention_model(gqa=True), [PASS, *CLEANUP, PASS])
    assert out.ops == [*LIFT, "Attention"]
    node = out.node("Attention")
    assert [v.name for v in node.inputs[:3]] == ["q", "k", "v"]


def test_opset_22_is_refused_pointing_at_target_opset(tmp_path):
    out = optimize(tmp_path, attention_model(opset=22), [PASS])
    assert "Attention" not in out.ops
    assert out.refused("Attention needs opset 23, and the model imports opset 22 (raise it with --target-opset 23)")


def test_raised_by_target_opset(tmp_path):
    out = optimize(tmp_path, attention_model(opset=18), [PASS, *CLEANUP], target_opset=23)
    assert out.ops == [*LIFT, "Attention"]


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
    assert out.ops == [*LIFT, "Attention"]


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
    assert out.ops == [*LIFT, "Attention"]
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
    assert out.ops == [*LIFT, "Attention"]
    node = out.node("Attention")
    assert (node.attr("q_num_heads"), node.attr("kv_num_heads"), node.attr("scale")) == (H, KV, pytest.approx(0.3))
    assert [v.name for v in node.inputs[:3]] == ["q3", "k3", "v3"] and node.inputs[3].producer.inputs[2].name == "m"



def test_heads_joined_into_another_shape_keep_one_reshape(tmp_path):
    """GPT-2 joins the heads straight into (batch * seq, hidden) for its Gemm: the op's 3-D output reshaped."""
    model = heads_model(out_shape=(B * S, H * D), out_type=f"{B * S}, {H * D}")
    out = optimize(tmp_path, model, [PASS])
    assert out.ops == [*LIFT, "Attention", "Reshape"]
    assert out.node("Attention").attr("q_num_heads") == H


def sdpa_model(*, mask: str = "bool", fill: float = -np.inf, past: int = 0, early_reader: bool = False,
               causal=None, guard: bool = True, opset: int = 23):
    """torch's scaled_dot_product_attention as the exporters decompose it: q and kT each times sqrt(scale), an
    additive Where(b, 0, fill) mask (``mask`` "bool"), or And(triangle, b) ("and"), or only a constant
    ``causal`` triangle ("const"); the weights NaN-guarded; with ``past`` cached positions Concat'ed in front
    of k and v, the Concats graph outputs (the present cache); ``early_reader``: an Identity of the present keys
    listed before the attention."""
    total = S + past
    inputs = [f"float[{B}, {H}, {S}, {D}] q", f"float[{B}, {H}, {S}, {D}] k", f"float[{B}, {H}, {S}, {D}] v"]
    outputs = [f"float[{B}, {H}, {S}, {D}] y"]
    lines, key, value = [], "k", "v"
    if past:
        inputs += [f"float[{B}, {H}, {past}, {D}] pk", f"float[{B}, {H}, {past}, {D}] pv"]
        present = f"{B}, {H}, {total}, {D}"
        outputs += [f"float[{present}] present_k", f"float[{present}] present_v"]
        lines += ["present_k = Concat <axis = 2> (pk, k)", "present_v = Concat <axis = -2> (pv, v)"]
        if early_reader:
            outputs.append(f"float[{present}] r")
            lines.append("r = Identity (present_k)")
        key, value = "present_k", "present_v"
    if mask != "const":
        inputs.append(f"bool[{B}, 1, {S}, {total}] b")
    boolean = {"bool": "b", "and": "both", "const": "tri"}[mask]
    if mask == "and":
        lines.append("both = And (tri, b)")
    lines += [f"kt = Transpose <perm = [0, 1, 3, 2]> ({key})", "qs = Mul (q, c)", "ks = Mul (kt, c)",
              "s = MatMul (qs, ks)", f"m = Where ({boolean}, zero, fill)", "a = Add (s, m)", "p = Softmax <axis = -1> (a)"]
    lines += ["n = IsNaN (p)", "w = Where (n, zero, p)", f"y = MatMul (w, {value})"] if guard else \
        [f"y = MatMul (p, {value})"]
    text = (f'<ir_version: 10, opset_import: ["" : {opset}]> g ({", ".join(inputs)}) => ({", ".join(outputs)}) {{\n'
            + "\n".join(lines) + "\n}")
    model = parser.parse_model(text)
    inits = {"c": np.array(D ** -0.25, np.float32), "zero": np.array(0, np.float32),
             "fill": np.array(fill, np.float32)}
    if causal is not None:
        inits["tri"] = causal.reshape(1, 1, S, total)
    used = {name for node in model.graph.node for name in node.input}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items() if k in used)
    onnx.checker.check_model(model, full_check=True)
    return model


def triangle(past: int = 0) -> np.ndarray:
    return np.arange(S + past)[None, :] <= np.arange(S)[:, None] + past


def test_boolean_mask_split_scale_and_nan_guard_become_one_attention(tmp_path):
    """Fully masked rows (random masks have some) are NaN in the chain before the guard and 0 in both."""
    out = optimize(tmp_path, sdpa_model(), [PASS, *CLEANUP])
    assert out.ops == ["Attention"]
    node = out.node("Attention")
    assert [v.name for v in node.inputs] == ["q", "k", "v", "b"]
    assert node.attr("scale") == pytest.approx(D ** -0.5) and not node.attr("is_causal", 0)


def test_a_finite_fill_keeps_the_additive_mask(tmp_path):
    """With the lowest float instead of -inf, a fully masked row averages the values: no boolean mask then."""
    out = optimize(tmp_path, sdpa_model(fill=float(np.finfo(np.float32).min)), [PASS, *CLEANUP])
    assert sorted(out.ops) == ["Attention", "Where"]
    assert out.refused("fills the masked scores with -3.40282e+38, not -inf")


LOWEST = np.finfo(np.float32).min


def padded_rows() -> np.ndarray:
    """A mask whose first query row sees no key (a left-padded batch's padding rows) and others see some."""
    rng = np.random.default_rng(3)
    visible = rng.random((B, 1, S, S)) < 0.6
    visible[:, :, 0, :] = False
    visible[:, :, 1:, 0] = True
    return visible


def test_a_lowest_fill_is_lifted_one_ulp_so_a_fully_masked_row_still_averages(tmp_path):
    """onnxruntime's Attention takes a mask element equal to the lowest float as -inf (0 out on a row with no
    visible key); the chain averages the values there. Where(b, 0, lowest) gets lowest + 1 ulp in its constant,
    so both compute the same on every row (the harness compares them on this mask), and no node is added."""
    out = optimize(tmp_path, sdpa_model(fill=float(LOWEST), guard=False), [PASS, *CLEANUP],
                   fixed={"b": padded_rows()})
    assert sorted(out.ops) == ["Attention", "Where"]
    fill = out.node("Where").inputs[2].constant_value()
    assert fill == np.nextafter(LOWEST, np.float32(0)) and fill > LOWEST


def test_a_run_time_float_mask_gets_its_lowest_values_lifted(tmp_path):
    """A float mask that is an input (no constants to lift) gets Where(Equal(m, lowest), lowest + 1 ulp, m)."""
    mask = np.where(padded_rows(), 0, LOWEST).astype(np.float32)
    out = optimize(tmp_path, attention_model(masks=1), [PASS], fixed={"m0": mask})
    assert sorted(out.ops) == sorted(["Attention", "Transpose", "Transpose", *LIFT])
    assert out.node("Attention").inputs[3] is out.node("Where").outputs[0]


def masked_fill_model(*, fill: float, form: str = "if_true", masks: int = 0, opset: int = 23, rows: int = S):
    """Eager attention that masks by choosing, not adding: Where(b, fill, scores) after the scale and ``masks``
    additive masks (torch's masked_fill: XLM, MPT; ``form`` "if_true"), or Where(b, scores, fill) (GPT-2's
    eager causal mask, "if_false"); b is (B, 1, rows, S): a row per query, or a padding mask with ``rows`` 1."""
    inputs = [f"float[{B}, {H}, {S}, {D}] q", f"float[{B}, {H}, {S}, {D}] k", f"float[{B}, {H}, {S}, {D}] v",
              f"bool[{B}, 1, {rows}, {S}] b", *(f"float[{B}, 1, {S}, {S}] m{i}" for i in range(masks))]
    lines, last = ["kt = Transpose <perm = [0, 1, 3, 2]> (k)", "s = MatMul (q, kt)", "sc = Mul (s, c)"], "sc"
    for i in range(masks):
        lines.append(f"a{i} = Add ({last}, m{i})")
        last = f"a{i}"
    lines.append(f"w = Where (b, fill, {last})" if form == "if_true" else f"w = Where (b, {last}, fill)")
    lines += ["p = Softmax <axis = -1> (w)", "y = MatMul (p, v)"]
    text = (f'<ir_version: 10, opset_import: ["" : {opset}]> g ({", ".join(inputs)}) => (float[{B}, {H}, {S}, {D}] y)'
            " {\n" + "\n".join(lines) + "\n}")
    model = parser.parse_model(text)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0.35355, np.float32), "c"),
                                    numpy_helper.from_array(np.array(fill, np.float32), "fill")])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("masks", [0, 1])
@pytest.mark.parametrize("form", ["if_true", "if_false"])
def test_a_lowest_masked_fill_becomes_the_ops_additive_mask(tmp_path, form, masks):
    """Where(b, lowest, s) is s + Where(b, lowest, 0): the lowest float absorbs every score added to it, on rows
    masked throughout too (the harness compares both on such a mask)."""
    hidden = ~padded_rows() if form == "if_true" else padded_rows()  # the first query row sees no key
    out = optimize(tmp_path, masked_fill_model(fill=float(LOWEST), form=form, masks=masks), [PASS, *CLEANUP],
                   fixed={"b": hidden})
    assert "Softmax" not in out.ops and out.ops.count("Attention") == 1 and len(out.node("Attention").inputs) == 4
    assert out.ops.count("Add") == masks  # the additive mask and the fill's summed


def test_an_infinite_masked_fill_becomes_a_mask_too(tmp_path):
    visible = padded_rows()
    visible[:, :, 0, 0] = True  # -inf on a row masked throughout is NaN in the chain, 0 in the op
    out = optimize(tmp_path, masked_fill_model(fill=-np.inf, form="if_false"), [PASS, *CLEANUP],
                   fixed={"b": visible})
    assert out.ops == ["Attention"] and out.node("Attention").inputs[3].name == "b"  # BooleanMask took it


def test_a_masked_fill_whose_mask_broadcasts_the_scores_is_refused(tmp_path):
    """q, k and v of one sequence, a mask for two: the chain's output has two, the op's would have one."""
    model = masked_fill_model(fill=float(LOWEST))
    for value in model.graph.input[:3]:
        value.type.tensor_type.shape.dim[0].dim_value = 1
    out = optimize(tmp_path, model, [PASS, *CLEANUP])
    assert "Attention" not in out.ops
    assert out.refused("do not keep the shape of its scores (they broadcast them)")


def test_a_masked_fill_that_does_not_absorb_the_scores_is_refused(tmp_path):
    """-1e9 (older models' fill): the op would see s - 1e9, whose spread over a row masked throughout is not
    the chain's uniform row."""
    out = optimize(tmp_path, masked_fill_model(fill=-1e9), [PASS, *CLEANUP])
    assert "Attention" not in out.ops
    assert out.refused("fills masked scores with -1e+09: only -inf, or in float32 a value at most -2**120")


def test_a_scalar_score_bias_stays_out_of_the_op(tmp_path):
    """Adding one constant to every score (a score_mod) is no attn_mask onnxruntime takes (2-D to 4-D, a row
    per query): the chain stays, with the reason."""
    model = attention_model(masks=0)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    bias = onnx.helper.make_node("Add", [softmax.input[0], "bias"], ["sb"])
    softmax.input[0] = "sb"
    position = list(model.graph.node).index(softmax)
    model.graph.node.insert(position, bias)
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "bias"))
    out = optimize(tmp_path, model, [PASS])
    assert "Attention" not in out.ops
    assert out.refused("has shape [], not a row per query (5) in 2 to 4 dims as the Attention op's attn_mask")


def test_past_key_values_go_into_the_op_and_the_concats_become_present(tmp_path):
    out = optimize(tmp_path, sdpa_model(past=3), [PASS, *CLEANUP, PASS])
    assert out.ops == ["Attention"]
    node = out.node("Attention")
    assert [v.name if v else "" for v in node.inputs] == ["q", "k", "v", "b", "pk", "pv"]
    assert [v.name for v in node.outputs] == ["y", "present_k", "present_v"]


def test_a_reader_of_the_present_keys_before_the_attention_is_refused(tmp_path):
    """The op (where the chain's last MatMul was) would produce the present keys after that reader."""
    out = optimize(tmp_path, sdpa_model(past=3, early_reader=True), [PASS, *CLEANUP, PASS])
    assert out.ops.count("Concat") == 2
    assert out.refused("reads the present k 'present_k' before Attention")


@pytest.mark.parametrize("past", [0, 3])
def test_the_causal_triangle_offset_by_the_cache_becomes_is_causal(tmp_path, past):
    out = optimize(tmp_path, sdpa_model(mask="and", causal=triangle(past), past=past), [PASS, *CLEANUP, PASS])
    assert out.ops == ["Attention"]
    node = out.node("Attention")
    assert node.attr("is_causal") == 1 and node.input(3).name == "b"


def test_a_constant_additive_triangle_becomes_is_causal_without_mask(tmp_path):
    """The dynamo export of sdpa with is_causal=True: the triangle as 0 / -inf floats, nothing else."""
    text = (f'<ir_version: 10, opset_import: ["" : 23]> g (float[{B}, {H}, {S}, {D}] q, float[{B}, {H}, {D}, {S}] kt, '
            f'float[{B}, {H}, {S}, {D}] v) => (float[{B}, {H}, {S}, {D}] y) {{\n'
            "s = MatMul (q, kt)\na = Add (s, tri)\np = Softmax <axis = -1> (a)\ny = MatMul (p, v)\n}")
    model = parser.parse_model(text)
    model.graph.initializer.append(numpy_helper.from_array(np.where(triangle(), 0, -np.inf).astype(np.float32), "tri"))
    out = optimize(tmp_path, model, [PASS])
    node = out.node("Attention")
    assert node.attr("is_causal") == 1 and len([v for v in node.inputs if v is not None]) == 3


def test_a_top_left_triangle_over_the_concatenated_keys_keeps_them_out_of_the_cache(tmp_path):
    """Without a cache input the op's triangle is top-left, so this one is is_causal; taking the Concats in as
    the cache would shift it by the cached keys: refused."""
    top_left = np.arange(S + 3)[None, :] <= np.arange(S)[:, None]
    out = optimize(tmp_path, sdpa_model(mask="and", causal=top_left, past=3), [PASS, *CLEANUP, PASS])
    assert sorted(out.ops) == ["Attention", "Concat", "Concat"] and out.node("Attention").attr("is_causal") == 1
    assert out.refused("already has a cache or causal masking")


def test_a_triangle_offset_otherwise_is_refused(tmp_path):
    shifted = np.arange(S)[None, :] <= np.arange(S)[:, None] + 1
    out = optimize(tmp_path, sdpa_model(mask="and", causal=shifted), [PASS, *CLEANUP])
    assert "And" in out.ops and not out.node("Attention").attr("is_causal", 0)
    assert out.refused("is not the causal triangle offset by the 0 cached keys (the op's is_causal)")


def test_a_mask_beside_the_triangle_that_broadcasts_over_queries_is_refused(tmp_path):
    """onnxruntime 1.31's kernel wants a row per query; a padding mask (B, 1, 1, keys) stays in the And."""
    model = sdpa_model(mask="and", causal=triangle())
    model.graph.input[3].type.tensor_type.shape.dim[2].dim_value = 1
    out = optimize(tmp_path, model, [PASS, *CLEANUP])
    assert "And" in out.ops and not out.node("Attention").attr("is_causal", 0)
    assert out.refused("(onnxruntime broadcasts no mask over the queries)")
