"""Concrete input shapes for a model with dynamic dims, for verification and the memory plan: which value each
dim the user left open takes, without flags.

A dim is known by its symbolic name when it has one (a name shared by several inputs takes one value: the
batch of ``input_ids`` and ``attention_mask``), else by its input and axis. Each gets a role, from its name
first (``batch_size``, ``seq_len``, ``height``), then from its position (axis 0 of a tensor of rank 2 or more
is a batch; axes 2 and 3 of a rank-4 tensor, or 1 and 2 with 1, 3 or 4 channels last, are spatial; axis 1 of
integer ids or of a rank-3 float tensor is a sequence; axis 1 of a rank-2 float tensor is audio samples, the
[batch, samples] of a waveform, whatever its name), and the role gives its values, tried level by level
until the model runs: batch 1 (and a second run at 2), sequences 16, 32, 64 (small multiples of 8),
spatial sizes 224, 320, 640 (multiples of 32: stride-friendly), unknown channels 3, audio 512, 1024 and 16000
samples (a voice-activity window at 16 kHz, a frame size, a second: an STFT's reflect padding and a
convolutional feature encoder need hundreds), anything else 1, 8, 16. A decoder's KV cache inputs
(``past_key_<i>``: (batch, heads, past, size)) have past 8, 16, 32 and their attention mask past + the new
positions (``_cache_roles``): the dims a model relates, which equal values per role could never satisfy.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

Dims = tuple  # of int | str | None: static, symbolic, unknown

#: Values of each role, level by level (the same level for every dim of one attempt).
ROLE_VALUES: dict[str, tuple[int, ...]] = {
    "batch": (1, 1, 1),
    "sequence": (16, 32, 64),
    "spatial": (224, 320, 640),
    "channels": (3, 3, 3),
    "samples": (512, 1024, 16000),
    "other": (1, 8, 16),
    # a decoder's cached positions, and its attention mask's length (computed: cached + new positions)
    "past": (8, 16, 32),
    "total": (0, 0, 0),
}
LEVELS = 3
#: The batch of the second verification run.
SECOND_BATCH = 2

_WORDS = {  # in the order they are tried: audio_length is samples before it is a length
    "samples": {"samples", "nsamples", "numsamples", "audio", "audiolength", "wav", "wave", "waveform", "pcm"},
    "batch": {"n", "b", "bs", "batch", "batchsize", "batches", "nbatch", "numimages", "images"},
    "sequence": {"seq", "seqlen", "sequence", "sequencelength", "len", "length", "tokens", "ntokens", "time",
                 "frames", "steps", "t", "l", "past", "pastlen", "total", "decoder", "encoder", "kv"},
    "spatial": {"h", "w", "height", "width", "rows", "cols", "columns", "img", "imgh", "imgw", "image",
                "imageheight", "imagewidth", "y", "x"},
    "channels": {"c", "channel", "channels", "ch"},
}


@dataclass(frozen=True)
class InputSpec:
    """A graph input as the runtime declares it: element type name ("float", "int64") and dims."""

    name: str
    element: str
    dims: Dims | None


@dataclass
class Dim:
    """One open dim: its key (symbolic name, or ``input[axis]``), role, and where it occurs."""

    key: str
    role: str
    where: list[tuple[str, int]] = field(default_factory=list)

    @property
    def label(self) -> str:
        """How a message names it: its symbolic name, or input and axis."""
        return self.key


def role_of_name(name: str) -> str | None:
    """The role a symbolic dim's name says, or None (``unk__3``, ``s0`` and the like say nothing)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    joined = "".join(words)
    for role, names in _WORDS.items():
        if joined in names or any(w in names and len(w) > 1 for w in words):
            return role
    if joined.startswith("batch"):
        return "batch"
    if any(w.startswith(("seq", "sequence", "token")) for w in words):
        return "sequence"
    if any(w.startswith(("height", "width")) for w in words):
        return "spatial"
    return None


def role_of_position(spec: InputSpec, axis: int) -> str:
    """The role an axis has by convention: NCHW / NHWC images, [batch, seq] ids, [batch, seq, hidden]."""
    dims = spec.dims or ()
    rank = len(dims)
    if axis == 0 and rank >= 2:
        return "batch"
    if rank == 4:
        channels_last = dims[3] in (1, 3, 4) and not (dims[1] in (1, 3, 4))
        if channels_last:
            return "spatial" if axis in (1, 2) else "channels"
        return "channels" if axis == 1 else "spatial"
    if rank == 5:
        return {1: "channels", 2: "sequence"}.get(axis, "spatial")
    if rank == 3 and axis == 1:
        return "sequence"
    if rank == 2 and axis == 1 and spec.element in ("float", "float16", "double", "bfloat16"):
        return "samples"
    if rank == 2 and axis == 1 and spec.element.startswith(("int", "uint")):
        return "sequence"
    return "other"


def open_dims(specs: Sequence[InputSpec], given: Mapping[str, Sequence[int]] = {}) -> list[Dim]:
    """Every dim no input declares and the user did not give, one per symbolic name."""
    found: dict[str, Dim] = {}
    for spec in specs:
        if spec.name in given or spec.dims is None:
            continue
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, int) and dim >= 0:
                continue
            named = isinstance(dim, str) and bool(dim)
            key = dim if named else f"{spec.name}[{axis}]"
            if key not in found:
                role = (role_of_name(dim) if named else None) or role_of_position(spec, axis)
                if role == "sequence" and role_of_position(spec, axis) == "samples":
                    role = "samples"  # wav2vec2's input_values [batch_size, sequence_length] is a waveform
                elif role == "samples" and axis == 0 and len(spec.dims) >= 2:
                    role = "batch"  # [samples, features]: a batch of samples, not audio
                found[key] = Dim(key, role)
            found[key].where.append((spec.name, axis))
    _cache_roles(list(found.values()), {spec.name: spec for spec in specs})
    return list(found.values())


def _cache_roles(dims: list[Dim], specs: Mapping[str, InputSpec]) -> None:
    """A decoder exported with its KV cache as inputs runs only where its attention mask covers the cached
    positions and the new ones: a dim found only at axis 2 of rank-4 inputs named past / cache (``past_key_0``
    (batch, heads, past, size)) is ``past``, and then a dim found only last of a rank-2 input named mask is
    ``total``, whose value is the past's plus the new tokens' (``assignment``)."""
    def only_at(dim: Dim, accept) -> bool:
        return all(accept(name.lower(), axis, len(specs[name].dims or ())) for name, axis in dim.where)

    past = [d for d in dims if only_at(d, lambda name, axis, rank: rank == 4 and axis == 2 and
                                       ("past" in name or "cache" in name))]
    if not past:
        return
    for dim in past:
        dim.role = "past"
    for dim in dims:
        if only_at(dim, lambda name, axis, rank: rank == 2 and axis == 1 and "mask" in name):
            dim.role = "total"


def assignment(dims: Iterable[Dim], level: int, batch: int | None = None) -> dict[str, int]:
    """The value of every open dim at ``level`` (batch dims at ``batch`` when given)."""
    dims = list(dims)
    values = {}
    at = min(level, LEVELS - 1)
    # the new positions beside a cache: the sequence's value when one is open, else one token (a decode step)
    new = ROLE_VALUES["sequence"][at] if any(d.role == "sequence" for d in dims) else 1
    for dim in dims:
        value = ROLE_VALUES[dim.role][at]
        if dim.role == "total":
            value = ROLE_VALUES["past"][at] + new
        values[dim.key] = batch if batch is not None and dim.role == "batch" else value
    return values


def shapes(specs: Sequence[InputSpec], given: Mapping[str, Sequence[int]], values: Mapping[str, int]
           ) -> dict[str, tuple[int, ...]]:
    """Each input's shape: the user's, else its declared dims with the open ones at ``values``."""
    found = {}
    for spec in specs:
        if spec.name in given:
            found[spec.name] = tuple(int(d) for d in given[spec.name])
            continue
        if spec.dims is None:
            raise ValueError(f"input {spec.name!r} declares no rank")
        found[spec.name] = tuple(
            d if isinstance(d, int) and d >= 0 else values[d if isinstance(d, str) and d else f"{spec.name}[{axis}]"]
            for axis, d in enumerate(spec.dims))
    return found


def first_choice(specs: Sequence[InputSpec], given: Mapping[str, Sequence[int]], *,
                 second_batch: bool = False) -> dict:
    """The first level's shapes, untried (no runtime at hand, or verification is off); with ``second_batch``,
    and the same at batch 2 when a dim is a batch, as ``numeric.choose_shapes`` would try them."""
    dims = open_dims(specs, given)
    values = assignment(dims, 0)
    first = {name: list(dims) for name, dims in shapes(specs, given, values).items()}
    found = [first]
    if second_batch and any(d.role == "batch" for d in dims):
        more = assignment(dims, 0, batch=SECOND_BATCH)
        found.append({name: list(dims) for name, dims in shapes(specs, given, more).items()})
    return {"shapes": found, "dims": values, "roles": {d.key: d.role for d in dims}, "tried": [],
            "checked": False}


def graph_specs(graph) -> list[InputSpec]:
    """The specs of a graph's inputs (initializers that are inputs too excluded), from inferred types."""
    from onnx import helper

    specs = []
    for value in graph.inputs:
        if value.is_initializer:
            continue
        try:
            element = helper.tensor_dtype_to_string(value.dtype).rpartition(".")[2].lower()
        except (KeyError, ValueError, TypeError):
            element = "float"
        specs.append(InputSpec(value.name, element, None if value.shape is None else tuple(value.shape)))
    return specs


def has_open_dims(specs: Sequence[InputSpec], given: Mapping[str, Sequence[int]]) -> bool:
    return bool(open_dims(specs, given)) or any(s.dims is None and s.name not in given for s in specs)


def describe_shapes(found: Mapping[str, Sequence[int]]) -> str:
    """``x=1x3x224x224, mask=1x16`` (a scalar input as ``x=scalar``)."""
    return ", ".join(f"{name}={'x'.join(str(d) for d in dims) or 'scalar'}" for name, dims in found.items())


def describe_values(dims: Sequence[Dim], values: Mapping[str, int]) -> str:
    """``batch=1 (batch), height=224 (spatial)``: the open dims and the values they took."""
    return ", ".join(f"{d.label}={values[d.key]} ({d.role})" for d in dims)
