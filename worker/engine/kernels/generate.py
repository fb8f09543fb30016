"""Generate the committed kernel tables (worker/engine/kernels/data/*.json).

    python -m worker.engine.kernels.generate            # rewrite every table
    python -m worker.engine.kernels.generate --check    # exit 1 if a committed table differs from what it would be

Where each table's facts come from:

- x86: onnxruntime's own CPU kernel registry (``get_all_opkernel_def``): op, domain, opset range and the
  element types of every type constraint, exactly as the installed onnxruntime reports them.
- host: onnx's schema registry, every op of the standard domains at every version: the reference fallback.
- arm, cuda, opencl, npu: the public operator-support lists cited in ``sources/<target>.toml``; ports come
  from the ONNX schemas of the ops those lists name.
- every target: the project's own-domain fused ops it can run and the cast ops (io_copy, calib, layout),
  as its source declares.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterable

from onnx import defs

from worker.engine.kernels import ports as P
from worker.engine.kernels.ops import (ACTIVATIONS, NHWC_ARITY, NHWC_PREFIX, NHWC_SLOTS, QLINEAR_FORMS, TRANSFORMER_OPS,
                                is_layout_agnostic,
                                nhwc_slots, qlinear_form)
from worker.engine.kernels.schema import ANY, SAME, PortSpec
from worker.engine.kernels.table import DATA_DIR

SOURCES_DIR = Path(__file__).parent / "sources"
OWN = "mirserve"
STANDARD_DOMAINS = ("", "ai.onnx.ml")
ORT_OPEN = 2147483647
HOST_MEMORY_TARGETS = ("host", "x86", "arm")


# --- schemas --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _onnx_history() -> dict[tuple[str, str], list]:
    history: dict[tuple[str, str], list] = {}
    for schema in defs.get_all_schemas_with_history():
        history.setdefault((schema.name, schema.domain), []).append(schema)
    return {key: sorted(found, key=lambda s: s.since_version) for key, found in history.items()}


def schema_ranges(op: str, domain: str = "") -> list[tuple[int, int | None, P.OpSignature]]:
    """(since, until, signature) of every live version of a standard op; deprecated versions end a range."""
    versions = _onnx_history().get((op, domain), [])
    ranges = []
    for index, schema in enumerate(versions):
        if schema.deprecated:
            continue
        until = versions[index + 1].since_version - 1 if index + 1 < len(versions) else None
        ranges.append((schema.since_version, until, P.signature(schema)))
    return ranges


@functools.lru_cache(maxsize=None)
def _ort_schemas() -> dict[tuple[str, str], list]:
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    found: dict[tuple[str, str], list] = {}
    for schema in C.get_all_operator_schema():
        found.setdefault((schema.name, schema.domain), []).append(schema)
    return {key: sorted(v, key=lambda s: s.since_version) for key, v in found.items()}


def signature_at(op: str, domain: str, version: int) -> P.OpSignature | None:
    """The signature of ``op`` as of opset ``version``: onnx's schema, else onnxruntime's (contrib ops)."""
    for since, until, sig in schema_ranges(op, domain):
        if since <= version and (until is None or version <= until):
            return sig
    candidates = [s for s in _ort_schemas().get((op, domain), []) if s.since_version <= version]
    return P.signature(candidates[-1]) if candidates else None


# --- entries --------------------------------------------------------------------------------------------
def entry(op: str, domain: str, since: int, until: int | None, precision: str, layout: str,
          inputs: Iterable[PortSpec], outputs: Iterable[PortSpec], origin: str, *, variant: str = "",
          types: Iterable[str] | None = None, constraints: dict | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"op": op, "domain": domain, "since": since, "until": until,
                            "precision": precision, "layout": layout}
    if variant:
        data["variant"] = variant
    if types is not None:
        data["types"] = sorted(types)
    data["inputs"] = [p.to_dict() for p in inputs]
    data["outputs"] = [p.to_dict() for p in outputs]
    if constraints:
        data["constraints"] = constraints
    data["origin"] = origin
    return data


def kernel_layout(op: str, domain: str, layout: str) -> str:
    return ANY if is_layout_agnostic(op, domain) else layout


def layout_slots(op: str, domain: str, layout: str):
    return nhwc_slots(op, domain) if layout == "nhwc" else None


def _merged_ranges(ranges: list[tuple[int, int | None, Any]]) -> list[tuple[int, int | None, Any]]:
    """Join adjacent ranges whose payload is equal (ports unchanged between op versions)."""
    merged: list[tuple[int, int | None, Any]] = []
    for since, until, payload in ranges:
        if merged and merged[-1][2] == payload and merged[-1][1] is not None and merged[-1][1] + 1 == since:
            merged[-1] = (merged[-1][0], until, payload)
        else:
            merged.append((since, until, payload))
    return merged


# --- host -----------------------------------------------------------------------------------------------
def build_host() -> dict[str, Any]:
    kernels = []
    for domain in STANDARD_DOMAINS:
        names = sorted({op for (op, dom) in _onnx_history() if dom == domain})
        for op in names:
            kernels.extend(_host_op(op, domain))
    kernels.extend(own_domain_entries("host", _host_own_spec()))
    kernels.extend(_host_nhwc_forms())
    return {"target": "host", "source": HOST_SOURCE, "kernels": kernels}


def _host_nhwc_forms() -> list[dict]:
    """The NHWC forms (mirserve.Nhwc<Op>) of standard ops, so a model mirserve wrote can be placed again."""
    out = []
    for (op, domain), (in_slots, out_slots) in sorted(NHWC_SLOTS.items()):
        if domain:
            continue
        ranges = schema_ranges(op)
        sig = ranges[-1][2]
        required = sum(1 for f in sig.inputs if not f.optional)
        names = [f.name for f in sig.inputs][:NHWC_ARITY.get(op, required)]
        outputs = [f.name for f in sig.outputs][:max(out_slots) + 1]
        inputs = [PortSpec(n, SAME, SAME if i in in_slots else "nchw") for i, n in enumerate(names)]
        outs = [PortSpec(n, SAME, SAME if i in out_slots else "nchw") for i, n in enumerate(outputs)]
        out.append(entry(NHWC_PREFIX + op, OWN, 1, None, ANY, "nhwc", inputs, outs,
                         "runs the NHWC form's function body (transposes around the standard op)"))
    return out


HOST_SOURCE = ("onnx's operator schema registry (onnx.defs.get_all_schemas_with_history, onnx "
               "1.23): every version of every op of the ai.onnx and ai.onnx.ml domains, with the element types "
               "each schema allows. The host target is the reference fallback (onnx.reference can run all of "
               "them), as Paddle-Lite's host kernels are for its targets.")


def _host_op(op: str, domain: str) -> list[dict]:
    out = []
    payloads = []
    for since, until, sig in schema_ranges(op, domain):
        primary = P.primary_param(sig, op)
        types = sig.params.get(primary, ()) if primary else ()
        payloads.append((since, until, (sig.key(), types, sig)))
    for since, until, (_, types, sig) in _merged_ranges([(s, u, p) for s, u, p in payloads]):
        concrete, rest = P.precisions_of_types(types)
        layout = kernel_layout(op, domain, "nchw")
        inputs, outputs = P.ports(sig, op, device=False)
        origin = f"onnx schema {domain + '.' if domain else ''}{op}-{since}"
        if not types:
            out.append(entry(op, domain, since, until, ANY, layout, inputs, outputs, origin))
            continue
        for precision in concrete:
            out.append(entry(op, domain, since, until, precision, layout, inputs, outputs, origin))
        if rest:
            out.append(entry(op, domain, since, until, ANY, layout, inputs, outputs, origin, types=rest))
    return out


def _host_own_spec() -> dict:
    return {
        "ops": [{"domain": OWN, "ops": ["ChannelShuffle", *_all_fused(), *TRANSFORMER_OPS], "precisions": ["any"],
                 "types": ["bfloat16", "double", "float", "float16"],
                 "origin": "runs the op's function body (standard ops) with the reference kernels"},
                {"domain": OWN, "ops": [f.name for f in QLINEAR_FORMS.values()], "precisions": ["int8"],
                 "origin": "runs the op's function body (DequantizeLinear, the float op, QuantizeLinear) with "
                           "the reference kernels"}],
        "casts": {"io_copy": "host memory", "calib": ["fp32>fp16", "fp16>fp32", "fp32>int8", "int8>fp32"],
                  "origin": "reference Identity / Cast / QuantizeLinear / DequantizeLinear / Transpose"},
    }


def _all_fused() -> list[str]:
    from worker.engine.kernels.ops import fused_op_names
    return fused_op_names()


# --- x86 (onnxruntime) ----------------------------------------------------------------------------------
X86_SOURCE = ("onnxruntime's CPU execution provider kernel registry, read with "
              "onnxruntime.capi.onnxruntime_pybind11_state.get_all_opkernel_def() from the installed "
              "onnxruntime ({version}); own-domain fused ops from onnxruntime's com.microsoft FusedConv and "
              "FusedGemm CPU kernels, whose activation attribute takes Relu, Tanh, Sigmoid, LeakyRelu, "
              "HardSigmoid and Clip (MLAS activation kinds).")


def build_x86() -> dict[str, Any]:
    import onnxruntime
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    grouped: dict[tuple, list[dict]] = {}
    for kdef in C.get_all_opkernel_def():
        if kdef.provider != "CPUExecutionProvider":
            continue
        since, end = kdef.version_range
        key = (kdef.domain, kdef.op_name, since, None if end >= ORT_OPEN else end)
        grouped.setdefault(key, []).append(dict(kdef.type_constraints))
    kernels = []
    for key in sorted(grouped, key=lambda k: (k[0], k[1], k[2])):
        kernels.extend(_x86_entries(*key, grouped[key]))
    spec = _x86_own_spec()
    kernels.extend(own_domain_entries("x86", spec))
    kernels.extend(derived_fused_entries("x86", kernels))
    return {"target": "x86", "source": X86_SOURCE.format(version=onnxruntime.__version__), "kernels": kernels}


def _x86_entries(domain: str, op: str, since: int, until: int | None, kdefs: list[dict]) -> list[dict]:
    sig = signature_at(op, domain, since)
    if sig is None:
        return []
    primary = P.primary_param(sig, op)
    by_precision: dict[str, dict[str, list[str]]] = {}
    for constraints in kdefs:
        names = {p: [n for n in (P.element_name(t) for t in ts) if n] for p, ts in constraints.items()}
        primary_types = names.get(primary) or list(sig.params.get(primary, ())) if primary else []
        concrete, rest = P.precisions_of_types(primary_types)
        for precision in concrete + ([ANY] if rest or not primary_types else []):
            slot = by_precision.setdefault(precision, {})
            for param, types in names.items():
                # a registration of one precision (and types without one, the ``any`` kernel's) is split by
                # precision; a type-generic one (Concat, Transpose, Slice over every type) is one ``any``
                # kernel over all of its types
                if param == primary and concrete:
                    types = [t for t in types if (P.TYPE_PRECISION.get(t, ANY) == precision)]
                slot.setdefault(param, [])
                slot[param].extend(t for t in types if t not in slot[param])
    out = []
    origin = f"onnxruntime CPUExecutionProvider {domain + '.' if domain else ''}{op} [{since}, {until or 'open'}]"
    layout = kernel_layout(op, domain, "nchw")
    for precision in sorted(by_precision):
        params = by_precision[precision]
        inputs, outputs = P.ports(sig, op, device=False, param_types={k: v for k, v in params.items() if v})
        types = params.get(primary) if precision == ANY and primary and params.get(primary) else None
        out.append(entry(op, domain, since, until, precision, layout, inputs, outputs, origin, types=types))
    return out


def _x86_own_spec() -> dict:
    acts = ["Relu", "Tanh", "Sigmoid", "LeakyRelu", "HardSigmoid", "Relu6"]
    return {
        "ops": [
            {"domain": OWN, "ops": [f"FusedConv{a}" for a in acts], "precisions": ["fp32"],
             "origin": "onnxruntime com.microsoft.FusedConv CPU kernel (Clip covers Relu6)"},
            {"domain": OWN, "ops": [f"FusedGemm{a}" for a in acts], "precisions": ["fp32"],
             "origin": "onnxruntime com.microsoft.FusedGemm CPU kernel (Clip covers Relu6)"},
            {"domain": OWN, "ops": list(TRANSFORMER_OPS), "precisions": ["fp32"],
             "origin": "onnxruntime inlines the op's function body (standard ops its CPU provider runs)"},
            {"domain": OWN, "ops": ["QLinearConv", "QLinearMatMul"], "precisions": ["int8"],
             "origin": "onnxruntime QLinearConv / QLinearMatMul CPU kernels (the float bias quantized to int32)"},
            {"domain": OWN, "ops": ["QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearSigmoid",
                                    "QLinearSoftmax"],
             "precisions": ["int8"],
             "origin": "onnxruntime com.microsoft QLinearAdd / QLinearMul / QLinearGlobalAveragePool / "
                       "QLinearSigmoid / QLinearSoftmax CPU kernels"},
        ],
        "casts": {"io_copy": "host memory", "calib": ["fp32>fp16", "fp16>fp32", "fp32>int8", "int8>fp32"],
                  "origin": "onnxruntime CPU Cast, QuantizeLinear, DequantizeLinear and Transpose kernels"},
    }


# --- targets described by public support lists ---------------------------------------------------------
def load_source(target: str) -> dict:
    path = SOURCES_DIR / f"{target}.toml"
    with path.open("rb") as handle:
        return tomllib.load(handle)


def build_from_source(target: str) -> dict[str, Any]:
    spec = load_source(target)
    kernels = []
    for row in spec.get("kernels", []):
        if row.get("domain", "") == OWN:
            continue
        for op in row["ops"]:
            kernels.extend(_standard_entries(target, op, row))
    kernels.extend(own_domain_entries(target, {"ops": [r for r in spec.get("kernels", [])
                                                       if r.get("domain", "") == OWN],
                                               "casts": spec.get("casts", {})}))
    kernels.extend(derived_fused_entries(target, kernels, set(spec.get("underived", []))))
    return {"target": target, "source": spec["source"].strip(), "kernels": kernels}


def _standard_entries(target: str, op: str, row: dict) -> list[dict]:
    domain = row.get("domain", "")
    ranges = schema_ranges(op, domain)
    if not ranges:
        raise ValueError(f"sources/{target}.toml names {op!r}, which is not an op of domain {domain!r}")
    low, high = row.get("since", 1), row.get("until")
    device = target not in HOST_MEMORY_TARGETS
    out = []
    for layout in row.get("layouts", ["nchw"]):
        slots = layout_slots(op, domain, layout)
        if layout == "nhwc" and slots is None:
            raise ValueError(f"sources/{target}.toml gives {op} an nhwc kernel, but {op} has no NHWC form")
        clipped = []
        for since, until, sig in ranges:
            since2, until2 = max(since, low), _min_until(until, high)
            if until2 is not None and until2 < since2:
                continue
            clipped.append((since2, until2, sig))
        for since, until, sig in _merged_ranges([(s, u, sig) for s, u, sig in clipped]):
            inputs, outputs = P.ports(sig, op, device=device, layout_slots=slots)
            for precision in row["precisions"]:
                out.append(entry(op, domain, since, until, precision, kernel_layout(op, domain, layout),
                                 inputs, outputs, row["origin"], types=row.get("types"),
                                 constraints=row.get("constraints")))
    return _dedupe_agnostic(out)


def _dedupe_agnostic(entries: list[dict]) -> list[dict]:
    """Layout-agnostic ops listed under several layouts collapse to their single ``any`` kernel."""
    seen, out = set(), []
    for item in entries:
        key = (item["op"], item["since"], item["until"], item["precision"], item["layout"])
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _min_until(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


# --- own domain: fused ops and casts --------------------------------------------------------------------
def _own_signature(op: str) -> tuple[list[str], list[str], set[int]]:
    """Formal inputs, outputs and optional input slots of an own-domain op."""
    if op == "ChannelShuffle":
        return ["X"], ["Y"], set()
    if op in TRANSFORMER_OPS:
        inputs, outputs = TRANSFORMER_OPS[op]
        return list(inputs), list(outputs), set()
    form = qlinear_form(op)
    if form is not None:
        inputs = list(form.inputs)
        return inputs, [form.output], {len(inputs) - 1} if form.bias else set()
    for base, inputs, optional in (("FusedConvTranspose", ["X", "W", "B"], {2}), ("FusedConv", ["X", "W", "B"], {2}),
                                   ("FusedGemm", ["A", "B", "C"], {2}), ("FusedMatMul", ["A", "B"], set()),
                                   ("FusedAdd", ["A", "B"], set())):
        if op.startswith(base) and op[len(base):] in ACTIVATIONS:
            return inputs, ["C" if base == "FusedAdd" else "Y"], optional
    raise ValueError(f"unknown own-domain op {op!r}")


def own_domain_entries(target: str, spec: dict) -> list[dict]:
    out = []
    for row in spec.get("ops", []):
        for op in row["ops"]:
            names, outputs, optional = _own_signature(op)
            for layout in row.get("layouts", ["nchw"]):
                slots = layout_slots(op, OWN, layout)
                if layout == "nhwc" and slots is None:
                    raise ValueError(f"{target}: {op} has no NHWC form")
                follows_in = slots[0] if slots else range(len(names))
                follows_out = slots[1] if slots else range(len(outputs))
                form = qlinear_form(op)
                inputs = [PortSpec(n, form.input_precision(i) if form else SAME, SAME if i in follows_in else "nchw",
                               optional=i in optional) for i, n in enumerate(names)]
                outs = [PortSpec(n, SAME, SAME if i in follows_out else "nchw") for i, n in enumerate(outputs)]
                for precision in row["precisions"]:
                    out.append(entry(op, OWN, 1, None, precision, kernel_layout(op, OWN, layout), inputs,
                                     outs, row["origin"], types=row.get("types"),
                                     constraints=row.get("constraints")))
    out = _dedupe_agnostic(out)
    out.extend(cast_entries(target, spec.get("casts", {})))
    return out


# --- own domain: fused ops derived from their bodies ------------------------------------------------------
#: The opset whose body of each fused op the derivation reads: from 15 a body's numbers are CastLike'd
#: constants (no EyeLike / Gemm scaffolding), and every activation is written with its own op where ONNX has
#: one. The bodies of other opsets compute the same function, so a target that runs this one runs the op.
DERIVE_OPSET = 17
_FLOAT_ELEMENT = {"fp32": "float", "fp16": "float16"}


def body_compute_ops(op: str, opset: int = DERIVE_OPSET) -> list[str]:
    """The ops of ``op``'s function body that compute on its data, in body order: every node except those
    that only make constants or shapes (Constant, Shape, and anything whose inputs are all constants or
    shapes: ChannelShuffle's Gather/Div/Concat of its input's shape; CastLike takes only the type of its
    second input, so a CastLike of a constant is a constant too)."""
    from worker.engine.mirserve_domain.fused import SPECS

    constant: set[str] = set()
    found = []
    for node in SPECS[op].body(opset).nodes:
        reads = list(node.input)[:1] if node.op_type == "CastLike" else [n for n in node.input if n]
        if node.op_type == "Shape" or all(name in constant for name in reads):
            constant.update(node.output)
        else:
            found.append(node.op_type)
    return found


def _covers(item: dict, opset: int) -> bool:
    return item["since"] <= opset and (item["until"] is None or opset <= item["until"])


def _runs(item: dict, op: str, precision: str, layout: str) -> bool:
    """Whether a standard-op entry computes ``op`` in ``precision`` (float data) and ``layout``."""
    if item["op"] != op or item["domain"] != "" or not _covers(item, DERIVE_OPSET):
        return False
    if item["layout"] not in (layout, ANY):
        return False
    if item["precision"] == precision:
        return True
    return item["precision"] == ANY and (item.get("types") is None or _FLOAT_ELEMENT[precision] in item["types"])


def _carried_constraints(constraints: dict | None, op: str) -> dict | None:
    """A base kernel's constraints as they apply to the fused op: an attribute the fused op does not carry
    (auto_pad: a fusion writes explicit pads) is no constraint on it."""
    from worker.engine.mirserve_domain.ops import get_op

    if not constraints:
        return None
    own = get_op(op)
    carried = set(own.attributes) if own is not None else set()
    out = {k: v for k, v in constraints.items() if k != "attributes"}
    attributes = {k: v for k, v in (constraints.get("attributes") or {}).items() if k in carried}
    if attributes:
        out["attributes"] = attributes
    return out or None


def derived_fused_entries(target: str, kernels: list[dict], underived: set[str] = frozenset()) -> list[dict]:
    """Kernels of the ``mirserve`` ops defined by a function body of float ops (ChannelShuffle,
    Fused<Base><Activation> and the transformer ops Gelu, GeluTanh, RMSNorm, ScaledDotProductAttention) that
    ``target`` runs because its table runs every op of their body: one per kernel of the base op (the body's
    first: Reshape, Conv, Gemm, MatMul, ...) in a
    float precision and a layout where every other op of the body has a kernel too, with that base kernel's
    constraints.

    The table says otherwise in two ways: an explicit entry for (op, precision, layout) in the target's source
    stands and nothing is derived for that slot, and ``underived`` (the source's ``underived`` list) names
    fused ops the target must not claim although it runs their bodies.
    """
    from worker.engine.kernels.ops import fused_op_names

    declared = {(k["op"], k["precision"], k["layout"]) for k in kernels if k["domain"] == OWN}
    rows = []
    for op in ["ChannelShuffle", *fused_op_names(), *TRANSFORMER_OPS]:
        if op in underived:
            continue
        compute = body_compute_ops(op)
        base, rest = compute[0], compute[1:]
        layouts = ("nchw", "nhwc") if nhwc_slots(op, OWN) is not None else ("nchw",)
        for precision in ("fp32", "fp16"):
            for layout in layouts:
                if (op, precision, kernel_layout(op, OWN, layout)) in declared:
                    continue
                if not all(any(_runs(k, other, precision, layout) for k in kernels) for other in rest):
                    continue
                seen = []
                for item in kernels:
                    if not _runs(item, base, precision, layout):
                        continue
                    constraints = _carried_constraints(item.get("constraints"), op)
                    if constraints in seen:
                        continue
                    seen.append(constraints)
                    row = {"domain": OWN, "ops": [op], "precisions": [precision], "layouts": [layout],
                           "origin": f"derived: {target} runs every op of the function body "
                                     f"({', '.join(compute)}) in {precision} {layout}"}
                    if constraints:
                        row["constraints"] = constraints
                    rows.append(row)
    out = own_domain_entries(target, {"ops": rows})
    # a layout-agnostic op's nchw and nhwc rows collapse to one ``any`` kernel; variants keep distinct slots
    return _distinct_slots(out)


def _distinct_slots(entries: list[dict]) -> list[dict]:
    seen, out = set(), []
    for item in entries:
        key = (item["op"], item["precision"], item["layout"], json.dumps(item.get("constraints"), sort_keys=True))
        if key not in seen:
            seen.add(key)
            out.append(item)
    by_slot: dict[tuple, int] = {}
    for item in out:
        slot = (item["op"], item["precision"], item["layout"])
        by_slot[slot] = by_slot.get(slot, 0) + 1
        if by_slot[slot] > 1:
            item["variant"] = f"derived{by_slot[slot]}"
    return out


#: The ``to`` attribute (ONNX element type) of a calib producing each precision.
CALIB_TO = {"fp16": [10], "fp32": [1], "int8": [2, 3]}


def cast_entries(target: str, casts: dict) -> list[dict]:
    """io_copy, calib and layout kernels: Paddle-Lite's cast kernels, one variant per direction."""
    if not casts:
        return []
    origin = casts.get("origin", "cast kernels")
    out = []
    same = [PortSpec("X", SAME, SAME)], [PortSpec("Y", SAME, SAME)]
    if casts.get("io_copy") == "host memory":
        out.append(entry("io_copy", OWN, 1, None, ANY, ANY, *same, origin))
    elif casts.get("io_copy"):
        io_origin = casts["io_copy"]
        out.append(entry("io_copy", OWN, 1, None, ANY, ANY, [PortSpec("X", SAME, SAME, "host")],
                         [PortSpec("Y", SAME, SAME)], io_origin, variant="host_to_device"))
        out.append(entry("io_copy", OWN, 1, None, ANY, ANY, [PortSpec("X", SAME, SAME)],
                         [PortSpec("Y", SAME, SAME, "host")], io_origin, variant="device_to_host"))
    for direction in casts.get("calib", []):
        source, dest = direction.split(">")
        precision = dest if source == "fp32" else source
        out.append(entry("calib", OWN, 1, None, precision, ANY, [PortSpec("X", source, SAME)],
                         [PortSpec("Y", dest, SAME)], origin, variant=f"{source}_to_{dest}",
                         constraints={"attributes": {"to": CALIB_TO[dest]}}))
    for source, dest, perm in (("nchw", "nhwc", [0, 2, 3, 1]), ("nhwc", "nchw", [0, 3, 1, 2])):
        out.append(entry("layout", OWN, 1, None, ANY, dest, [PortSpec("X", SAME, source)], [PortSpec("Y", SAME, dest)],
                         casts.get("layout_origin", origin), variant=f"{source}_to_{dest}",
                         constraints={"attributes": {"perm": [perm]}}))
    return out


# --- driver ---------------------------------------------------------------------------------------------
SOURCE_TARGETS = ("arm", "cuda", "opencl", "npu")
BUILDERS = {"host": build_host, "x86": build_x86,
            **{t: functools.partial(build_from_source, t) for t in SOURCE_TARGETS}}


def render(table: dict) -> str:
    return json.dumps(table, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the kernel tables under worker/engine/kernels/data.")
    parser.add_argument("targets", nargs="*", help="targets to generate (default: all)")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a table differs")
    args = parser.parse_args(argv)
    stale = []
    for target in args.targets or list(BUILDERS):
        if target not in BUILDERS:
            parser.error(f"unknown target {target!r}; known: {', '.join(BUILDERS)}")
        text = render(BUILDERS[target]())
        path = DATA_DIR / f"{target}.json"
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(target)
            continue
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        print(f"{path}: {len(json.loads(text)['kernels'])} kernels")
    if stale:
        print(f"stale kernel tables: {', '.join(stale)}; run python -m worker.engine.kernels.generate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
