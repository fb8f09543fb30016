"""Generate a Llama-architecture decoder with random fp16 weights in external data, tensor by tensor.

The graph is what a TorchScript export of ``LlamaForCausalLM`` looks like (no KV cache): an embedding Gather,
per layer an RMSNorm chain (Cast to float, Pow, ReduceMean, Add eps, Sqrt, Div, Mul, Cast back, Mul by the
weight), q/k/v projections as MatMuls with transposed weights, rotary embedding by slices of cached cos/sin
tables and rotate-half (Slice, Neg, Concat), grouped-query repeat_kv (Unsqueeze, Expand, Reshape), scaled
attention (MatMul, Div, Add of a causal mask, Softmax in float, MatMul), the output projection and a SiLU MLP
(Sigmoid, Mul, Mul, MatMul), residual Adds, a final RMSNorm and the lm_head MatMul. Batch and sequence are
dynamic.

The weights go straight to one data file (``<output>.data``) at page-aligned offsets named in each tensor's
external data fields; at most one tensor (in blocks of ``--block-mb``) is in memory at a time, so a 13 GB
model is written in bounded memory. Values are random fp16 bit patterns with the exponent masked to a small
range (no inf or nan, magnitudes below 1/16), seeded, so they neither compress nor repeat.

Defaults are the 7B class (Llama-2-7B shapes with GQA: 32 layers, hidden 4096, 32 heads of which 8 key/value
heads, intermediate 11008, vocabulary 32000: about 13 GB). Small ones for tests:
``python bench/make_llama.py OUT.onnx --layers 2 --hidden 256 --heads 8 --kv-heads 2 --intermediate 688 --vocab 1000``

Usage: python bench/make_llama.py OUT.onnx [--layers N] [--hidden N] [--heads N] [--kv-heads N]
[--intermediate N] [--vocab N] [--max-positions N] [--seed N]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ALIGN = 4096
FP16 = TensorProto.FLOAT16


class DataWriter:
    """Appends tensors to the data file at page-aligned offsets; returns the TensorProto that names them."""

    def __init__(self, path: Path, rng: np.random.Generator, block_bytes: int):
        self.path, self.rng, self.block_bytes = path, rng, block_bytes
        self.file = open(path, "wb")
        self.offset = 0

    def close(self) -> None:
        self.file.close()

    def tensor(self, name: str, dims: list[int], fill: str = "random") -> TensorProto:
        count = int(np.prod(dims, dtype=np.int64))
        nbytes = count * 2
        start = (self.offset + ALIGN - 1) // ALIGN * ALIGN
        if start != self.offset:
            self.file.write(b"\0" * (start - self.offset))
        remaining = count
        per_block = self.block_bytes // 2
        while remaining:
            n = min(remaining, per_block)
            self.file.write(self._block(n, fill))
            remaining -= n
        self.offset = start + nbytes
        tensor = TensorProto(name=name, data_type=FP16, dims=dims, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.path.name), ("offset", str(start)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    def _block(self, n: int, fill: str) -> bytes:
        if fill == "ones":
            return np.full(n, 0x3C00, dtype=np.uint16).tobytes()  # fp16 1.0
        bits = np.frombuffer(self.rng.bytes(2 * n), dtype=np.uint16)
        # keep the sign and mantissa and the low three exponent bits, then lift the exponent by 3: biased
        # exponents 3..10, magnitudes from 2^-12 to just under 2^-4; never inf or nan
        return ((bits & np.uint16(0x9FFF)) + np.uint16(3 << 10)).tobytes()


def rotary_tables(max_positions: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    freqs = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float16), np.sin(emb).astype(np.float16)


class Builder:
    def __init__(self, args: argparse.Namespace, data: DataWriter):
        self.args, self.data = args, data
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.counter = 0

    def op(self, op_type: str, inputs: list[str], prefix: str, **attrs) -> str:
        self.counter += 1
        out = f"/{prefix}/{op_type}_{self.counter}_output_0"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"/{prefix}/{op_type}_{self.counter}",
                                           **attrs))
        return out

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(onnx.numpy_helper.from_array(array, name))
        return name

    def weight(self, name: str, dims: list[int], fill: str = "random") -> str:
        self.initializers.append(self.data.tensor(name, dims, fill))
        return name

    def rms_norm(self, x: str, weight: str, prefix: str) -> str:
        xf = self.op("Cast", [x], prefix, to=TensorProto.FLOAT)
        sq = self.op("Pow", [xf, "two"], prefix)
        mean = self.op("ReduceMean", [sq], prefix, axes=[-1], keepdims=1)
        var = self.op("Add", [mean, "eps"], prefix)
        root = self.op("Sqrt", [var], prefix)
        inv = self.op("Div", ["one", root], prefix)
        normed = self.op("Mul", [xf, inv], prefix)
        back = self.op("Cast", [normed], prefix, to=FP16)
        return self.op("Mul", [weight, back], prefix)

    def rotate(self, x: str, cos: str, sin: str, prefix: str) -> str:
        first = self.op("Slice", [x, "zero_1d", "half_1d", "three_1d", "one_1d"], prefix)
        second = self.op("Slice", [x, "half_1d", "int_max_1d", "three_1d", "one_1d"], prefix)
        neg = self.op("Neg", [second], prefix)
        rotated = self.op("Concat", [neg, first], prefix, axis=-1)
        return self.op("Add", [self.op("Mul", [x, cos], prefix), self.op("Mul", [rotated, sin], prefix)], prefix)

    def layer(self, i: int, hidden: str, cos: str, sin: str, mask: str) -> str:
        a = self.args
        head_dim = a.hidden // a.heads
        n_rep = a.heads // a.kv_heads
        p = f"model/layers.{i}"
        w = f"model.layers.{i}"
        normed = self.rms_norm(hidden, self.weight(f"{w}.input_layernorm.weight", [a.hidden], "ones"),
                               f"{p}/input_layernorm")
        att = f"{p}/self_attn"

        def heads(proj: str, count: str, out_dim: int) -> str:
            y = self.op("MatMul", [normed, self.weight(f"onnx::MatMul_{w}.self_attn.{proj}.weight",
                                                         [a.hidden, out_dim])], att)
            shaped = self.op("Reshape", [y, count], att)
            return self.op("Transpose", [shaped], att, perm=[0, 2, 1, 3])

        q = self.rotate(heads("q_proj", "q_shape", a.heads * head_dim), cos, sin, att)
        k = self.rotate(heads("k_proj", "kv_shape", a.kv_heads * head_dim), cos, sin, att)
        v = heads("v_proj", "kv_shape", a.kv_heads * head_dim)

        def repeat_kv(x: str) -> str:
            if n_rep == 1:
                return x
            unsq = self.op("Unsqueeze", [x, "two_1d"], att)
            expanded = self.op("Expand", [unsq, "rep_shape"], att)
            return self.op("Reshape", [expanded, "q_heads_shape"], att)

        k, v = repeat_kv(k), repeat_kv(v)
        kt = self.op("Transpose", [k], att, perm=[0, 1, 3, 2])
        scores = self.op("Div", [self.op("MatMul", [q, kt], att), "scale"], att)
        masked = self.op("Add", [scores, mask], att)
        probs = self.op("Cast", [self.op("Softmax", [self.op("Cast", [masked], att, to=TensorProto.FLOAT)], att,
                                         axis=-1)], att, to=FP16)
        context = self.op("Transpose", [self.op("MatMul", [probs, v], att)], att, perm=[0, 2, 1, 3])
        merged = self.op("Reshape", [context, "hidden_shape"], att)
        attn_out = self.op("MatMul", [merged, self.weight(f"onnx::MatMul_{w}.self_attn.o_proj.weight",
                                                          [a.hidden, a.hidden])], att)
        hidden = self.op("Add", [hidden, attn_out], p)
        normed = self.rms_norm(hidden, self.weight(f"{w}.post_attention_layernorm.weight", [a.hidden], "ones"),
                               f"{p}/post_attention_layernorm")
        mlp = f"{p}/mlp"
        gate = self.op("MatMul", [normed, self.weight(f"onnx::MatMul_{w}.mlp.gate_proj.weight",
                                                      [a.hidden, a.intermediate])], mlp)
        silu = self.op("Mul", [gate, self.op("Sigmoid", [gate], mlp)], mlp)
        up = self.op("MatMul", [normed, self.weight(f"onnx::MatMul_{w}.mlp.up_proj.weight",
                                                    [a.hidden, a.intermediate])], mlp)
        down = self.op("MatMul", [self.op("Mul", [silu, up], mlp),
                                  self.weight(f"onnx::MatMul_{w}.mlp.down_proj.weight", [a.intermediate, a.hidden])],
                       mlp)
        return self.op("Add", [hidden, down], p)

    def build(self) -> onnx.ModelProto:
        a = self.args
        head_dim = a.hidden // a.heads
        n_rep = a.heads // a.kv_heads
        for name, value in (("two", np.array(2.0, np.float32)), ("one", np.array(1.0, np.float32)),
                            ("eps", np.array(1e-6, np.float32)),
                            ("scale", np.array(np.sqrt(head_dim), np.float16)),
                            ("zero_1d", np.array([0], np.int64)), ("one_1d", np.array([1], np.int64)),
                            ("two_1d", np.array([2], np.int64)), ("three_1d", np.array([3], np.int64)),
                            ("half_1d", np.array([head_dim // 2], np.int64)),
                            ("int_max_1d", np.array([np.iinfo(np.int64).max], np.int64)),
                            ("q_shape", np.array([0, 0, a.heads, head_dim], np.int64)),
                            ("kv_shape", np.array([0, 0, a.kv_heads, head_dim], np.int64)),
                            ("q_heads_shape", np.array([0, a.heads, -1, head_dim], np.int64)),
                            ("rep_shape", np.array([1, 1, n_rep, 1, 1], np.int64)),
                            ("hidden_shape", np.array([0, 0, a.hidden], np.int64)),
                            ("mask_min", np.array(np.finfo(np.float16).min, np.float16)),
                            ("mask_zero", np.array(0.0, np.float16))):
            self.const(name, value)
        cos_table, sin_table = rotary_tables(a.max_positions, head_dim)
        self.const("model.rotary_emb.cos_cached", cos_table)
        self.const("model.rotary_emb.sin_cached", sin_table)
        embed = self.weight("model.embed_tokens.weight", [a.vocab, a.hidden])
        p = "model"
        hidden = self.op("Gather", [embed, "input_ids"], f"{p}/embed_tokens")
        # sequence length, the rotary tables sliced to it and the causal mask
        shape = self.op("Shape", ["input_ids"], p)
        seq = self.op("Gather", [shape, "one_1d"], p, axis=0)
        cos = self.op("Slice", ["model.rotary_emb.cos_cached", "zero_1d", seq, "zero_1d"], f"{p}/rotary_emb")
        sin = self.op("Slice", ["model.rotary_emb.sin_cached", "zero_1d", seq, "zero_1d"], f"{p}/rotary_emb")
        cos = self.op("Unsqueeze", [cos, self.const("cos_axes", np.array([0, 1], np.int64))], f"{p}/rotary_emb")
        sin = self.op("Unsqueeze", [sin, "cos_axes"], f"{p}/rotary_emb")
        seq_scalar = self.op("Squeeze", [seq], p)
        positions = self.op("Range", [self.const("zero", np.array(0, np.int64)), seq_scalar,
                                      self.const("one_i", np.array(1, np.int64))], p)
        rows = self.op("Unsqueeze", [positions, "one_1d"], p)
        cols = self.op("Unsqueeze", [positions, "zero_1d"], p)
        future = self.op("Greater", [cols, rows], p)
        mask = self.op("Where", [future, "mask_min", "mask_zero"], p)
        for i in range(a.layers):
            started = time.perf_counter()
            hidden = self.layer(i, hidden, cos, sin, mask)
            if a.verbose:
                print(f"layer {i}: {time.perf_counter() - started:.1f} s", flush=True)
        normed = self.rms_norm(hidden, self.weight("model.norm.weight", [a.hidden], "ones"), f"{p}/norm")
        logits = self.op("MatMul", [normed, self.weight("onnx::MatMul_lm_head.weight", [a.hidden, a.vocab])],
                         "lm_head")
        self.nodes[-1].output[0] = "logits"
        graph = helper.make_graph(
            self.nodes, "main_graph",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
            [helper.make_tensor_value_info("logits", FP16, ["batch_size", "sequence_length", a.vocab])],
            self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", a.opset)],
                                  producer_name="mirserve-bench", producer_version="make_llama")
        model.ir_version = 8
        return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the .onnx file; its weights go to OUTPUT.data beside it")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--max-positions", type=int, default=2048)
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-mb", type=int, default=64, help="random data is made this much at a time")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.hidden % args.heads or args.heads % args.kv_heads or (args.hidden // args.heads) % 2:
        parser.error("--hidden must split into --heads of even size, and --heads into --kv-heads groups")
    out = Path(args.output)
    data = DataWriter(out.with_name(out.name + ".data"), np.random.default_rng(args.seed), args.block_mb << 20)
    started = time.perf_counter()
    try:
        model = Builder(args, data).build()
    finally:
        data.close()
    with open(out, "wb") as f:
        f.write(model.SerializeToString())
    params = data.offset // 2
    print(f"{out}: {len(model.graph.node)} nodes, {os.path.getsize(out) / 1e6:.1f} MB graph + "
          f"{data.offset / 1e9:.2f} GB data ({params / 1e9:.2f} B fp16 values, with alignment), "
          f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
