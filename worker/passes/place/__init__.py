"""Place passes: support check, kernel pick, place inference, io_copy / calib / layout casts, cleanup.

Their order in the default pipeline is worker.passes.pipelines.SUPPORT and PLACE (Paddle-Lite's order, with
the cast cleanup, fp16 storage and the kernels report after the casts).
"""
from worker.passes.place import (fp16_storage, place_report, static_kernel_pick, support_check,  # noqa: F401
                                 type_cast_cleanup, type_layout_cast, type_precision_cast, type_target_cast,
                                 variable_place_inference)
