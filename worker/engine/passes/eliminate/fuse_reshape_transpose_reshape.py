"""fuse_reshape_transpose_reshape: a Transpose of the trailing axes written with the leading axes merged
into one and split again is a Transpose of those axes alone (the leading ones reshaped first when they split
otherwise than they were).

    x:[1, 6, 17, 64] -> Reshape(6, 17, 64) -> Transpose(0, 2, 1) -> Reshape(1, 6, 64, 17) -> y
        becomes    x -> Transpose(0, 1, 3, 2) -> y
    x:[1, 1, 6, 17, 64] -> Reshape(6, 17, 64) -> Transpose(0, 2, 1) -> Reshape(1, 6, 64, 17) -> y
        becomes    x -> Reshape(1, 6, 17, 64) -> Transpose(0, 1, 3, 2) -> y

The dynamo exporter writes a batched matmul with a transposed 4-D operand this way (torch decomposes
``q @ k.transpose(-2, -1)`` into a bmm over the merged batch); TorchScript writes the one Transpose that the
attention fusions read. Exact: a Transpose that keeps axis 0 of the merged tensor moves elements within each
leading index, and a row-major Reshape that only merges or splits leading axes keeps every trailing block.

Preconditions: static shapes; the first Reshape keeps x's last m axes and merges the others into one; the
Transpose keeps that axis first; the second Reshape keeps the transposed trailing axes and splits the
leading one into dims of the same product; the intermediates read by nothing else.

Where that form does not hold, the three ops are read as one permutation of *atoms*: the coarsest dims
that both x's shape and the first Reshape's split or merge into (a row-major Reshape only regroups
consecutive atoms; so do Squeeze, Unsqueeze and Flatten, which take a Reshape's place on either side). The Transpose permutes the atoms in groups; where the second Reshape regroups the
permuted atoms, the whole is a Reshape of x into atoms, their Transpose and a Reshape into the result, of
which the first and last drop out where they would change nothing. Applied only where that is fewer nodes.
Dims may be names: ``12*batch`` is 12 atoms of ``batch``'s (the product names type inference gives), so
nn.MultiheadAttention's head split at a dynamic batch, sequence first,

    x:[5, batch, 768] -> Reshape(5, -1, 64) -> Transpose(1, 0, 2) -> Reshape(-1, 12, 5, 64) -> y
        becomes    x -> Reshape(5, 0, 12, 64) -> Transpose(1, 2, 0, 3) -> y
    x:[5, batch, 3, 768] -> Unsqueeze(0) -> Transpose(3, 1, 2, 0, 4) -> Squeeze(3) -> y      (its packed q, k, v)
        becomes    x -> Transpose(2, 0, 1, 3) -> y

Preconditions: every dim of x, the merged and the result known as a number or a product of the model's names
(not ``unk__N``); the atoms found by dividing dims in order (neither of two dims dividing the other: no atoms);
each Reshape written with numbers, at most one -1, and 0 copying the dim at its own position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from worker.engine.inference import factors, product_name
from worker.engine.ir import Node
from worker.engine.passes.base import PassContext, PassKind, PassResult
from worker.engine.passes.support.shapes import static_shape
from worker.engine.passes.registry import register_pass
from worker.engine.pattern import Match, Pattern, Rule, apply_rules


class ReshapeTransposeReshape(Rule):
    name = "fuse_reshape_transpose_reshape"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        merged = p.Reshape(p.var("x"), p.var("merge_shape"), key="merge", out="merged")
        moved = p.Transpose(merged, key="transpose", out="moved")
        p.Reshape(moved, p.var("split_shape"), key="split", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> tuple[list[int], list[int]] | str:
        """(the leading dims of the result, the perm of the result's rank), or why not."""
        x, merged, y = (static_shape(match.value(key)) for key in ("x", "merged", "y"))
        if x is None or merged is None or y is None:
            return "a shape is not static"
        if 0 in x:
            return "the tensor is empty"
        trailing = len(merged) - 1
        if trailing < 1 or len(x) <= trailing or list(x[len(x) - trailing:]) != list(merged[1:]) \
                or math.prod(x[:len(x) - trailing]) != merged[0]:
            return "the first Reshape does not merge the leading axes alone"
        perm = match.node("transpose").attr("perm")
        if perm is None or len(perm) != len(merged) or perm[0] != 0:
            return "the Transpose moves the merged leading axis"
        moved = [merged[axis] for axis in perm[1:]]
        leading = list(y[:len(y) - trailing]) if len(y) > trailing else []
        if list(y[len(y) - trailing:]) != moved or math.prod(leading) != merged[0]:
            return "the second Reshape does not split the leading axis alone"
        lead = len(leading)
        return leading, list(range(lead)) + [lead + axis - 1 for axis in perm[1:]]

    def rewrite(self, ctx: PassContext, match: Match, plan: tuple[list[int], list[int]]) -> Node:
        leading, perm = plan
        graph, x, split = match.graph, match.value("x"), match.node("split")
        source = x
        target = leading + list(static_shape(match.value("merged"))[1:])
        if list(static_shape(x)) != target:  # the leading axes split otherwise than they came
            shape = graph.root.add_initializer(f"{split.name}_leading", np.array(target, dtype=np.int64))
            reshape = graph.add_node("Reshape", [x, shape], [f"{split.name}_leading_out"],
                                     name=f"{split.name}_leading", before=split)
            source = reshape.output(0)
            source.dtype, source.shape = x.dtype, tuple(target)
        return graph.add_node("Transpose", [source], [match.value("y")], attributes={"perm": perm},
                              name=match.node("transpose").name, before=split)


#: A dim as a number times the model's names (``inference.factors``), names sorted: equal dims, equal factors.
Factor = tuple[int, tuple[str, ...]]


def _factor(dim) -> Factor | None:
    found = factors(dim)
    return None if found is None else (found[0], tuple(sorted(found[1])))


def _divides(a: Factor, b: Factor) -> bool:
    left = list(b[1])
    for name in a[1]:
        if name not in left:
            return False
        left.remove(name)
    return a[0] != 0 and b[0] % a[0] == 0


def _quotient(b: Factor, a: Factor) -> Factor:
    left = list(b[1])
    for name in a[1]:
        left.remove(name)
    return b[0] // a[0], tuple(left)


UNIT: Factor = (1, ())


def common_atoms(first: list[Factor], second: list[Factor]) -> tuple[list[Factor], list[list[int]], list[list[int]]] | None:
    """The atoms two row-major shapes of one tensor regroup, and for each dim of each the atoms it holds (unit dims
    hold none); None where one dim cuts across another (neither divides the other)."""
    atoms: list[Factor] = []
    groups: tuple[list[list[int]], list[list[int]]] = ([[] for _ in first], [[] for _ in second])
    i = j = 0
    a = first[0] if first else UNIT
    b = second[0] if second else UNIT
    while i < len(first) and j < len(second):
        if a == UNIT or b == UNIT:
            if a == UNIT:
                i += 1
                a = first[i] if i < len(first) else UNIT
            if b == UNIT:
                j += 1
                b = second[j] if j < len(second) else UNIT
            continue
        if _divides(a, b):
            atom = a
        elif _divides(b, a):
            atom = b
        else:
            return None
        groups[0][i].append(len(atoms))
        groups[1][j].append(len(atoms))
        atoms.append(atom)
        a, b = _quotient(a, atom), _quotient(b, atom)
    if a != UNIT or b != UNIT or any(d != UNIT for d in first[i + 1:] + second[j + 1:]):
        return None
    return atoms, *groups


def _regroups(atoms: list[Factor], dims: list[Factor]) -> bool:
    """``dims`` are products of runs of ``atoms`` in order (no atom split)."""
    k = 0
    for dim in dims:
        number, names = 1, []
        while (number, tuple(sorted(names))) != dim:
            if k == len(atoms) or not _divides((number * atoms[k][0], tuple(sorted(names + list(atoms[k][1])))), dim):
                return False
            number, names = number * atoms[k][0], names + list(atoms[k][1])
            k += 1
    return k == len(atoms)


def _target(shape: list[Factor], source: list[Factor]) -> list[int] | None:
    """A Reshape target for ``shape`` from a tensor of ``source``'s: numbers, 0 where a named dim stays at its
    position, one -1 for the rest; None where more than one named dim moves."""
    target = []
    for position, dim in enumerate(shape):
        if not dim[1]:
            target.append(dim[0])
        elif position < len(source) and source[position] == dim:
            target.append(0)
        else:
            target.append(-1)
    return target if target.count(-1) <= 1 else None


@dataclass(frozen=True)
class AtomPlan:
    #: Reshape targets (None: no Reshape) and the atoms' perm (None: no Transpose).
    into_atoms: list[int] | None
    perm: list[int] | None
    into_result: list[int] | None
    atoms: list[Factor]
    moved: list[Factor]


#: Ops that only regroup a tensor's dims in row-major order: each a Reshape by another name.
REGROUPING = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


class AtomPermutation(Rule):
    name = "fuse_reshape_transpose_reshape_atoms"

    def build_pattern(self) -> Pattern:
        p = Pattern(self.name)
        merged = p.op(REGROUPING, p.var("x"), key="merge", out="merged")
        moved = p.Transpose(merged, key="transpose", out="moved")
        p.op(REGROUPING, moved, key="split", out="y")
        return p

    def check(self, ctx: PassContext, match: Match) -> AtomPlan | str:
        shapes = []
        for key in ("x", "merged", "y"):
            shape = match.value(key).shape
            found = None if shape is None else [_factor(d) for d in shape]
            if found is None or None in found:
                return f"the shape of {match.value(key).name!r} is not known as numbers and the model's names"
            shapes.append(found)
        x, merged, y = shapes
        if any(d[0] == 0 for d in (*x, *merged)):
            return "the tensor is empty"
        regrouped = common_atoms(x, merged)
        perm = match.node("transpose").attr("perm")
        if regrouped is None or perm is None or sorted(perm) != list(range(len(merged))):
            return "the first Reshape splits a dim of its input across two of its own"
        atoms, _, held = regrouped
        order = [atom for axis in perm for atom in held[axis]]
        moved = [atoms[k] for k in order]
        if not _regroups(moved, y):
            return "the second Reshape splits what the Transpose moved"
        into_atoms = None if atoms == x else _target(atoms, x)
        into_result = None if moved == y else _target(y, moved)
        if (atoms != x and into_atoms is None) or (moved != y and into_result is None):
            return "more than one named dim would move in a Reshape"
        nodes = (into_atoms is not None) + (order != sorted(order)) + (into_result is not None)
        if nodes >= 3:
            return "as a Transpose of atoms it still takes three nodes"
        return AtomPlan(into_atoms, order if order != sorted(order) else None, into_result, atoms, moved)

    def rewrite(self, ctx: PassContext, match: Match, plan: AtomPlan) -> list[Node]:
        graph, split, x = match.graph, match.node("split"), match.value("x")
        y, created, source = match.value("y"), [], x
        steps = [("atoms", plan.into_atoms, plan.atoms), ("transpose", plan.perm, plan.moved),
                 ("result", plan.into_result, None)]
        last = max(k for k, (_, how, _) in enumerate(steps) if how is not None)
        for k, (label, how, shape) in enumerate(steps):
            if how is None:
                continue
            out = [y] if k == last else [f"{split.name}_{label}"]
            if label == "transpose":
                node = graph.add_node("Transpose", [source], out, attributes={"perm": how},
                                      name=f"{split.name}_{label}", before=split)
            else:
                target = graph.root.add_initializer(f"{split.name}_{label}_shape", np.array(how, dtype=np.int64))
                node = graph.add_node("Reshape", [source, target], out, name=f"{split.name}_{label}", before=split)
            if k != last:
                node.output(0).dtype = x.dtype
                node.output(0).shape = tuple(product_name(n, names) for n, names in shape)
            created.append(node)
            source = node.output(0)
        return created


@register_pass(name="fuse_reshape_transpose_reshape", kind=PassKind.PROGRAM, level=1,
               description="Reshape merging leading axes -> Transpose of the trailing ones -> Reshape splitting "
                           "them again -> one Transpose (dynamo's batched matmul with a transposed operand); any "
                           "Reshape / Squeeze / Unsqueeze / Flatten -> Transpose -> one of them -> fewer nodes "
                           "where the three permute whole dims")
def fuse_reshape_transpose_reshape(ctx: PassContext) -> PassResult:
    if ctx.opset() < 5:
        return PassResult()  # Reshape keeps its shape as an attribute before opset 5
    return apply_rules(ctx, [ReshapeTransposeReshape(), AtomPermutation()])
