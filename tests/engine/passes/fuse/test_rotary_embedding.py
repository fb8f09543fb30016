"""rotary_embedding_fuse: the rotate-half rotary embedding (full and partial) becomes RotaryEmbedding at opset
23+, checked against the chain on onnxruntime; each refusal is a sentence."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

from tests.engine.passes.fuse.harness import optimize

PASS = "rotary_embedding_fuse"
B, H, S, D = 2, 4, 5, 8


def factors(rot=D, repeat=True, per_head=False, seed=0):
    """cos, sin of shape (1, 1, S, rot) (``per_head``: (1, H, S, rot), different per head)."""
    angles = np.random.default_rng(seed).uniform(0, 6, (H if per_head else 1, S, rot // 2)).astype(np.float32)
    if repeat:
        angles = np.concatenate([angles, angles], -1)
    else:
        angles = np.concatenate([angles, angles[..., ::-1] + 0.5], -1)
    return np.cos(angles)[None], np.sin(angles)[None]


def rotary_model(*, rot=D, opset=23, cos=None, sin=None, halves=None, concat_axis=-1, neg_first=True):
    """x (B, H, S, D) -> x * cos + rotate_half(x) * sin, on the first ``rot`` head dims (the rest passes)."""
    half = rot // 2
    halves = halves or [half, rot - half]
    swapped = "Concat <axis = %d> (nb, a)" % concat_axis if neg_first else "Concat <axis = %d> (a, nb)" % concat_axis
    if rot == D:
        body = f"""
            a, b = Split <axis = -1> (x, halves)
            nb = Neg (b)
            c = {swapped}
            xc = Mul (x, cos)
            cs = Mul (c, sin)
            y = Add (xc, cs)"""
    else:
        body = f"""
            r, rest = Split <axis = 3> (x, outer)
            a, b = Split <axis = -1> (r, halves)
            nb = Neg (b)
            c = {swapped}
            xc = Mul (cos, r)
            cs = Mul (sin, c)
            e = Add (cs, xc)
            y = Concat <axis = -1> (e, rest)"""
    model = parser.parse_model(f'<ir_version: 10, opset_import: ["" : {opset}]> '
                               f'g (float[{B}, {H}, {S}, {D}] x) => (float[{B}, {H}, {S}, {D}] y) {{{body}\n}}')
    default_cos, default_sin = factors(rot)
    inits = {"halves": np.array(halves, np.int64), "outer": np.array([rot, D - rot], np.int64),
             "cos": default_cos if cos is None else cos, "sin": default_sin if sin is None else sin}
    used = {name for node in model.graph.node for name in node.input}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items() if k in used)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_rotate_half_becomes_rotary_embedding(tmp_path):
    out = optimize(tmp_path, rotary_model(), [PASS])
    assert out.ops == ["RotaryEmbedding"]
    node = out.node("RotaryEmbedding")
    cos, sin = factors()
    np.testing.assert_array_equal(node.input(1).constant_value(), np.broadcast_to(cos[0, :, :, :D // 2], (B, S, D // 2)))
    np.testing.assert_array_equal(node.input(2).constant_value(), np.broadcast_to(sin[0, :, :, :D // 2], (B, S, D // 2)))
    assert not node.attr("rotary_embedding_dim")


def test_partial_rotary_sets_the_rotary_dim(tmp_path):
    out = optimize(tmp_path, rotary_model(rot=4), [PASS])
    assert out.ops == ["RotaryEmbedding"] and out.node("RotaryEmbedding").attr("rotary_embedding_dim") == 4


def test_cos_of_rank_two_broadcasts(tmp_path):
    cos, sin = factors()
    assert optimize(tmp_path, rotary_model(cos=cos[0, 0], sin=sin[0, 0]), [PASS]).ops == ["RotaryEmbedding"]


def test_opset_22_is_refused_pointing_at_target_opset(tmp_path):
    out = optimize(tmp_path, rotary_model(opset=22), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("RotaryEmbedding needs opset 23, and the model imports opset 22 (raise it with "
                       "--target-opset 23)")


def test_raised_by_target_opset(tmp_path):
    assert optimize(tmp_path, rotary_model(opset=18), [PASS], target_opset=23).ops == ["RotaryEmbedding"]


def test_halves_that_differ_are_refused(tmp_path):
    """cos whose second half is not its first: not one frequency per pair, the chain stays."""
    cos, sin = factors(repeat=False)
    out = optimize(tmp_path, rotary_model(cos=cos, sin=sin), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("the cos factor 'cos' does not broadcast to [2, 4, 5, 8] the same for every head with its "
                       "first half repeated in its second")


def test_factors_per_head_are_refused(tmp_path):
    cos, sin = factors(per_head=True)
    out = optimize(tmp_path, rotary_model(cos=cos, sin=sin), [PASS])
    assert "RotaryEmbedding" not in out.ops and out.refused("the cos factor 'cos' does not broadcast")


def test_uneven_split_is_refused(tmp_path):
    out = optimize(tmp_path, rotary_model(halves=[3, 5]), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("does not cut the rotated head dims of 'x' in two halves")


def test_swapped_halves_without_negation_first_do_not_match(tmp_path):
    """Concat(a, -b) is a rotation the other way: no match, nothing changes."""
    out = optimize(tmp_path, rotary_model(neg_first=False), [PASS])
    assert "RotaryEmbedding" not in out.ops


def test_no_kernel_in_any_valid_place_is_refused(tmp_path):
    out = optimize(tmp_path, rotary_model(), [PASS], places="npu/fp32/nchw", host_fallback=False)
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("no valid place (npu) has a RotaryEmbedding kernel at opset 23")


def every_two_text(x: str, cos: str, sin: str, shape: str, out: str) -> str:
    """ONNX text of ``out = x * cos + rotate_every_two(x) * sin`` (GPT-J): the negated odd and the even elements
    stacked on a new last axis and flattened back to ``shape``."""
    return f"""
            {x}_even = Slice ({x}, zero, big, last, two)
            {x}_odd = Slice ({x}, start_odd, big, last, two)
            {x}_nodd = Neg ({x}_odd)
            {x}_uo = Unsqueeze ({x}_nodd, last)
            {x}_ue = Unsqueeze ({x}_even, last)
            {x}_pairs = Concat <axis = -1> ({x}_uo, {x}_ue)
            {x}_swapped = Reshape ({x}_pairs, {shape})
            {x}_cos = Mul ({x}, {cos})
            {x}_sin = Mul ({x}_swapped, {sin})
            {out} = Add ({x}_cos, {x}_sin)"""


def interleaved_model(*, cos=None, sin=None, odd_start=1):
    """x (B, H, S, D) -> x * cos + rotate_every_two(x) * sin (GPT-J), cos repeating each value twice."""
    body = every_two_text("x", "cos", "sin", "shape", "y")
    model = parser.parse_model(f'<ir_version: 10, opset_import: ["" : 23]> '
                               f'g (float[{B}, {H}, {S}, {D}] x) => (float[{B}, {H}, {S}, {D}] y) {{{body}\n}}')
    angles = np.random.default_rng(1).uniform(0, 6, (1, 1, S, D // 2)).astype(np.float32).repeat(2, axis=-1)
    inits = {"zero": np.array([0], np.int64), "start_odd": np.array([odd_start], np.int64),
             "big": np.array([1 << 30], np.int64), "last": np.array([-1], np.int64), "two": np.array([2], np.int64),
             "shape": np.array([B, H, S, D], np.int64),
             "cos": np.cos(angles) if cos is None else cos, "sin": np.sin(angles) if sin is None else sin}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def test_interleaved_form_becomes_rotary_embedding_interleaved(tmp_path):
    out = optimize(tmp_path, interleaved_model(), [PASS])
    assert out.ops == ["RotaryEmbedding"] and out.node("RotaryEmbedding").attr("interleaved") == 1


def test_interleaved_cos_not_repeated_in_pairs_is_refused(tmp_path):
    cos, sin = factors()  # halves repeated, not neighbours
    out = optimize(tmp_path, interleaved_model(cos=cos, sin=sin), [PASS])
    assert "RotaryEmbedding" not in out.ops
    assert out.refused("with each value repeated in its odd neighbour")


def test_interleaved_slices_not_even_and_odd_are_refused(tmp_path):
    out = optimize(tmp_path, interleaved_model(odd_start=0), [PASS], check=False, valid=False)
    assert "RotaryEmbedding" not in out.ops and out.refused("do not take the even and odd head dims")


# Run-time cos and sin (dynamic batch and sequence): cos = Unsqueeze(Cos(Concat(f, f)) * s, heads axis).

def dynamic_model(*, second=None, op_sin="Sin", axis=1, f_batch="1", scale=True, cast=False):
    """q and k (B, H, S, D) rotated by cos/sin computed from f (f_batch, S, D/2) at run time, shared by both;
    ``second`` names the table the Concat repeats (f unless a refusal wants otherwise)."""
    second = second or "f"
    steps = []  # the optional scale and Cast, each a line per factor
    if scale:
        steps.append(("Mul ({}, s)", ""))
    if cast:
        steps.append(("Cast <to = 1> ({})", ""))
    lines, last = [], {"c": "c0", "s": "s0"}
    for i, (op, _) in enumerate(steps):
        for key in ("c", "s"):
            lines.append(f"{key}{i + 1} = {op.format(last[key])}")
            last[key] = f"{key}{i + 1}"
    chain = "\n            ".join(lines)
    rotate = "\n".join(f"""
            {v}a, {v}b = Split <axis = -1> ({v}, halves)
            {v}nb = Neg ({v}b)
            {v}r = Concat <axis = -1> ({v}nb, {v}a)
            {v}xc = Mul ({v}, cu)
            {v}rs = Mul ({v}r, su)
            {v}y = Add ({v}xc, {v}rs)""" for v in ("q", "k"))
    text = f"""<ir_version: 10, opset_import: ["" : 23]>
        g (float[B, {H}, S, {D}] q, float[B, {H}, S, {D}] k, float[{f_batch}, S, {D // 2}] f,
           float[{f_batch}, S, {D // 2}] g) => (float[B, {H}, S, {D}] qy, float[B, {H}, S, {D}] ky) {{
            e = Concat <axis = -1> (f, {second})
            c0 = Cos (e)
            s0 = {op_sin} (e)
            {chain}
            cu = Unsqueeze ({last["c"]}, heads)
            su = Unsqueeze ({last["s"]}, heads)
            {rotate}
        }}"""
    model = parser.parse_model(text)
    inits = {"halves": np.array([D // 2, D // 2], np.int64), "heads": np.array([axis], np.int64),
             "s": np.array(0.75, np.float32)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def canonical(model: onnx.ModelProto) -> list[tuple]:
    """Every node as (op, inputs, outputs, attributes), values named by graph input, constant content or order
    of first appearance: two graphs compare equal when they compute the same way whatever their names."""
    names = {i.name: f"in:{i.name}" for i in model.graph.input}
    names.update({t.name: f"const:{numpy_helper.to_array(t).tolist()}" for t in model.graph.initializer})
    names.update({o.name: f"out:{o.name}" for o in model.graph.output})
    fresh = iter(range(1 << 20))

    def name(value: str) -> str:
        if value not in names:
            names[value] = f"v{next(fresh)}"
        return names[value]

    return [(n.op_type, [name(i) for i in n.input], [name(o) for o in n.output],
             {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}) for n in model.graph.node]


def run_dynamic(path, seq: int, f_batch: int = 1) -> list[np.ndarray]:
    import onnxruntime as ort

    rng = np.random.default_rng(seq)
    feeds = {"q": rng.standard_normal((2, H, seq, D)), "k": rng.standard_normal((2, H, seq, D)),
             "f": rng.uniform(0, 6, (f_batch, seq, D // 2)), "g": rng.uniform(0, 6, (f_batch, seq, D // 2))}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    used = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v.astype(np.float32) for k, v in feeds.items() if k in used})


def test_runtime_cos_and_sin_become_one_shared_cache(tmp_path):
    before = dynamic_model()
    out = optimize(tmp_path, before, [PASS], check=False)
    expected = parser.parse_model(f"""<ir_version: 10, opset_import: ["" : 23]>
        g (float[B, {H}, S, {D}] q, float[B, {H}, S, {D}] k, float[1, S, {D // 2}] f,
           float[1, S, {D // 2}] g) => (float[B, {H}, S, {D}] qy, float[B, {H}, S, {D}] ky) {{
            batch = Shape <end = 1> (q)
            rest = Shape <start = 1> (f)
            shape = Concat <axis = 0> (batch, rest)
            fb = Expand (f, shape)
            c = Cos (fb)
            cs = Mul (c, s)
            s1 = Sin (fb)
            ss = Mul (s1, s)
            qy = RotaryEmbedding (q, cs, ss)
            ky = RotaryEmbedding (k, cs, ss)
        }}""")
    expected.graph.initializer.append(numpy_helper.from_array(np.array(0.75, np.float32), "s"))
    assert canonical(onnx.load(str(out.path))) == canonical(expected)
    onnx.save(before, str(tmp_path / "before.onnx"))
    for seq in (5, 11):  # one graph, two sequence lengths
        for got, want in zip(run_dynamic(out.path, seq), run_dynamic(tmp_path / "before.onnx", seq)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("f_batch", ["B", "1"])
def test_a_cast_and_no_scale_and_a_batched_table(tmp_path, f_batch):
    """With the table's batch that of x no Expand is needed; the Cast is replayed on the half-size cache."""
    before = dynamic_model(f_batch=f_batch, scale=False, cast=True)
    out = optimize(tmp_path, before, [PASS], check=False)
    assert out.ops.count("RotaryEmbedding") == 2 and out.ops.count("Cos") == 1 and out.ops.count("Cast") == 2
    assert ("Expand" in out.ops) == (f_batch == "1")
    onnx.save(before, str(tmp_path / "before.onnx"))
    for seq in (3, 7):
        fed = 2 if f_batch == "B" else 1
        for got, want in zip(run_dynamic(out.path, seq, fed), run_dynamic(tmp_path / "before.onnx", seq, fed)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, reason", [
    ({"second": "g"}, "is not Cos of one table concatenated with itself on the last axis"),
    ({"op_sin": "Cos"}, "the sin factor 'su' is not a constant and is not computed by Sin"),
    ({"axis": 2}, "is not a (batch, seq, rot) table unsqueezed on the heads axis"),
])
def test_runtime_factors_not_of_the_rotary_form_are_refused(tmp_path, kwargs, reason):
    out = optimize(tmp_path, dynamic_model(**kwargs), [PASS], check=False)
    assert "RotaryEmbedding" not in out.ops
    assert out.refused(reason), out.refusals()


DATA = Path(__file__).resolve().parents[2] / "data" / "transformers"
DYNAMIC = [f"{model}_dynamic.{exporter}" for model in ("llama", "phi", "gpt_neox")
           for exporter in ("dynamo", "torchscript")]


def agree_at_two_lengths(source, target) -> None:
    """The export and its optimized form agree at batch 2 and sequences 5 and 12 (masks padded on the right:
    no query row is masked whole)."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (source, target)]
    rng = np.random.default_rng(0)
    for seq in (5, 12):
        ids = rng.integers(3, 100, (2, seq))
        mask = np.ones((2, seq), np.int64)
        mask[1, seq - 2:] = 0
        want, got = (s.run(None, {"input_ids": ids, "attention_mask": mask})[0] for s in sessions)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.models
@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_exports_fuse_with_one_cache_and_agree_at_two_lengths(tmp_path, name):
    """Exports with a dynamic batch and sequence (``transformer_exports.py --size tiny``): both rotations of the
    layer become RotaryEmbedding over one Cos and one Sin, and the output agrees with the export's at batch 2
    and two sequence lengths (masks padded on the right: no query row is masked whole)."""
    from worker.engine.api import optimize as run
    from worker.engine.options import OptimizeOptions

    source, target = DATA / f"{name}.onnx", tmp_path / "out.onnx"
    run(source, target, OptimizeOptions(portable=True, target_opset=23, verify=False))
    saved = onnx.load(str(target))
    ops = [n.op_type for n in saved.graph.node]
    assert (ops.count("RotaryEmbedding"), ops.count("Cos"), ops.count("Sin"), ops.count("Neg")) == (2, 1, 1, 0)
    if name.startswith("gpt_neox"):  # TorchScript's view(h.size(0), h.size(1), -1, 3 * head) of the projection
        assert ops.count("Attention") == 1  # and the rotated query's dims named again, so attention fuses
    assert all(d.dim_param for d in saved.graph.input[0].type.tensor_type.shape.dim)  # still dynamic
    agree_at_two_lengths(source, target)


def _spread(key: str, repeat: str) -> str:
    """The factor ``{key}r`` from the table's half ``{key}_half`` (see gathered_model)."""
    if repeat == "halves":
        return f"""{key}u = Tile ({key}_half, twice)
            {key}r = Unsqueeze ({key}u, heads_axis)"""
    source = f"{key}_half" if repeat == "interleave" else f"{key}v"
    reverse = "" if repeat == "interleave" else f"{key}v = Slice ({key}_half, m1, lowest, seq_axis, m1)\n            "
    return f"""{reverse}{key}u = Unsqueeze ({source}, four_axes)
            {key}t = Tile ({key}u, pairs)
            {key}r = Reshape ({key}t, flat)"""


def gathered_model(*, repeat="interleave", lookup="Gather", opset=23):
    """GPT-J's rotary on x (batch, seq, 2 heads, 8) with rot 4: cos and sin are the rows of a (16, 4) table
    gathered at positions Range(0, seq) and each value repeated in its odd neighbour (``repeat="interleave"``;
    ``"halves"`` tiles the table's half instead: a b a b; ``"reversed"`` reads the rows in reverse order)."""
    angles = np.arange(16)[:, None] * [1.0, 0.1]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)
    index = "(positions, first)" if lookup == "Gather" else "(positions, first_last)"
    text = f"""<ir_version: 10, opset_import: ["" : {opset}]>
        g (float[B, S, 2, 8] x) => (float[B, S, 2, 8] y) {{
            shape = Shape (x)
            seq = Gather <axis = 0> (shape, one)
            positions = Range (origin, seq, one)
            p = Unsqueeze {index}
            rows = {lookup} (table, p)
            s_half, c_half = Split <axis = -1> (rows, halves)
            {_spread("c", repeat)}
            {_spread("s", repeat)}
            rot, rest = Split <axis = -1> (x, cut)
            {every_two_text("rot", "cr", "sr", "back", "added")}
            y = Concat <axis = -1> (added, rest)
        }}"""
    model = parser.parse_model(text)
    inits = {"table": table, "one": np.array(1, np.int64), "origin": np.array(0, np.int64), "zero": np.array([0], np.int64),
             "first": np.array([0], np.int64), "first_last": np.array([0, 2], np.int64),
             "halves": np.array([2, 2], np.int64), "four_axes": np.array([2, 4], np.int64),
             "pairs": np.array([1, 1, 1, 1, 2], np.int64), "twice": np.array([1, 1, 2], np.int64), "flat": np.array([1, 0, 1, -1], np.int64),
             "m1": np.array([-1], np.int64), "lowest": np.array([-2 ** 62], np.int64), "seq_axis": np.array([1], np.int64), "heads_axis": np.array([2], np.int64),
             "cut": np.array([4, 4], np.int64), "start_odd": np.array([1], np.int64),
             "big": np.array([2 ** 62], np.int64), "last": np.array([-1], np.int64), "two": np.array([2], np.int64),
             "back": np.array([0, 0, 2, 4], np.int64)}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    return model


@pytest.mark.parametrize("lookup", ["Gather", "GatherND"])
def test_rows_gathered_from_a_table_become_caches_with_position_ids(tmp_path, lookup):
    """GPT-J: the factors are the table's rows at the positions (Gather, or GatherND as the dynamo exporter
    writes it), repeat_interleave'd; x is (batch, seq, heads, head), so the op runs on its 3-D form."""
    out = optimize(tmp_path, gathered_model(lookup=lookup), [PASS])
    assert out.ops.count("RotaryEmbedding") == 1 and "Neg" not in out.ops
    rotary = next(n for n in out.model.graph if n.op_type == "RotaryEmbedding")
    assert (rotary.attr("interleaved"), rotary.attr("num_heads"), rotary.attr("rotary_embedding_dim")) == (1, 2, 4)
    np.testing.assert_array_equal(rotary.input(1).const, np.cos(np.arange(16)[:, None] * [1.0, 0.1]).astype(np.float32))
    import onnxruntime as ort
    onnx.save(gathered_model(lookup=lookup), tmp_path / "before.onnx")
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
                for p in (tmp_path / "before.onnx", out.path)]
    for batch, seq in ((1, 5), (3, 16)):
        x = np.random.default_rng(seq).standard_normal((batch, seq, 2, 8)).astype(np.float32)
        want, got = (s.run(None, {"x": x})[0] for s in sessions)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("repeat, reason", [
    ("halves", "does not take each position's row alone with each value repeated in its odd neighbour"),
    ("reversed", "does not take each position's row alone with each value repeated in its odd neighbour"),
])
def test_gathered_factors_not_of_the_interleaved_form_are_refused(tmp_path, repeat, reason):
    out = optimize(tmp_path, gathered_model(repeat=repeat), [PASS], check=False)
    assert "RotaryEmbedding" not in out.ops
    assert out.refused(reason), out.refusals()


@pytest.mark.models
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_gptj_dynamic_exports_fuse_and_agree_at_two_lengths(tmp_path, exporter):
    """GPT-J with a dynamic batch and sequence (``transformer_exports.py --size tiny``): both rotations of the
    layer become RotaryEmbedding over the gathered table, attention fuses, and the output agrees with the
    export's at batch 2 and two sequence lengths."""
    from worker.engine.api import optimize as run
    from worker.engine.options import OptimizeOptions

    source, target = DATA / f"gptj_dynamic.{exporter}.onnx", tmp_path / "out.onnx"
    run(source, target, OptimizeOptions(portable=True, target_opset=23, verify=False))
    ops = [n.op_type for n in onnx.load(str(target)).graph.node]
    assert (ops.count("RotaryEmbedding"), ops.count("Neg"), ops.count("Attention")) == (2, 0, 1)
    agree_at_two_lengths(source, target)
