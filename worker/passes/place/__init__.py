"""Place passes: support check, kernel pick, place inference, io_copy / calib / layout casts, cleanup."""
from worker.passes.place import (fp16_storage, place_report, static_kernel_pick, support_check,  # noqa: F401
                                 type_cast_cleanup, type_layout_cast, type_precision_cast, type_target_cast,
                                 variable_place_inference)

#: The place passes in the default pipeline, in run order (Paddle-Lite's, with cleanup and storage after).
PIPELINE = ("static_kernel_pick", "variable_place_inference", "type_target_cast", "type_precision_cast",
            "type_layout_cast", "type_cast_cleanup", "fp16_storage", "place_report")
SUPPORT = ("support_check",)
