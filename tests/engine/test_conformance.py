"""onnx's node test cases through optimize() (bench/conformance.py runs all ~1,900 in seven configurations):
every case that once crashed, came out wrong or stopped loading, in each configuration it failed in, and
(marked ``models``) a spread sample of every op in all seven. Each must end matched, refused or unrunnable
(onnxruntime runs neither the input nor anything else), never as a failure."""
from __future__ import annotations

import pytest

from bench.conformance import CONFIGS, FAILURES, all_cases, cases_named, reference, run_case

#: Cases the conformance bench found failing, with the configurations they failed in (the bug, fixed).
REGRESSIONS = {
    # constant folding read element 0 of an empty constant it took for a repeated value
    "test_reduce_l1_empty_set_expanded": ["folded"],
    "test_reduce_log_sum_exp_empty_set_expanded": ["folded"],
    "test_reduce_sum_square_empty_set_expanded": ["folded"],
    # fold_scale_axis divided by an all-zero scale while checking for it
    "test_affine_grid_2d_align_corners_expanded": ["folded", "default"],
    # an If body read an outer value converted to fp16 without a calib back
    "test_affine_grid_3d_align_corners_expanded": ["arm_fp16", "opencl_fp16"],
    # io_copy inserted for sequences, which no io_copy takes
    "test_if_seq": ["cuda"],
    "test_loop13_seq": ["cuda"],
    "test_sequence_map_add_2_sequences_expanded": ["cuda"],
    # a Cast next to int8 data refused on every place, the fp32 one included
    "test_dynamicquantizelinear_expanded": ["arm_fp16", "opencl_fp16"],
    # an int4 value copied by an io_copy whose Identity body onnxruntime cannot run at opset 25
    "test_castlike_FLOAT_to_INT4_expanded": ["cuda"],
    # float8 values were 'type 17' to kernel pick, in no kernel's type list
    "test_castlike_FLOAT_to_FLOAT8E4M3FN": ["default", "cuda"],
    # fp16 chains folded op by op vs onnxruntime's fp32 runs: compared at fp16 resolution
    "test_attention_4d_causal_fp16_expanded": ["folded"],
    # a scalar score bias fused as the Attention op's attn_mask, which onnxruntime takes 2-D to 4-D only
    "test_flexattention_score_mod_expanded_ver26": ["default", "portable", "arm_fp16", "opencl_fp16", "cuda"],
    # the host table let Attention's V be fp16 beside fp32 Q and K, which onnxruntime has no kernel for
    "test_flexattention_gqa_expanded_ver26": ["arm_fp16", "opencl_fp16"],
    # a second type inference named a width unk__2 like the first run's batch: onnxruntime took them for equal
    "test_affine_grid_2d_expanded": ["default", "cuda"],
}


def _regressions():
    return [(spec, config) for spec, configs in REGRESSIONS.items() for config in configs]


@pytest.fixture(scope="module")
def regression_cases():
    return {c.name: c for c in cases_named(REGRESSIONS)}


@pytest.mark.parametrize("spec, config", _regressions(), ids=[f"{s}-{c}" for s, c in _regressions()])
def test_a_case_that_failed_once_ends_well(spec, config, regression_cases, tmp_path):
    case = regression_cases[spec]
    outcome = run_case(case, CONFIGS[config], tmp_path)
    assert outcome.outcome not in FAILURES, f"{outcome.outcome}: {outcome.detail}"


#: Every how-many-th case the sample takes (about 190 cases, seven configurations each).
SAMPLE_EVERY = 10


@pytest.fixture(scope="module")
def sample():
    cases = all_cases()
    return [(c, reference(c)) for c in cases[::SAMPLE_EVERY]]


@pytest.mark.models
@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_sample_of_every_op_ends_well_in_every_configuration(config, sample, tmp_path):
    failures = []
    for case, ref in sample:
        outcome = run_case(case, CONFIGS[config], tmp_path, ref)
        if outcome.outcome in FAILURES:
            failures.append(f"{case.name}: {outcome.outcome}: {outcome.detail}")
    assert not failures, "\n".join(failures)
