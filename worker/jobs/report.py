"""A job's report: the engine's report as the job side publishes and serves it, with no server path in it.

The engine reports the paths it was given (the CLI prints them). A job's engine process works on server paths
the user never sees, so the runner turns the engine's report into a ``Report`` once, when it settles the
attempt: every string naming a server path is rewritten to the name the user knows (the uploaded file's name,
the artifact's download name), and only that form is ever stored. Error messages go through the same
``PathNames``. The API serves the stored report as it is.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class PathNames:
    """Server paths and the names to show for them; a path inside a mapped directory keeps its relative part."""

    def __init__(self, names: Mapping[str | Path, str]):
        # Longest first, so that a file inside a mapped directory is replaced as the file.
        self._names = sorted(((str(path), name) for path, name in names.items()), key=lambda p: -len(p[0]))

    def text(self, text: str) -> str:
        for path, name in self._names:
            text = text.replace(path, name)
        return text

    def value(self, value: Any) -> Any:
        """``value`` (JSON data) with every string rewritten."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {self.text(k): self.value(v) for k, v in value.items()}
        return value


class ModelFacts(BaseModel):
    model_config = ConfigDict(extra="allow")

    path: str | None = Field(None, description="the name the user knows the file by")
    nodes: int | None = None
    bytes: int | None = None
    external_data: str | None = Field(None, description="the name of the external weights file, if any")


class ModelPair(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: ModelFacts | None = None
    output: ModelFacts | None = None


class ReportError(ValueError):
    """The engine process wrote something that is not a report."""


class Report(BaseModel):
    """The engine's report; the parts the job side reads are typed, the rest is kept as the engine wrote it."""

    model_config = ConfigDict(extra="allow")

    version: str | None = None
    model: ModelPair = Field(default_factory=ModelPair)
    places: list[str] | None = None
    trace: list[dict[str, Any]] = Field(default_factory=list)
    verification: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    seconds: float | None = None
    #: What the run went on despite: a pass that failed and was undone (kind ``pass_failed``), ...
    warnings: list[dict[str, Any]] = Field(default_factory=list)

    @classmethod
    def from_engine(cls, data: Any, names: PathNames) -> "Report":
        """The published form of what an engine process returned."""
        if not isinstance(data, dict):
            raise ReportError(f"the engine's report is a {type(data).__name__}, not an object")
        try:
            return cls.model_validate(names.value(data))
        except ValidationError as error:
            raise ReportError(f"the engine's report does not have the expected form: {error}") from None

    @classmethod
    def from_json(cls, text: bytes | str) -> "Report":
        return cls.model_validate_json(text)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict()).encode()

    def to_dict(self) -> dict[str, Any]:
        """The report as the engine wrote it (nothing added), paths rewritten."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)

    def passes(self) -> list[dict[str, Any]]:
        """Trace entries of passes (pipeline groups, kind ``fixed_point``, have entries of their own)."""
        return [t for t in self.trace if t.get("kind") != "fixed_point"]

    def summary(self) -> dict[str, Any]:
        """The few figures worth keeping in the job row: sizes before and after, passes and rewrites,
        verification, memory; what the report lacks is None."""
        before, after = self.model.input or ModelFacts(), self.model.output or ModelFacts()
        verification = self.verification or None
        outputs = (verification or {}).get("outputs") or []
        diffs = [o.get("max_abs_diff") for o in outputs if isinstance(o, Mapping)]
        diffs = [d for d in diffs if _is_number(d)]
        passes = self.passes()
        return {
            "nodes_before": before.nodes,
            "nodes_after": after.nodes,
            "bytes_before": before.bytes,
            "bytes_after": after.bytes,
            "external_data": bool(after.external_data),
            "passes_run": sum(1 for t in passes if not t.get("skipped")),
            "rewrites": sum(int(t.get("rewrites") or 0) for t in passes),
            "places": self.places,
            # False when verification ran but proved nothing (published only with option allow_unverified)
            "verified": verification.get("passed") is True if verification else None,
            "max_abs_diff": max(diffs) if diffs else None,
            **_memory_figures(self.memory or {}),
            "seconds": self.seconds,
            "pass_failures": sum(1 for w in self.warnings if w.get("kind") == "pass_failed"),
            **_readable((self.model_extra or {}).get("summary")),
        }


#: The parts of the engine's readable summary a job row keeps (the figures above cover the rest).
READABLE_PARTS = ("op_types", "nodes_per_place", "casts", "cast_bytes", "host_fallbacks", "memory_spaces",
                  "placement", "warnings", "macs_unknown", "precision_fallback", "storage_fallback")


def _readable(summary: Any) -> dict[str, Any]:
    """Op types before/after, nodes per place, casts (count and bytes), host fallbacks, memory per space, the
    placement cost and warnings."""
    if not isinstance(summary, Mapping):
        return {}
    return {key: summary[key] for key in READABLE_PARTS if key in summary}


def _memory_figures(memory: Mapping[str, Any]) -> dict[str, Any]:
    """Planned activation bytes and weight bytes over all memory spaces, and total MACs."""
    arenas = [a for a in memory.get("arenas") or [] if isinstance(a, Mapping)]
    weights, macs = memory.get("weights_bytes"), memory.get("macs")
    return {"arena_bytes": _total(a.get("arena_bytes") for a in arenas),
            "weights_bytes": _total(weights.values()) if isinstance(weights, Mapping) else None,
            "macs": macs.get("total") if isinstance(macs, Mapping) else None}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _total(values: Iterable[Any]) -> int | None:
    """The sum of the numbers (over memory spaces), None when there are none."""
    numbers = [v for v in values if _is_number(v)]
    return sum(numbers) if numbers else None
