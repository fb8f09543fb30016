"""A job's spec: what it asks of the engine, its places and its options, validated once when it is accepted.

The spec travels whole: the API validates it with the engine's own checks and stores it, the runner hands it
to the engine process as it is, and the engine reads it as ``OptimizeOptions`` (whose ``places`` it is). The
result cache and the Idempotency-Key compare requests by the fingerprint of the spec and the model.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

@dataclass(frozen=True)
class JobSpec:
    places: str
    #: Every other engine option, as the engine's ``OptimizeOptions.to_dict()`` writes them (defaults filled).
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Whether the job may reuse the artifact of an earlier job with the same model and spec.
    cache: bool = True

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        """The stored form back (``to_dict``)."""
        return cls(places=data["places"], options=data.get("options") or {}, cache=bool(data.get("cache", True)))

    def to_dict(self) -> dict[str, Any]:
        return {"places": self.places, "options": dict(self.options), "cache": self.cache}

    @classmethod
    def validate(cls, places: str | None, options: Mapping[str, Any]) -> "JobSpec":
        """The spec of a submission, checked as the engine will check it (without the model). Options the
        service reserves for itself are refused before this, by whoever accepts submissions; ``cache``
        (true or false: may the job reuse an earlier job's result) is the spec's own, not the engine's.

        Raises the engine's ``OptionsError`` naming the field; ``places`` None means the engine's default.
        """
        from worker.engine.api import OptimizeOptions, validate_options
        from worker.engine.errors import OptionsError

        if "places" in options:
            raise OptionsError("places are given apart from the other options", field="places")
        values = {k: v for k, v in options.items() if k != "cache"}
        cache = options.get("cache", True)
        if not isinstance(cache, bool):
            raise OptionsError(f"cache must be true or false, not {cache!r}", field="cache")
        if places is not None:
            values["places"] = places
        parsed = OptimizeOptions.from_dict(values)
        validate_options(parsed)
        engine_options = parsed.to_dict()
        return cls(places=engine_options.pop("places"), options=engine_options, cache=cache)

    def engine_options(self) -> dict[str, Any]:
        """The dict the engine reads as ``OptimizeOptions``."""
        return {**self.options, "places": self.places}

    def fingerprint(self, input_sha256: str) -> str:
        """A digest of this spec applied to the model with this sha256: equal requests share it (the order of
        the options does not matter)."""
        text = json.dumps({"sha256": input_sha256, "places": self.places, "options": dict(self.options)},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()
