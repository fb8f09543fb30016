"""MAC counts per node from shapes (conv, grouped conv, conv-transpose, Gemm, MatMul, fused, NHWC and
quantized ops, function bodies), and a reason wherever the count is unknown."""
import pytest
from onnx import TensorProto

from worker.engine.kernels.table import default_table
from worker.engine.memory.macs import base_op, count_macs, node_macs
from worker.engine.mirserve_domain import ops as domain
from worker.engine.passes.support.nhwc import nhwc_form, register_nhwc


def test_conv_counts_output_elements_times_filter_slice():
    # 3x3 conv, 16 -> 32 channels, 8x8 output: 32*8*8 outputs, each 16*3*3 MACs.
    assert node_macs("Conv", "", [(1, 16, 10, 10), (32, 16, 3, 3), (32,)], [(1, 32, 8, 8)]) == 32 * 64 * 144


def test_grouped_and_depthwise_conv_count_only_their_group():
    assert node_macs("Conv", "", [(1, 32, 8, 8), (32, 1, 3, 3)], [(1, 32, 8, 8)]) == 32 * 64 * 9
    assert node_macs("Conv", "", [(1, 32, 8, 8), (64, 8, 1, 1)], [(1, 64, 8, 8)]) == 64 * 64 * 8


def test_conv_transpose_counts_input_elements_times_filter_slice():
    # Stride-2 upsampling 8 -> 4 channels, 5x5 input, 3x3 kernel: each input element feeds 4*9 outputs.
    assert node_macs("ConvTranspose", "", [(1, 8, 5, 5), (8, 4, 3, 3)], [(1, 4, 11, 11)]) == 8 * 25 * 36


def test_gemm_reduces_over_k_with_or_without_transpose():
    assert node_macs("Gemm", "", [(2, 128), (128, 10)], [(2, 10)]) == 2 * 10 * 128
    assert node_macs("Gemm", "", [(128, 2), (128, 10)], [(2, 10)], {"transA": 1}) == 2 * 10 * 128


def test_batched_and_vector_matmul():
    assert node_macs("MatMul", "", [(12, 128, 64), (12, 64, 128)], [(12, 128, 128)]) == 12 * 128 * 128 * 64
    assert node_macs("MatMul", "", [(64,), (64, 10)], [(10,)]) == 640


def test_quantized_forms_find_their_weight_after_the_scales():
    inputs = [(1, 16, 10, 10), (), (), (32, 16, 3, 3), (), (), (), ()]
    assert node_macs("QLinearConv", "", inputs, [(1, 32, 8, 8)]) == 32 * 64 * 144


CONV_IO = ([(1, 4, 6, 6), (8, 4, 3, 3), (8,)], [(1, 8, 4, 4)])
DECONV_IO = ([(1, 8, 5, 5), (8, 4, 3, 3), (4,)], [(1, 4, 7, 7)])
GEMM_IO = ([(2, 128), (128, 10), (10,)], [(2, 10)])
MATMUL_IO = ([(12, 16, 64), (12, 64, 16)], [(12, 16, 16)])


@pytest.mark.parametrize("op, base, io", [("FusedConvRelu", "Conv", CONV_IO),
                                          ("FusedConvTransposeSigmoid", "ConvTranspose", DECONV_IO),
                                          ("FusedGemmRelu", "Gemm", GEMM_IO), ("FusedMatMulGelu", "MatMul", MATMUL_IO),
                                          ("FusedMatMulSilu", "MatMul", MATMUL_IO)])
def test_fused_ops_count_as_the_op_they_wrap(op, base, io):
    assert base_op(base, "") == base and base_op(op, "mirserve") is None  # counted through the body
    count = node_macs(op, "mirserve", *io, opset=17)
    assert count == node_macs(base, "", *io) and count > 0


def test_a_body_whose_shapes_do_not_fit_is_unknown_with_onnx_s_words():
    count, reason = count_macs("FusedMatMulGelu", "mirserve", *CONV_IO, opset=17)
    assert count is None and reason.startswith("mirserve.FusedMatMulGelu: its function body is not shape-inferable ([ShapeInferenceError]")


def test_other_ops_do_no_counted_macs_and_unknown_ones_give_none_with_the_reason():
    assert node_macs("Relu", "", [(1, 8)], [(1, 8)]) == 0
    assert count_macs("FusedConvRelu", "com.other", [(1, 4, 6, 6)], [(1, 8, 4, 4)]) == (
        None, "com.other.FusedConvRelu is neither a standard op nor defined by a function, so its MACs are unknown")
    count, reason = count_macs("Conv", "", [(1, 4, "h", 6), (8, 4, 3, 3)], [(1, 8, None, 4)])
    assert count is None and reason == "Conv: the shape of its output 0 is [1, 8, ?, 4]"
    count, reason = count_macs("FusedConvRelu", "mirserve", [(1, 4, "h", 6), (8, 4, 3, 3), (8,)], [None])
    assert count is None and "input 0" in reason


# Conv 16 -> 32 channels, 3x3, pad 1, on 10x10: 32*10*10 outputs x 16*3*3.
CONV_ATTRS = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1], "dilations": [1, 1], "group": 1}
CONV_MACS = 32 * 100 * 144


@pytest.mark.parametrize("op, op_domain", [("Conv", ""), ("FusedConvRelu", "mirserve"),
                                           ("FusedConvHardSigmoid", "mirserve")])
@pytest.mark.parametrize("opset", [11, 13, 18])
def test_nhwc_forms_count_as_their_nchw_op_through_their_body(op, op_domain, opset):
    """NHWC data [N,H,W,C] and OHWI weights: the body transposes back, so the count is the NCHW one."""
    form = register_nhwc(nhwc_form(op, op_domain, opset))
    attrs = dict(CONV_ATTRS, **({"activation_alpha": 0.2, "activation_beta": 0.5} if "Hard" in op else {}))
    assert node_macs(op, op_domain, [(1, 16, 10, 10), (32, 16, 3, 3), (32,)], [(1, 32, 10, 10)], attrs,
                     opset=opset) == CONV_MACS
    assert node_macs(form.name, "mirserve", [(1, 10, 10, 16), (32, 3, 3, 16), (32,)], [(1, 10, 10, 32)],
                     attrs, opset=opset) == CONV_MACS


def test_nhwc_form_of_a_model_mirserve_wrote_is_counted_in_a_process_that_never_made_it():
    domain.unregister_op("NhwcConvTranspose", force=True)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
             "output_padding": [0, 0]}
    assert node_macs("NhwcConvTranspose", "mirserve", [(1, 5, 5, 8), (8, 3, 3, 4), (4,)], [(1, 11, 11, 4)],
                     attrs, opset=13) == 8 * 25 * 36


def test_quantized_own_ops_count_through_their_body():
    u8, i8, f32, i32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.FLOAT, TensorProto.INT32
    shapes = [(1, 16, 10, 10), (), (), (32, 16, 3, 3), (32,), (32,), (), (), (32,)]
    types = [u8, f32, u8, i8, f32, i8, f32, u8, i32]
    count, reason = count_macs("QLinearConv", "mirserve", shapes, [(1, 32, 10, 10)], CONV_ATTRS,
                               input_types=types, opset=13)
    assert (count, reason) == (CONV_MACS, None)
    count, reason = count_macs("QLinearMatMul", "mirserve", [(4, 64), (), (), (64, 10), (), (), (), ()],
                               [(4, 10)], {}, input_types=[u8, f32, u8, i8, f32, i8, f32, u8], opset=13)
    assert (count, reason) == (4 * 10 * 64, None)
    assert node_macs("ConvInteger", "", [(1, 16, 10, 10), (32, 16, 3, 3)], [(1, 32, 10, 10)]) == CONV_MACS
    assert node_macs("MatMulInteger", "", [(4, 64), (64, 10)], [(4, 10)]) == 4 * 10 * 64


def test_own_ops_without_macs_count_zero_without_shapes():
    for op in ("ChannelShuffle", "FusedAddRelu", "QLinearAdd", "layout", "calib", "io_copy"):
        assert count_macs(op, "mirserve", [None, None], [None]) == (0, None), op


def test_einsum_recurrent_and_attention():
    assert node_macs("Einsum", "", [(2, 8, 16), (2, 16, 4)], [(2, 8, 4)], {"equation": "bij,bjk->bik"}) == \
        2 * 8 * 4 * 16
    assert node_macs("Einsum", "", [(2, 8, 16), (2, 16, 4)], [(2, 8, 4)], {"equation": "...ij,...jk"}) == \
        2 * 8 * 4 * 16
    assert node_macs("Einsum", "", [(8, 16)], [(16, 8)], {"equation": "ij->ji"}) == 0
    # LSTM: 5 steps, batch 2, input 10, hidden 20, one direction: 4 gates x 20 x (10 + 20) per step.
    assert node_macs("LSTM", "", [(5, 2, 10), (1, 80, 10), (1, 80, 20)], [(5, 1, 2, 20)]) == 5 * 2 * 80 * 30
    # Attention: 2 heads, 6 queries, 9 keys, head size 4: 2*6*9*4 scores + 2*6*9*4 weighted values.
    assert node_macs("Attention", "", [(1, 2, 6, 4), (1, 2, 9, 4), (1, 2, 9, 4)], [(1, 2, 6, 4)]) == 2 * 2 * 6 * 9 * 4
    count, reason = count_macs("AffineGrid", "", [(1, 2, 3), (4,)], [(1, 4, 4, 2)])
    assert count is None and "no rule" in reason


def test_the_own_multi_head_attention_counts_scores_and_weighted_sum_per_key():
    """(batch 2, 5 queries, 4 heads x 8) against 7 keys of 2 kv heads x 8, values 2 x 6: scores 2*5*7*32, the
    weighted sum 2*5*7*24 (its output (2, 5, 4 x 6))."""
    shapes = [[2, 5, 32], [2, 7, 16], [2, 7, 12], [1]]
    assert node_macs("MultiHeadAttention", "mirserve", shapes, [[2, 5, 24]], {"num_heads": 4}) == \
        2 * 5 * 7 * 32 + 2 * 5 * 7 * 24
    macs, why = count_macs("MultiHeadAttention", "mirserve", [[2, "s", 32], [2, 7, 16], [2, 7, 12], [1]],
                           [[2, "s", 24]], {"num_heads": 4})
    assert macs is None and "query" in why


def test_every_op_of_every_kernel_table_has_a_rule():
    """Each op a table knows is counted, counts zero, or is unknown only for want of shapes or a rule."""
    no_rule = []
    for kernel in default_table():
        count, reason = count_macs(kernel.op, kernel.domain, [], [], {}, opset=17)
        if count is None and "neither a standard op nor defined by a function" in reason:
            no_rule.append(f"{kernel.domain}.{kernel.op}")
    assert no_rule == []


def test_onnxruntime_attention_ops():
    # com.microsoft.Attention: batch 2, 8 tokens, hidden 64 (4 heads): the projection 2*8*64 x 192 weights,
    # then 2*8*8 scores of 64 and 2*8*64 outputs of 8 keys each.
    projection, scores, values = 2 * 8 * 64 * 192, 2 * 8 * 8 * 64, 2 * 8 * 64 * 8
    assert node_macs("Attention", "com.microsoft", [(2, 8, 64), (64, 192), (192,)], [(2, 8, 64)],
                     {"num_heads": 4}) == projection + scores + values
    # With 5 past tokens: 13 keys.
    assert node_macs("Attention", "com.microsoft", [(2, 8, 64), (64, 192), (192,), None, (2, 2, 4, 5, 16)],
                     [(2, 8, 64), None], {"num_heads": 4}) == projection + 2 * (2 * 8 * 13 * 64)
    # MultiHeadAttention on projected Q [2, 8, 64] and K, V [2, 10, 64]: 2 x 2*8*64 x 10.
    assert node_macs("MultiHeadAttention", "com.microsoft", [(2, 8, 64), (2, 10, 64), (2, 10, 64)],
                     [(2, 8, 64)], {"num_heads": 4}) == 2 * 2 * 8 * 64 * 10
    # GroupQueryAttention, 8 query heads over 2 kv heads of 16, present key of 24 tokens.
    assert node_macs("GroupQueryAttention", "com.microsoft", [(1, 4, 128), (1, 4, 32), (1, 4, 32)],
                     [(1, 4, 128), (1, 2, 24, 16), (1, 2, 24, 16)], {"num_heads": 8, "kv_num_heads": 2}) == \
        2 * 4 * 128 * 24
    count, reason = count_macs("MoE", "com.microsoft", [(2, 64)], [(2, 64)])
    assert count is None and reason == ("com.microsoft.MoE (an onnxruntime contrib op) may do MACs that mirserve "
                                        "has no rule to count")


def test_a_model_s_own_functions_count_through_their_bodies_nested_calls_included():
    from onnx import helper
    # com.acme.Proj(X, W) = MatMul(X, W); com.acme.Block(X, W1, W2) = Relu(Proj(X, W1)) then Proj(., W2).
    proj = helper.make_function("com.acme", "Proj", ["X", "W"], ["Y"], [helper.make_node("MatMul", ["X", "W"], ["Y"])],
                                [helper.make_opsetid("", 17)])
    block = helper.make_function("com.acme", "Block", ["X", "W1", "W2"], ["Y"], [
        helper.make_node("Proj", ["X", "W1"], ["h"], domain="com.acme"), helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Proj", ["r", "W2"], ["Y"], domain="com.acme")],
        [helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])
    functions = {("com.acme", "Proj"): proj, ("com.acme", "Block"): block}
    count, reason = count_macs("Block", "com.acme", [(4, 32), (32, 64), (64, 8)], [(4, 8)], {}, opset=17,
                               functions=functions)
    assert (count, reason) == (4 * 64 * 32 + 4 * 8 * 64, None)
    count, reason = count_macs("Block", "com.acme", [(4, 32), (32, 64), (64, 8)], [(4, 8)], {}, opset=17,
                               functions={("com.acme", "Block"): block})  # Proj's definition missing
    assert count is None and reason.startswith("com.acme.Block: ")
