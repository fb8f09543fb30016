"""transformer_domain_fuse: Gelu, RMSNorm and attention chains in models whose opset predates the standard op
become mirserve ops whose function bodies onnxruntime runs (outputs compared with the chain's); where the
standard op is allowed the chain is left to the standard pass."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.engine.passes.fuse.harness import optimize
from tests.engine.passes.fuse.test_attention import (B, D, H, LOWEST, S, attention_model, masked_fill_model,
                                                     padded_rows, sdpa_model)
from tests.engine.passes.fuse.test_gelu import erf_chain, tanh_chain
from tests.engine.passes.fuse.test_rms_norm import rms_chain, floats, HIDDEN

PASS = "transformer_domain_fuse"


def domain_ops(out):
    return [(node.domain, node.op_type) for node in out.model.graph]


def own(out, op_type):
    (node,) = [node for node in out.model.graph if node.op_type == op_type and node.domain == "mirserve"]
    return node


def test_erf_gelu_at_opset_17_becomes_the_domain_gelu(tmp_path):
    out = optimize(tmp_path, erf_chain(opset=17), [PASS])
    assert domain_ops(out) == [("mirserve", "Gelu")]


def test_tanh_gelu_at_opset_17_becomes_the_domain_gelu_tanh(tmp_path):
    model = tanh_chain("x_a_half")
    model.opset_import[0].version = 17
    out = optimize(tmp_path, model, [PASS])
    assert domain_ops(out) == [("mirserve", "GeluTanh")]


@pytest.mark.parametrize("inverse", ["reciprocal", "div_one", "div"])
def test_rms_norm_at_opset_18_becomes_the_domain_rms_norm(tmp_path, inverse):
    out = optimize(tmp_path, rms_chain(opset=18, inverse=inverse), [PASS])
    assert domain_ops(out) == [("mirserve", "RMSNorm")]
    assert own(out, "RMSNorm").attr("epsilon") == pytest.approx(1e-6)


def test_rms_norm_over_two_axes_is_refused(tmp_path):
    out = optimize(tmp_path, rms_chain(opset=18, axes=(1, 2), gamma=floats(5, HIDDEN, seed=4)), [PASS])
    assert "RMSNorm" not in out.ops and out.refused("normalizes more than the last axis")


@pytest.mark.parametrize("masks", [0, 1, 2])
def test_attention_at_opset_18_becomes_the_domain_attention(tmp_path, masks):
    out = optimize(tmp_path, attention_model(opset=18, masks=masks), [PASS])
    assert sorted(out.ops) == sorted(["Transpose", "ScaledDotProductAttention"] + ["Add"] * (masks == 2))
    node = own(out, "ScaledDotProductAttention")
    assert node.attr("scale") == pytest.approx(0.35355)
    assert len(node.inputs) == 4


def test_torch_sdpa_at_opset_18_becomes_the_domain_attention_with_the_guard_on_its_output(tmp_path):
    """q and kT each scaled by sqrt(scale), weights NaN-guarded: the random boolean mask masks whole rows, which
    the chain zeroes before multiplying by v and the guard after the op zeroes too."""
    out = optimize(tmp_path, sdpa_model(opset=18), [PASS])
    assert sorted(out.ops) == ["IsNaN", "ScaledDotProductAttention", "Transpose", "Where", "Where"]
    assert own(out, "ScaledDotProductAttention").attr("scale") == pytest.approx(8 ** -0.5)


@pytest.mark.parametrize("rows", [1, 5])
def test_a_masked_fill_at_opset_17_becomes_the_domain_attention_with_a_padding_mask_too(tmp_path, rows):
    """XLM's padding mask (B, 1, 1, keys) chooses the scores by Where: the domain op adds any mask that
    broadcasts, so the padding mask goes in as Where(b, lowest, 0); the lowest absorbs the scores exactly."""
    b = ~padded_rows()[:, :, :rows, :]
    out = optimize(tmp_path, masked_fill_model(fill=float(LOWEST), masks=1, opset=17, rows=rows), [PASS],
                   fixed={"b": b})
    assert sorted(domain_ops(out)) == [("", "Add"), ("", "Transpose"), ("", "Where"),
                                       ("mirserve", "ScaledDotProductAttention")]


def test_grouped_query_attention_keeps_repeat_kv_in_front(tmp_path):
    out = optimize(tmp_path, attention_model(opset=18, gqa=True), [PASS])
    assert "ScaledDotProductAttention" in out.ops and out.ops.count("Expand") == 2


def test_where_the_standard_op_is_allowed_nothing_happens_and_nothing_is_said(tmp_path):
    out = optimize(tmp_path, rms_chain(opset=23), [PASS])
    assert "RMSNorm" not in out.ops and not out.refusals(PASS)


def test_no_body_below_opset_13(tmp_path):
    out = optimize(tmp_path, erf_chain(opset=12), [PASS])
    assert "Gelu" not in out.ops
    assert out.refused("the mirserve.Gelu body cannot be written: Gelu needs opset 13 or later")


def test_a_domain_op_that_would_run_on_a_worse_place_than_its_chain_is_refused(tmp_path):
    # ARM runs the chain's Mul and Add in fp16, but Erf in fp32 only, so mirserve.Gelu (derived from the body)
    # runs in fp32 only: a worse place than the Muls get (issue 12)
    out = optimize(tmp_path, erf_chain(opset=17), [PASS], places="arm/fp16/nhwc,arm/fp32/nchw")
    assert "Gelu" not in out.ops and out.refused("mirserve.Gelu would run on arm/fp32/nchw at best")
    # ARM alone: its derived mirserve.Gelu (fp32) is as good as the chain's nodes get
    out = optimize(tmp_path, erf_chain(opset=17), [PASS], places="arm/fp32/nchw")
    assert domain_ops(out) == [("mirserve", "Gelu")]


@pytest.mark.parametrize("masks", [0, 1, 2])
def test_arm_fp16_runs_the_domain_attention_its_body_allows(tmp_path, masks):
    # MatMul, Mul, Add and Softmax all have ARM fp16 kernels: so does ScaledDotProductAttention (derived)
    out = optimize(tmp_path, attention_model(opset=18, masks=masks), [PASS], places="arm/fp16/nhwc,arm/fp32/nchw")
    assert "ScaledDotProductAttention" in out.ops


def test_a_gpu_run_keeps_the_chain_on_the_device(tmp_path):
    """opencl has no mirserve.RMSNorm kernel (no Div kernel for its body); the host fallback has, in other
    memory: the chain stays on opencl. (cuda now runs the op: its table runs every
    op of the body, so a kernel is derived.)"""
    out = optimize(tmp_path, rms_chain(opset=18), [PASS], places="opencl/fp32/nchw")
    assert "RMSNorm" not in out.ops
    assert out.refused("only host has a mirserve.RMSNorm kernel, outside the memory of opencl")
    out = optimize(tmp_path, rms_chain(opset=18), [PASS], places="cuda/fp32/nchw")
    assert domain_ops(out) == [("mirserve", "RMSNorm")]


def test_a_cpu_target_sharing_the_hosts_memory_fuses(tmp_path):
    out = optimize(tmp_path, rms_chain(opset=18), [PASS], places="arm/fp32/nchw")
    assert domain_ops(out) == [("mirserve", "RMSNorm")]


def heads_chain(*, kv_heads: int = H, out_shape=(0, 0, -1), out_type=None):
    """BERT's attention at opset 17: q3, k3, v3 (B, S, heads * D) split into heads, the keys transposed for the
    scores (0, 2, 3, 1), the chain written out, the heads joined back (or into ``out_shape``)."""
    text = (f'<ir_version: 8, opset_import: ["" : 17]> g (float[{B}, {S}, {H * D}] q3, '
            f'float[{B}, {S}, {kv_heads * D}] k3, float[{B}, {S}, {kv_heads * D}] v3, float[{B}, 1, {S}, {S}] m) '
            f'=> (float[{out_type or f"{B}, {S}, {H * D}"}] y) {{\n'
            "qr = Reshape (q3, qs)\nq = Transpose <perm = [0, 2, 1, 3]> (qr)\n"
            "kr = Reshape (k3, ks)\nkt = Transpose <perm = [0, 2, 3, 1]> (kr)\n"
            "vr = Reshape (v3, ks)\nv = Transpose <perm = [0, 2, 1, 3]> (vr)\n"
            "s = MatMul (q, kt)\nsc = Mul (s, c)\na = Add (sc, m)\np = Softmax <axis = -1> (a)\no = MatMul (p, v)\n"
            "t = Transpose <perm = [0, 2, 1, 3]> (o)\ny = Reshape (t, ys)\n}")
    model = onnx.parser.parse_model(text)
    inits = {"qs": np.array([0, 0, H, D], np.int64), "ks": np.array([0, 0, kv_heads, D], np.int64),
             "ys": np.array(out_shape, np.int64), "c": np.array(0.35355, np.float32)}
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def test_heads_split_from_the_hidden_size_go_into_the_domain_multi_head_attention(tmp_path):
    """8 nodes a layer (a Reshape and a Transpose for each of q, k, v and the output) go into the op, as
    attention_fuse's 3-D Attention takes them from opset 23."""
    out = optimize(tmp_path, heads_chain(), [PASS])
    assert domain_ops(out) == [("mirserve", "MultiHeadAttention")]
    node = own(out, "MultiHeadAttention")
    assert [v.name for v in node.inputs] == ["q3", "k3", "v3", "m"]
    assert (node.attr("num_heads"), node.attr("scale")) == (H, pytest.approx(0.35355))


def test_heads_joined_into_another_shape_keep_one_reshape_after_the_domain_op(tmp_path):
    out = optimize(tmp_path, heads_chain(out_shape=(B * S, H * D), out_type=f"{B * S}, {H * D}"), [PASS])
    assert domain_ops(out) == [("mirserve", "MultiHeadAttention"), ("", "Reshape")]


def test_fewer_key_heads_than_query_heads_keep_the_four_dimensional_op(tmp_path):
    """Grouped-query keys, as many as the queries here only through a broadcasting MatMul: refused."""
    out = optimize(tmp_path, heads_chain(kv_heads=1), [PASS])
    assert "MultiHeadAttention" not in out.ops and "ScaledDotProductAttention" in out.ops
    assert out.refused("reads fewer key or value heads than query heads")


def test_a_multi_head_attention_arm_would_run_on_the_host_is_refused(tmp_path):
    """ARM has no Reshape kernel (Paddle-Lite runs it on the host), so it derives no MultiHeadAttention: the
    4-D op stays on arm rather than the whole attention going to the host."""
    out = optimize(tmp_path, heads_chain(), [PASS], places="arm/fp32/nchw")
    assert "ScaledDotProductAttention" in out.ops and "MultiHeadAttention" not in out.ops


def test_a_multi_head_attention_only_the_fp16_place_runs_is_refused(tmp_path):
    """opencl runs the op in fp16, but where its fp16 result fails auto mixed precision moves it to the fp32
    places: arm has the 4-D op there and not this one (speech2text's decoder self-attention went to the host)."""
    out = optimize(tmp_path, heads_chain(), [PASS], places="opencl/fp16/nchw,arm/fp32/nchw")
    assert "ScaledDotProductAttention" in out.ops and "MultiHeadAttention" not in out.ops
    assert out.refused("in fp32, where a node goes whose fp16 result fails, mirserve.MultiHeadAttention would run "
                       "on host/fp32/nchw at best")


def test_an_attention_over_constants_alone_is_left_to_constant_folding(tmp_path):
    """DETR's first decoder layer attends over its constant object queries: a mirserve op would keep the chain
    for every inference (folding computes no other domain), so the chain stays for constant folding."""
    model = attention_model(opset=18, masks=0)
    graph = model.graph
    rng = np.random.default_rng(0)
    for value in list(graph.input):  # q, k and v become weights, q read through a Relu (computed, not a weight)
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        name = "q0" if value.name == "q" else value.name
        graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    del graph.input[:]
    graph.node.insert(0, onnx.helper.make_node("Relu", ["q0"], ["q"]))
    out = optimize(tmp_path, model, [PASS])
    assert "ScaledDotProductAttention" not in out.ops
    assert out.refused("every input of the chain is computed from constants: constant folding computes it")


def runtime_scaled_sdpa(opset: int):
    """sdpa_model with its sqrt(scale) computed from q's shape (D ** -0.25), as TorchScript exports torch's
    scaled_dot_product_attention: not a constant when the chains are first fused."""
    model = sdpa_model(opset=opset)
    graph = model.graph
    kept = [i for i in graph.initializer if i.name != "c"]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([3], np.int64), "last"))
    make = onnx.helper.make_node
    computed = [make("Shape", ["q"], ["shape"]), make("Gather", ["shape", "last"], ["d"]),
                make("Cast", ["d"], ["df"], to=onnx.TensorProto.FLOAT), make("Sqrt", ["df"], ["root"]),
                make("Sqrt", ["root"], ["fourth"]), make("Reciprocal", ["fourth"], ["c"])]
    nodes = computed + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


@pytest.mark.parametrize("passes, op, opset", [(PASS, "ScaledDotProductAttention", 18),
                                               ("attention_fuse", "Attention", 23)])
def test_a_query_and_keys_scaled_at_run_time_give_their_scale_to_the_op_once_it_folds(tmp_path, passes, op, opset):
    """Fused in the first round with the two Muls outside (their scale not yet a constant), the Muls go into the
    op's scale once folding has made it one (timm's PiT and CaFormer exported by TorchScript)."""
    out = optimize(tmp_path, runtime_scaled_sdpa(opset), [passes, "eliminate_shape_op", "constant_folding", passes])
    assert "Mul" not in out.ops and op in out.ops
    node = next(n for n in out.model.graph if n.op_type == op)
    assert node.attr("scale") == pytest.approx(D ** -0.5)
