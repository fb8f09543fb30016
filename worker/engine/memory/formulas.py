"""Memory of a model whose input dims are open, as formulas of those dims: plans at several sizes, a polynomial
fitted to them, checked against plans at other sizes.

Every buffer's size is a product of dims (``batch * seq * 768 * 4``, ``batch * heads * seq * seq * 4``), so the
live bytes of every step, hence the peak, and the io bytes are sums of such monomials, and the arena (the
planner packs those buffers) follows them closely. The monomials come from the buffers themselves: a value's
size at the base sizes and with one dim doubled gives its exponent in that dim. The arena and the peak of each
memory space and the io bytes are fitted over those monomials by least squares to plans at enough sizes, then
planned again at sizes the fit did not see (every dim x3 and x4) to measure the formula's error there.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from worker.engine.errors import OptionsError

#: Plans a fit may use (each is a type inference and a memory plan of the whole graph).
MAX_FIT_SAMPLES = 10
#: Multiples of the base sizes the formulas are checked at.
CHECK_FACTORS = (3, 4)
#: An exponent read off two sizes must be this close to an integer to count as one.
EXPONENT_SLACK = 0.02

Point = Mapping[str, int]
Monomial = tuple[int, ...]


@dataclass
class Sample:
    """One plan: per space arena and peak bytes (None where unplanned), io bytes, and every value's bytes."""

    arena: dict[str, int | None]
    peak: dict[str, int | None]
    io: int | None
    sizes: dict[str, int | None] = field(default_factory=dict)


def fit_memory(plan_at: Callable[[dict[str, int]], Sample], base: Point,
               plan_between: Callable[[dict[str, int]], Sample | None] | None = None) -> dict:
    """Formulas for the arena and peak of each space and for the io bytes, over the dims of ``base``.

    ``plan_at`` plans at the base, with each dim doubled and at the check points, in that order; the other
    points the fit needs go to ``plan_between`` first, which may plan them at less cost (it has seen those
    plans; it returns None where it cannot), else to ``plan_at``."""
    dims = list(base)
    cache: dict[tuple, Sample] = {}

    def at(point: Point, between: bool = False) -> Sample:
        key = tuple(point[d] for d in dims)
        if key not in cache:
            found = plan_between(dict(point)) if between and plan_between is not None else None
            cache[key] = found if found is not None else plan_at(dict(point))
        return cache[key]

    doubled = [{**base, d: 2 * base[d]} for d in dims]
    basis = _monomials(at(base), [at(p) for p in doubled], len(dims))
    fit_points = [dict(base)] + doubled
    for factors in itertools.product((1, 2, 3), repeat=len(dims)):
        if len(fit_points) >= min(len(basis) + 1, MAX_FIT_SAMPLES):
            break
        point = {d: base[d] * f for d, f in zip(dims, factors)}
        if point not in fit_points:
            fit_points.append(point)
    check_points = [{d: base[d] * f for d in dims} for f in CHECK_FACTORS]
    checked = [at(p) for p in check_points]
    fitted = [at(p, between=p != base and p not in doubled) for p in fit_points]
    spaces = sorted({s for sample in fitted for s in sample.arena})
    result = {"dims": dims, "base": dict(base), "spaces": {}, "planned_at": fit_points, "checked_at": check_points}
    for space in spaces:
        result["spaces"][space] = {
            "arena_bytes": _fit(dims, basis, fit_points, [s.arena.get(space) for s in fitted],
                                check_points, [s.arena.get(space) for s in checked]),
            "peak_bytes": _fit(dims, basis, fit_points, [s.peak.get(space) for s in fitted],
                               check_points, [s.peak.get(space) for s in checked]),
        }
    result["io_bytes"] = _fit(dims, basis, fit_points, [s.io for s in fitted], check_points, [s.io for s in checked])
    return result


def _monomials(base: Sample, doubled: Sequence[Sample], count: int) -> list[Monomial]:
    """The exponent vectors of the values' sizes, the constant included (degree, then order)."""
    found: set[Monomial] = {(0,) * count}
    for name, size in base.sizes.items():
        if not size:
            continue
        exponents = []
        for other in doubled:
            bigger = other.sizes.get(name)
            if not bigger:
                break
            exponent = math.log2(bigger / size)
            if abs(exponent - round(exponent)) > EXPONENT_SLACK or round(exponent) < 0:
                break
            exponents.append(round(exponent))
        else:
            found.add(tuple(exponents))
    return sorted(found, key=lambda m: (sum(m), m))


def _fit(dims: list[str], basis: list[Monomial], points: list[Point], values: list[int | None],
         check_points: list[Point], checks: list[int | None]) -> dict:
    """Least-squares integer coefficients over ``basis``, and the largest relative error at the check points."""
    if any(v is None for v in values):
        return {"formula": None, "reason": "not planned at every size (see the plan's unplanned entries)"}
    matrix = np.array([[_value(m, p, dims) for m in basis] for p in points], dtype=np.float64)
    coefficients, *_ = np.linalg.lstsq(matrix, np.array(values, dtype=np.float64), rcond=None)
    terms = [(int(round(c)), m) for c, m in zip(coefficients, basis) if int(round(c)) != 0]
    errors = [abs(evaluate_terms(terms, p, dims) - v) / max(v, 1)
              for p, v in zip(check_points, checks) if v is not None]
    return {"formula": formula_text(terms, dims),
            "terms": [[c, {d: e for d, e in zip(dims, m) if e}] for c, m in terms],
            "fitted": dict(zip(_keys(points, dims), values)),
            "max_relative_error": round(max(errors), 6) if errors else None}


def _keys(points: list[Point], dims: list[str]) -> list[str]:
    return [",".join(f"{d}={p[d]}" for d in dims) for p in points]


def _value(monomial: Monomial, point: Point, dims: list[str]) -> float:
    return float(math.prod(point[d] ** e for d, e in zip(dims, monomial)))


def evaluate_terms(terms, point: Point, dims: Sequence[str] | None = None) -> int:
    """The bytes a formula gives at ``point``; ``terms`` as fitted, or as reported ([coefficient, {dim: exp}])."""
    total = 0
    for coefficient, monomial in terms:
        if isinstance(monomial, Mapping):
            total += coefficient * math.prod(point[d] ** e for d, e in monomial.items())
        else:
            total += coefficient * math.prod(point[d] ** e for d, e in zip(dims, monomial))
    return int(total)


def formula_text(terms, dims: list[str]) -> str:
    """``3072*batch*seq + 196608``: terms by degree, highest first; powers as ``seq^2``."""
    if not terms:
        return "0"
    parts = []
    for coefficient, monomial in sorted(terms, key=lambda t: -sum(t[1])):
        factors = [d if e == 1 else f"{d}^{e}" for d, e in zip(dims, monomial) if e]
        parts.append("*".join([str(abs(coefficient))] + factors) if factors else str(abs(coefficient)))
        parts[-1] = ("- " if coefficient < 0 else "+ ") + parts[-1]
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def parse_dims(text: str, known: Sequence[str]) -> dict[str, int]:
    """``batch=8,seq=512`` -> {"batch": 8, "seq": 512}; every dim of ``known`` must be given, nothing else."""
    values: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, number = part.rpartition("=")
        if not sep or not name:
            raise OptionsError(f"bad dims {text!r}: expected NAME=N,NAME=N,...", field="dims")
        try:
            values[name.strip()] = int(number)
        except ValueError:
            raise OptionsError(f"bad dims {text!r}: {number!r} is not an integer", field="dims") from None
        if values[name.strip()] < 0:
            raise OptionsError(f"bad dims {text!r}: dims must not be negative", field="dims")
    unknown = sorted(set(values) - set(known))
    missing = [d for d in known if d not in values]
    if unknown or missing:
        problem = f"{unknown[0]!r} is not one of them" if unknown else f"{', '.join(missing)} missing"
        raise OptionsError(f"bad dims {text!r}: the model's open dims are {', '.join(known)}; {problem}",
                           field="dims")
    return values


def memory_at(section: Mapping, text: str) -> dict:
    """The memory figures of a planned model at the dims in ``text`` (``batch=8,seq=512``), from its formulas."""
    symbolic = section.get("symbolic")
    if not symbolic:
        raise OptionsError("the model's inputs have no open dims: its memory does not depend on any", field="dims")
    dims = symbolic["dims"]
    point = parse_dims(text, dims)
    arenas = []
    for space, fits in symbolic["spaces"].items():
        entry = {"space": space}
        for key in ("arena_bytes", "peak_bytes"):
            fit = fits[key]
            entry[key] = evaluate_terms(fit["terms"], point) if fit.get("formula") is not None else None
            entry[key.replace("bytes", "formula")] = fit.get("formula")
        arenas.append(entry)
    io = symbolic.get("io_bytes") or {}
    sampled = symbolic["planned_at"] + symbolic["checked_at"]
    return {"dims": point, "arenas": arenas, "weights_bytes": section.get("weights_bytes"),
            "io_bytes": evaluate_terms(io["terms"], point) if io.get("formula") is not None else None,
            "io_formula": io.get("formula"), "planned_at": symbolic["base"],
            # dims beyond every size planned: the formula extrapolates there
            "extrapolated": [d for d in dims if point[d] > max(p[d] for p in sampled)]}
