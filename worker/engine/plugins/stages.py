"""The filter stages: one built-in pass per priority band, placed in the default pipeline between the families.

Each stage is an ordinary pass (traced, timed, skippable with ``--disable-pass``); its trace entry lists every
filter of its band with its plugin, how often it changed the graph, and why it was skipped if it was. The
first stage also runs the pre-callbacks, the last one the post-callbacks.
"""
from __future__ import annotations

from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.registry import register_pass
from worker.engine.plugins.engine import run_stage
from worker.engine.plugins.filters import BANDS, FILTERS, Band

STAGES = tuple(band.stage for band in BANDS)


def _register(band: Band) -> None:
    first, last = band is BANDS[0], band is BANDS[-1]
    extra = "; pre-callbacks first" if first else "; post-callbacks last" if last else ""

    def stage(ctx: PassContext) -> PassResult:
        return run_stage(ctx, band, before=FILTERS.callbacks("pre") if first else (),
                         after=FILTERS.callbacks("post") if last else ())

    register_pass(name=band.stage, kind=PassKind.PROGRAM, level=0,
                  description=f"plugin filters of priority {band.low}-{band.high - 1}, {band.runs}{extra}")(stage)


for _band in BANDS:
    _register(_band)
