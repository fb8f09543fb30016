"""Reading a Pad node whatever its opset: pads and value as attributes (before 11) or inputs (11+), with an
optional ``axes`` input (18+), and what keeps one from folding into the op after it. The conv and pool pad
fusions share it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.engine.ir import Node
from worker.engine.pattern import describe


@dataclass(frozen=True)
class PadSpec:
    mode: str
    begins: tuple[int, ...]  # one per dim of the padded tensor
    ends: tuple[int, ...]
    value: float | None  # None when the constant value is not known at optimization time

    def spatial(self) -> list[int]:
        """Pads on dims 2.. in the layout of Conv/pool ``pads``: all begins, then all ends."""
        return list(self.begins[2:]) + list(self.ends[2:])

    @property
    def touches_batch_or_channels(self) -> bool:
        return any(self.begins[:2]) or any(self.ends[:2])


def read_pad(node: Node, opset: int, rank: int) -> PadSpec | None:
    """The Pad's amounts and fill value, or None when the amounts are not constants."""
    mode = node.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if opset < 11:
        pads, value = node.attr("pads"), float(node.attr("value", 0.0))
    else:
        source = node.input(1)
        pads = None if source is None else source.constant_value()
        value = _fill_value(node)
    if pads is None:
        return None
    pads = [int(p) for p in np.reshape(pads, -1)]
    axes = _axes(node, rank) if opset >= 18 else list(range(rank))
    if axes is None or len(pads) != 2 * len(axes):
        return None
    begins, ends = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        begins[axis], ends[axis] = pads[i], pads[len(axes) + i]
    return PadSpec(mode, tuple(begins), tuple(ends), value)


def _fill_value(node: Node) -> float | None:
    source = node.input(2)
    if source is None:
        return 0.0
    data = source.constant_value()
    return None if data is None or data.size != 1 else float(np.reshape(data, -1)[0])


def _axes(node: Node, rank: int) -> list[int] | None:
    source = node.input(3)
    if source is None:
        return list(range(rank))
    data = source.constant_value()
    return None if data is None else [int(a) % rank for a in np.reshape(data, -1)]


def merged_pads(own: list[int] | None, extra: list[int]) -> list[int]:
    """A conv/pool ``pads`` attribute plus the spatial pads of a Pad before it."""
    own = list(own) if own else [0] * len(extra)
    return [a + b for a, b in zip(own, extra)]


def pad_refusal(pad, spec, consumer) -> str | None:
    """Refusals every pad fusion shares (the fill value is checked by the caller)."""
    if spec is None:
        return f"the amounts of {describe(pad)} are not constants"
    if spec.mode != "constant":
        return f"{describe(pad)} pads in {spec.mode!r} mode, and {describe(consumer)} can only pad with a constant"
    if spec.touches_batch_or_channels:
        return f"{describe(pad)} pads the batch or channel dim, which {describe(consumer)} cannot"
    if min(spec.begins + spec.ends) < 0:
        return f"{describe(pad)} crops (negative pads)"
    if consumer.attr("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID"):
        return f"{describe(consumer)} uses SAME auto-padding"
    return None
