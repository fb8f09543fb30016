"""Protocol-buffer wire format, just enough to keep weights out of the protobuf parser.

``onnx.load`` reads the whole file into bytes and parses it, which holds the weights twice at its peak; its
``save`` serializes to one more bytes object. We instead scan the file's wire format, parse everything *but*
the large ``raw_data`` payloads of the top-level initializers, and map those payloads from the file with
``mmap``. On save, the small part is serialized by protobuf and the payloads are spliced back in as they are
written. The protobuf encoding rules used here are the public ones: varint tags ``field << 3 | wire_type``,
length-delimited fields, and "a repeated or message field may appear several times, in any order".
"""
from __future__ import annotations

from dataclasses import dataclass

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5

# Field numbers from onnx.proto.
MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
TENSOR_DATA_TYPE = 2
TENSOR_RAW_DATA = 9
TENSOR_DATA_LOCATION = 14


class WireError(ValueError):
    """The bytes are not a well-formed protocol buffer."""


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_tag(field: int, wire_type: int) -> bytes:
    return encode_varint(field << 3 | wire_type)


def len_field_header(field: int, length: int) -> bytes:
    return encode_tag(field, LEN) + encode_varint(length)


@dataclass(frozen=True)
class Field:
    number: int
    wire_type: int
    start: int  # where the tag begins
    value_start: int  # payload start (LEN) or varint value position
    end: int  # one past the field
    value: int = 0  # the integer of a VARINT field


def iter_fields(buf, start: int, end: int):
    """Yield the fields of the message encoded in ``buf[start:end]``."""
    pos = start
    while pos < end:
        tag, after_tag = read_varint(buf, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire_type == VARINT:
            value, after = read_varint(buf, after_tag, end)
            yield Field(number, wire_type, pos, after_tag, after, value)
        elif wire_type == LEN:
            length, payload = read_varint(buf, after_tag, end)
            after = payload + length
            if after > end:
                raise WireError(f"field {number} at byte {pos} runs past the end of its message")
            yield Field(number, wire_type, pos, payload, after)
        elif wire_type == FIXED64:
            after = after_tag + 8
            if after > end:
                raise WireError("truncated fixed64")
            yield Field(number, wire_type, pos, after_tag, after)
        elif wire_type == FIXED32:
            after = after_tag + 4
            if after > end:
                raise WireError("truncated fixed32")
            yield Field(number, wire_type, pos, after_tag, after)
        else:
            raise WireError(f"unsupported wire type {wire_type} at byte {pos}")
        pos = after


@dataclass(frozen=True)
class RawSpan:
    """Where an initializer's raw_data payload lies in the file."""

    offset: int
    length: int


def strip_initializer_payloads(buf, min_bytes: int) -> tuple[bytes, dict[int, RawSpan]]:
    """Re-encode a ModelProto without the raw_data of top-level initializers of ``min_bytes`` or more.

    Returns the stripped message and, for each stripped initializer (by its index among the graph's
    initializers), the span of its payload in ``buf``. Everything else is copied verbatim.
    """
    end = len(buf)
    out = bytearray()
    spans: dict[int, RawSpan] = {}
    for field in iter_fields(buf, 0, end):
        if field.number == MODEL_GRAPH and field.wire_type == LEN:
            graph = _strip_graph(buf, field.value_start, field.end, min_bytes, spans)
            out += len_field_header(MODEL_GRAPH, len(graph))
            out += graph
        else:
            out += buf[field.start:field.end]
    return bytes(out), spans


def _strip_graph(buf, start: int, end: int, min_bytes: int, spans: dict[int, RawSpan]) -> bytearray:
    out = bytearray()
    index = 0
    for field in iter_fields(buf, start, end):
        if field.number == GRAPH_INITIALIZER and field.wire_type == LEN:
            tensor, span = _strip_tensor(buf, field.value_start, field.end, min_bytes)
            if span is not None:
                spans[index] = span
            out += len_field_header(GRAPH_INITIALIZER, len(tensor))
            out += tensor
            index += 1
        else:
            out += buf[field.start:field.end]
    return out


def _strip_tensor(buf, start: int, end: int, min_bytes: int) -> tuple[bytes, RawSpan | None]:
    raw = None
    for field in iter_fields(buf, start, end):
        if field.number == TENSOR_RAW_DATA and field.wire_type == LEN:
            raw = field
    if raw is None or raw.end - raw.value_start < min_bytes:
        return bytes(buf[start:end]), None
    kept = bytearray()
    for field in iter_fields(buf, start, end):
        if field is not raw and not (field.number == TENSOR_RAW_DATA and field.wire_type == LEN):
            kept += buf[field.start:field.end]
    return bytes(kept), RawSpan(raw.value_start, raw.end - raw.value_start)
