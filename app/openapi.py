"""The OpenAPI document: FastAPI's, with every error documented as problem+json.

FastAPI documents validation errors with its own ``HTTPValidationError`` schema; this service answers them
as problems, so those entries are replaced. ``openapi/openapi.json`` is this document, committed; a test
fails when the two differ (regenerate with ``mirserve openapi -o openapi/openapi.json``).
"""
from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.problems import PROBLEM_MEDIA_TYPE, Problem, problem_responses

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi


def build_openapi(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(problem.pop("$defs", {}))
    components["Problem"] = problem
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            responses = operation.setdefault("responses", {})
            if "422" in responses:
                responses["422"] = problem_responses(422)[422]
            for status, entry in problem_responses().items():
                responses.setdefault(str(status), entry)
            operation["responses"] = dict(sorted(responses.items()))  # router-wide entries come first otherwise
    return schema


def render(app: FastAPI) -> str:
    """The document as committed: indented, key order kept, ending in a newline."""
    return json.dumps(app.openapi(), indent=2, ensure_ascii=False) + "\n"


__all__ = ["PROBLEM_MEDIA_TYPE", "build_openapi", "install_openapi", "render"]
