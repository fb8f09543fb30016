"""The transformer chains the fusions into standard ops (gelu_fuse, rms_norm_fuse, attention_fuse) and into
the project's domain (transformer_domain_fuse) share: each rule's pattern, its ``check`` for the standard op
(the opset and kernel gate, then ``plan``), ``plan`` (every structural precondition, whatever op the chain
becomes) and its standard-op ``rewrite``. The pass modules document the forms and preconditions."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from worker.engine.ir import Node, Value
from worker.engine.passes.base import PassContext
from worker.engine.passes.support.activations import FormRule, Params
from worker.engine.passes.support.normalization import affine_constant, normalized_axes, scalar, trailing_axis
from worker.engine.passes.support.standard_ops import standard_op_refusal
from worker.engine.passes.support.weights import FLOAT_TYPES, numpy_dtype
from worker.engine.pattern import Match, Pattern, Rule, describe


#: The three spellings of x / r: times Reciprocal(r), times Div(1, r), and Div(x, r).
INVERSES = ("reciprocal", "div_one", "div")


class RMSNormChain(Rule):
    pattern_args = ("square", "inverse", "has_scale")

    def __init__(self, square: str, inverse: str, has_scale: bool):
        super().__init__()
        self.square, self.inverse, self.has_scale = square, inverse, has_scale
        self.name = f"rms_norm_{square}_{inverse}_{'scale' if has_scale else 'none'}"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        x = p.var("x")
        square = p.Pow(x, p.var("two"), key="square_op") if self.square == "pow" else p.Mul(x, x, key="square_op")
        mean_square = p.Add(p.ReduceMean(square, key="mean_op"), p.var("eps"), key="add_eps", commutative=True)
        root = p.Sqrt(mean_square, key="sqrt")
        last = None if self.has_scale else "out"
        if self.inverse == "div":
            normalized = p.Div(x, root, key="normalize", out=last)
        else:
            inverse = p.Reciprocal(root, key="inverse") if self.inverse == "reciprocal" else \
                p.Div(p.var("one"), root, key="inverse")
            normalized = p.Mul(x, inverse, key="normalize", commutative=True, out=last)
        if self.has_scale:
            p.Mul(normalized, p.var("gamma"), key="scale", commutative=True, out="out")
        return p

    def _axis(self, ctx: PassContext, match: Match) -> int | None:
        x = match.value("x")
        if x.shape is None or x.dtype not in FLOAT_TYPES:
            return None
        rank = len(x.shape)
        axis = trailing_axis(normalized_axes(match.node("mean_op"), ctx.opset(), rank), rank)
        if axis is None or not all(isinstance(d, int) for d in x.shape[axis:]):
            return None
        return axis

    def check(self, ctx: PassContext, match: Match) -> int | str:
        """The first normalized axis, or why the chain is not an RMSNormalization."""
        return standard_op_refusal(ctx, "RMSNormalization", 23) or self.plan(ctx, match)

    def plan(self, ctx: PassContext, match: Match) -> int | str:
        """The first normalized axis, or why the chain is no RMSNorm whatever the op it would become."""
        axis = self._axis(ctx, match)
        if axis is None:
            return (f"{describe(match.node('mean_op'))} does not average a trailing block of dims of a float "
                    f"tensor whose normalized dims are known, with keepdims")
        if self.square == "pow" and scalar(match.value("two")) != 2.0:
            return f"{describe(match.node('square_op'))} does not square (its exponent is not the constant 2)"
        if self.inverse == "div_one" and scalar(match.value("one")) != 1.0:
            return f"{describe(match.node('inverse'))} does not invert (its dividend is not the constant 1)"
        if scalar(match.value("eps")) is None:
            return (f"the epsilon {match.value('eps').name!r} added by {describe(match.node('add_eps'))} is not a "
                    f"constant")
        if self.has_scale and affine_constant(match.value("gamma"), match.value("x").shape, axis) is None:
            return (f"the scale {match.value('gamma').name!r} is not a constant that varies only along the "
                    f"normalized dims")
        return axis

    def scale(self, match: Match, axis: int):
        """The normalization's scale as an initializer over the normalized dims (ones when it has none)."""
        x, anchor = match.value("x"), match.node("normalize")
        dtype = numpy_dtype(x.dtype)
        if self.has_scale:
            gamma = affine_constant(match.value("gamma"), x.shape, axis).astype(dtype)
        else:
            gamma = np.ones(x.shape[axis:], dtype)
        return match.graph.add_initializer(f"{anchor.name}_scale", gamma)

    def rewrite(self, ctx: PassContext, match: Match, axis: int) -> Node:
        x, graph, anchor = match.value("x"), match.graph, match.node("normalize")
        scale = self.scale(match, axis)
        return graph.add_node("RMSNormalization", [x, scale], outputs=[match.value("out")], name=anchor.name,
                              before=anchor, attributes={"axis": axis, "epsilon": scalar(match.value("eps"))})


class GeluChain(FormRule):
    def check(self, ctx: PassContext, match: Match) -> Params | str:
        return standard_op_refusal(ctx, "Gelu", 20) or self.plan(ctx, match)

    def plan(self, ctx: PassContext, match: Match) -> Params | str:
        if match.value("x").dtype not in FLOAT_TYPES:
            return f"the input of the Gelu chain at {describe(match.node('nonlinear'))} is not a float tensor"
        return self.form.read(match, ctx.opset())

    def rewrite(self, ctx: PassContext, match: Match, params: Params) -> Node:
        attributes = {"approximate": "tanh"} if self.form.kind == "GeluTanh" else {}
        return match.graph.add_node("Gelu", [match.value("x")], outputs=[match.value("out")],
                                    name=match.node("nonlinear").name, attributes=attributes,
                                    before=match.node("last"))


def heads4(value) -> tuple | None:
    """A 4-D shape whose dims are all known (symbolic batch and sequence allowed) and whose head count and
    head size are static, or None."""
    shape = value.shape
    if shape is None or len(shape) != 4 or any(d is None or d == "" for d in shape):
        return None
    if not isinstance(shape[1], int) or not (isinstance(shape[2], int) or isinstance(shape[3], int)):
        return None
    return tuple(shape)


def static4(value) -> tuple[int, int, int, int] | None:
    shape = value.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def _broadcasts(before, after) -> bool:
    """Whether a value of shape ``after`` is provably larger than ``before``, from which it was computed by
    broadcasting: more dims, a static dim that differs, or a dim of 1 grown (symbolic dims of other names may
    be equal at run time: not provably larger)."""
    if before is None or after is None:
        return False
    if len(after) != len(before):
        return True
    return any((isinstance(a, int) and isinstance(b, int) and a != b) or (b == 1 and a != 1)
               for b, a in zip(before, after))


def broadcast(a: tuple, b: tuple) -> tuple:
    """The shape of a + b (a dim of 1 gives way to the other; symbolic dims kept)."""
    a, b = (1,) * (len(b) - len(a)) + tuple(a), (1,) * (len(a) - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


class ScaledDotProduct(Rule):
    """``scale``: "mul" or "div" (the scores times or over a constant), "none", or "split" (the query and the
    transposed keys each times a constant, torch's scaled_dot_product_attention by its square root) and
    "split_shared" (the same, both times one constant value);
    ``nan_guard``: the weights pass through Where(IsNaN(w), 0, w) (the same decomposition's zero rows where
    every key is masked, what the op computes there)."""

    pattern_args = ("scale", "masks", "float_softmax", "nan_guard", "fill")

    def __init__(self, scale: str, masks: int, float_softmax: bool = False, nan_guard: bool = False,
                 fill: str = ""):
        super().__init__()
        self.scale, self.masks, self.float_softmax, self.nan_guard = scale, masks, float_softmax, nan_guard
        #: "if_true": the scores pass through Where(cond, fill, s) after the masks (torch's masked_fill: XLM,
        #: MPT); "if_false": Where(cond, s, fill) (GPT-2's eager causal mask); "": neither.
        self.fill = fill
        self.name = (f"attention_{scale}_{masks}_masks{'_float_softmax' if float_softmax else ''}"
                     f"{'_nan_guard' if nan_guard else ''}{f'_fill_{fill}' if fill else ''}")

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        if self.scale in ("split", "split_shared"):  # a match binds distinct values: one var when shared
            c = p.var("c")
            q = p.Mul(p.var("q"), c if self.scale == "split_shared" else p.var("cq"), key="q_scale", commutative=True)
            kt = p.Mul(p.var("kt"), c, key="scale", commutative=True)
            scores = p.MatMul(q, kt, key="qk")
        else:
            scores = p.MatMul(p.var("q"), p.var("kt"), key="qk")
        if self.scale in ("mul", "div"):
            scores = p.op("Mul" if self.scale == "mul" else "Div", scores, p.var("c"), key="scale",
                          commutative=self.scale == "mul")
        for i in range(self.masks):
            scores = p.Add(scores, p.var(f"mask{i}"), key=f"add{i}", commutative=True)
        if self.fill == "if_true":
            scores = p.Where(p.var("cond"), p.var("fill").const(), scores, key="masked_fill")
        elif self.fill == "if_false":
            scores = p.Where(p.var("cond"), scores, p.var("fill").const(), key="masked_fill")
        if self.float_softmax:  # a half-precision model's softmax in float32: Cast up, Softmax, Cast back
            weights = p.Cast(p.Softmax(p.Cast(scores, key="up", attrs={"to": 1}), key="softmax"), key="down")
        else:
            weights = p.Softmax(scores, key="softmax")
        if self.nan_guard:
            weights = p.Where(p.IsNaN(weights, key="is_nan"), p.var("zero"), weights, key="guard")
        p.MatMul(weights, p.var("v"), key="pv", out="out")
        return p

    def check(self, ctx: PassContext, match: Match) -> float | str:
        """The scale, or why the chain is not an Attention."""
        refusal = standard_op_refusal(ctx, "Attention", 23)
        if refusal:
            return refusal
        plan = self.plan(ctx, match)
        return plan if isinstance(plan, str) else self.mask_refusal(match) or plan

    def mask_refusal(self, match: Match) -> str | None:
        """The op's attn_mask is 2-D to 4-D with a row per query (onnxruntime's kernel broadcasts it over the
        batch and the heads only): a mask added to the scores any other way (a scalar bias, a padding row
        (..., 1, keys) of static shape) stays out of the op."""
        shape = self.mask_shape(match)
        if shape is None:
            return None
        queries = match.value("q").shape[2]
        rows = shape[-2] if len(shape) >= 2 else None
        # A symbolic row count is taken as the queries' (the Add gives the scores' shape, so it is 1 or that);
        # a static one must be it.
        if not 2 <= len(shape) <= 4 or (isinstance(rows, int) and rows != queries):
            return (f"the mask added to the scores of {describe(match.node('qk'))} has shape {list(shape)}, not a "
                    f"row per query ({queries}) in 2 to 4 dims as the Attention op's attn_mask")
        return None

    def fill_refusal(self, match: Match) -> str | None:
        """Why Where(cond, fill, s) is not the scores plus the mask Where(cond, fill, 0), or None. It is where
        fill absorbs every score added to it (s + fill == fill): -inf, or in float32 and float64 a value at
        most -2**120 (the lowest float, as torch's masked_fill writes it), whose half ulp, 2**96, no score
        reaches; a masked row then has the same weights either way, a row masked throughout too."""
        where, cond, fill = match.node("masked_fill"), match.value("cond"), match.value("fill")
        value, data = scalar(fill), fill.constant_value()
        if cond.dtype != TensorProto.BOOL or cond.shape is None or len(cond.shape) > 4:
            return f"{describe(where)} does not choose by a boolean mask of rank 4 at most"
        if value is None or data.size != 1 or fill.dtype != match.value("q").dtype:
            return f"{describe(where)} does not fill with one constant of the scores' type"
        if not (value == -np.inf or (fill.dtype in (TensorProto.FLOAT, TensorProto.DOUBLE) and value <= -2.0 ** 120)):
            return (f"{describe(where)} fills masked scores with {value:g}: only -inf, or in float32 a value at "
                    f"most -2**120, absorbs the score an additive mask would add it to")
        return None

    def mask_shape(self, match: Match) -> tuple | None:
        """The shape of the op's one additive mask (the masks summed, a fill's condition among them), or None
        without a mask."""
        shapes = [tuple(match.value(f"mask{i}").shape) for i in range(self.masks)]
        if self.fill:
            shapes.append(tuple(match.value("cond").shape))
        if not shapes:
            return None
        shape = shapes[0]
        for other in shapes[1:]:
            shape = broadcast(shape, other)
        return shape

    def mask_value(self, match: Match, created: list[Node]) -> Value | None:
        """The op's one additive mask: the masks summed, a fill as Where(cond, fill, 0) (or Where(cond, 0,
        fill)) among them; the nodes it takes are appended to ``created``. None without a mask."""
        graph, anchor = match.graph, match.node("pv")
        sources = [match.value(f"mask{i}") for i in range(self.masks)]
        if self.fill:
            fill, cond = match.value("fill"), match.value("cond")
            zero = graph.add_initializer(f"{anchor.name}_unmasked", np.zeros((), numpy_dtype(fill.dtype)))
            branches = [fill, zero] if self.fill == "if_true" else [zero, fill]
            created.append(graph.add_node("Where", [cond, *branches], outputs=1, name=f"{anchor.name}_fill_mask",
                                          before=anchor))
            made = created[-1].outputs[0]
            made.dtype, made.shape = fill.dtype, broadcast(tuple(cond.shape), tuple(fill.shape))
            sources.append(made)
        if not sources:
            return None
        total = sources[0]
        for i, other in enumerate(sources[1:]):
            created.append(graph.add_node("Add", [total, other], outputs=1, name=f"{anchor.name}_mask{i or ''}",
                                          before=anchor))
            made = created[-1].outputs[0]
            made.dtype, made.shape = total.dtype, broadcast(tuple(total.shape), tuple(other.shape))
            total = made
        return total

    def plan(self, ctx: PassContext, match: Match) -> float | str:
        qk, q, kt, v = match.node("qk"), match.value("q"), match.value("kt"), match.value("v")
        shapes = [heads4(x) for x in (q, kt, v)]
        if None in shapes or q.dtype not in FLOAT_TYPES:
            return (f"the operands of {describe(qk)} and the values are not 4-D float tensors of known shape with "
                    f"static head counts and head sizes")
        (b, hq, s, d), (bk, hk, dk, skv), (bv, hv, sv, dv) = shapes
        # The head sizes and the key lengths agree wherever the chain runs (MatMul contracts them); the batch
        # and the heads must be shown equal, since MatMul would broadcast a 1 and the op does not.
        if not (b == bk == bv and hk == hv and hk and hq % hk == 0):
            return (f"{describe(qk)} does not read query {list(shapes[0])}, transposed keys {list(shapes[1])} and "
                    f"values {list(shapes[2])} of one batch with query heads a multiple of key-value heads")
        if self.float_softmax and (q.dtype == 1 or match.node("down").attr("to") != q.dtype):
            return (f"{describe(match.node('up'))} and {describe(match.node('down'))} do not take the scores of "
                    f"{describe(qk)} to float and back")
        axis = match.node("softmax").attr("axis", -1)
        if axis % 4 != 3:
            return f"{describe(match.node('softmax'))} does not normalize over the keys (axis {axis})"
        for i in range(self.masks):
            mask = match.value(f"mask{i}")
            if mask.dtype != q.dtype or mask.shape is None or len(mask.shape) > 4:
                return f"the mask {mask.name!r} is not a float tensor of rank 4 at most"
        if self.fill:
            refusal = self.fill_refusal(match)
            if refusal:
                return refusal
        if _broadcasts(match.node("qk").outputs[0].shape, match.node("softmax").inputs[0].shape):
            return f"the masks of {describe(qk)} do not keep the shape of its scores (they broadcast them)"
        if self.nan_guard and scalar(match.value("zero")) != 0.0:
            return f"{describe(match.node('guard'))} does not set the weights that are NaN to 0"
        if self.scale == "none":
            return 1.0
        c = scalar(match.value("c"))
        if c is None or c == 0:
            return f"the scale {match.value('c').name!r} of {describe(match.node('scale'))} is not a nonzero constant"
        if self.scale in ("split", "split_shared"):
            cq = scalar(match.value("cq" if self.scale == "split" else "c"))
            if cq is None or cq == 0:
                return (f"the scale {match.value('cq').name!r} of {describe(match.node('q_scale'))} is not a nonzero "
                        f"constant")
            return cq * c
        return c if self.scale == "mul" else 1.0 / c

    def rewrite(self, ctx: PassContext, match: Match, scale: float) -> list[Node]:
        graph, anchor = match.graph, match.node("pv")
        created = [graph.add_node("Transpose", [match.value("kt")], outputs=1, name=f"{anchor.name}_keys",
                                  before=anchor, attributes={"perm": [0, 1, 3, 2]})]
        kt = match.value("kt")
        keys = created[0].outputs[0]
        keys.dtype, keys.shape = kt.dtype, (*kt.shape[:2], kt.shape[3], kt.shape[2])
        inputs = [match.value("q"), keys, match.value("v")]
        mask = self.mask_value(match, created)
        if mask is not None:
            inputs.append(mask)
        precision = {"softmax_precision": 1} if self.float_softmax else {}
        created.append(graph.add_node("Attention", inputs, outputs=[match.value("out")], name=anchor.name,
                                      before=anchor, attributes={"scale": float(scale), **precision}))
        return created
