"""A BERT-base-size encoder graph (12 layers, hidden 768, 12 heads, FFN 3072) built with onnx.helper.

The node pattern follows what torch.onnx exports for an unfused BertModel: LayerNorm and GELU decomposed,
reshape targets computed by Shape/Gather/Unsqueeze/Concat chains, so the graph has about a thousand nodes and
as many small shape tensors as a real export. Weights are graph inputs rather than initializers so the file
stays small; they are outside the arena either way, so the planning work is the same.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, outputs: int = 1, **attrs) -> str:
        outs = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs[0]

    def weight(self, hint: str, shape: list[int]) -> str:
        name = self.name(hint)
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name

    def const(self, hint: str, values: list, dtype=TensorProto.INT64) -> str:
        name = self.name(hint)
        self.initializers.append(helper.make_tensor(name, dtype, [len(values)], values))
        return name

    def scalar(self, hint: str, value: float) -> str:
        name = self.name(hint)
        self.initializers.append(helper.make_tensor(name, TensorProto.FLOAT, [], [value]))
        return name


def _layer_norm(b: _Builder, x: str, hidden: int) -> str:
    mean = b.op("ReduceMean", [x], axes=[-1])
    centered = b.op("Sub", [x, mean])
    square = b.op("Pow", [centered, b.scalar("two", 2.0)])
    var = b.op("ReduceMean", [square], axes=[-1])
    std = b.op("Sqrt", [b.op("Add", [var, b.scalar("eps", 1e-12)])])
    normed = b.op("Div", [centered, std])
    return b.op("Add", [b.op("Mul", [normed, b.weight("ln_gamma", [hidden])]), b.weight("ln_beta", [hidden])])


def _dense(b: _Builder, x: str, rows: int, cols: int) -> str:
    return b.op("Add", [b.op("MatMul", [x, b.weight("w", [rows, cols])]), b.weight("bias", [cols])])


def _heads_shape(b: _Builder, x: str, heads: int, head_dim: int) -> str:
    """The [batch, seq, heads, head_dim] target computed from x's shape, as exporters write it."""
    shape = b.op("Shape", [x])
    batch, seq = (_dim(b, shape, axis) for axis in (0, 1))
    return b.op("Concat", [batch, seq, b.const("hd", [heads, head_dim])], axis=0)


def _dim(b: _Builder, shape: str, axis: int) -> str:
    """One dim of a shape tensor as a 1-element tensor: Gather of a scalar index, then Unsqueeze."""
    index = b.name("index")
    b.initializers.append(helper.make_tensor(index, TensorProto.INT64, [], [axis]))
    return b.op("Unsqueeze", [b.op("Gather", [shape, index], axis=0), b.const("axis0", [0])])


def _attention(b: _Builder, x: str, mask: str, hidden: int, heads: int) -> str:
    head_dim = hidden // heads
    split = []
    for perm in ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]):
        projected = _dense(b, x, hidden, hidden)
        shaped = b.op("Reshape", [projected, _heads_shape(b, projected, heads, head_dim)])
        split.append(b.op("Transpose", [shaped], perm=perm))
    # Scaled as torch's SDPA export does: q and k each by head_dim ** -0.25 before the product.
    query, key = (b.op("Mul", [t, b.scalar("scale", head_dim ** -0.25)]) for t in split[:2])
    scores = b.op("MatMul", [query, key])
    probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, split[2]])], perm=[0, 2, 1, 3])
    shape = b.op("Shape", [context])
    merged = b.op("Concat", [_dim(b, shape, 0), _dim(b, shape, 1), b.const("h", [hidden])], axis=0)
    return _dense(b, b.op("Reshape", [context, merged]), hidden, hidden)


def _gelu(b: _Builder, x: str) -> str:
    erf = b.op("Erf", [b.op("Div", [x, b.scalar("sqrt2", 2 ** 0.5)])])
    return b.op("Mul", [b.op("Mul", [x, b.op("Add", [erf, b.scalar("one", 1.0)])]), b.scalar("half", 0.5)])


def bert_base_model(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, seq: int = 128,
                    vocab: int = 30522) -> onnx.ModelProto:
    b = _Builder()
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])
    mask_in = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])
    words = b.op("Gather", [b.weight("word_embeddings", [vocab, hidden]), "input_ids"], axis=0)
    positions = b.weight("position_embeddings", [seq, hidden])
    x = _layer_norm(b, b.op("Add", [words, positions]), hidden)
    mask = b.op("Unsqueeze", [b.op("Unsqueeze", ["attention_mask", b.const("a1", [1])]), b.const("a2", [2])])
    mask = b.op("Mul", [b.op("Sub", [b.scalar("one", 1.0), b.op("Cast", [mask], to=TensorProto.FLOAT)]),
                        b.scalar("neg", -10000.0)])
    for _ in range(layers):
        x = _layer_norm(b, b.op("Add", [_attention(b, x, mask, hidden, heads), x]), hidden)
        inner = _gelu(b, _dense(b, x, hidden, ffn))
        x = _layer_norm(b, b.op("Add", [_dense(b, inner, ffn, hidden), x]), hidden)
    pooled = b.op("Tanh", [_dense(b, b.op("Gather", [x, b.const("cls", [0])], axis=1), hidden, hidden)])
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None),
               helper.make_tensor_value_info(pooled, TensorProto.FLOAT, None)]
    graph = helper.make_graph(b.nodes, "bert_base", [ids, mask_in, *b.inputs], outputs, b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
