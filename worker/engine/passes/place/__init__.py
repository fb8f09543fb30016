"""Place passes: support check, kernel pick, place inference, io_copy / calib / layout casts, cleanup.

Each file registers the pass it is named after; what several of them share lives in passes/support/
(placement: node facts, a node's pick, the fetch contract; casts; nhwc: NHWC forms; qdq: quantized forms).
A placed node (casts too) carries ``node.pick``, the kernel resolved against it, whose ``Port`` per input
and output says the target, precision and layout it reads or writes; kernels come from ``ctx.kernels`` only.
Their order in the default pipeline is worker.engine.passes.pipelines.SUPPORT and PLACE (Paddle-Lite's order, with
the cast cleanup, fp16 storage and the kernels report after the casts).
"""
from worker.engine.passes.place import (fp16_storage, place_report, static_kernel_pick, support_check,  # noqa: F401
                                 type_cast_cleanup, type_layout_cast, type_precision_cast, type_target_cast,
                                 variable_place_inference)
