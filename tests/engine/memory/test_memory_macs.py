"""MAC counts per node from shapes (conv, grouped conv, conv-transpose, Gemm, MatMul, fused ops)."""
import pytest

from worker.engine.memory.macs import base_op, node_macs


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


@pytest.mark.parametrize("op, base", [("FusedConvRelu", "Conv"), ("FusedConvTransposeSigmoid", "ConvTranspose"),
                                      ("FusedGemmRelu", "Gemm"), ("FusedMatMulGelu", "MatMul"),
                                      ("FusedConv", "Conv")])
def test_fused_ops_count_as_the_op_they_wrap(op, base):
    assert base_op(op, "mirserve") == base
    assert node_macs(op, "mirserve", [(1, 4, 6, 6), (8, 4, 3, 3)], [(1, 8, 4, 4)]) == \
        node_macs(base, "", [(1, 4, 6, 6), (8, 4, 3, 3)], [(1, 8, 4, 4)])


def test_other_ops_do_no_counted_macs_and_unknown_shapes_give_none():
    assert node_macs("Relu", "", [(1, 8)], [(1, 8)]) == 0
    assert node_macs("FusedConvRelu", "com.other", [(1, 4, 6, 6)], [(1, 8, 4, 4)]) == 0
    assert node_macs("Conv", "", [(1, 4, "h", 6), (8, 4, 3, 3)], [(1, 8, None, 4)]) is None
