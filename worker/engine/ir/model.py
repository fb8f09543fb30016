"""A model: the main graph plus everything of ModelProto that the writer must give back."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.engine.ir.graph import Graph


@dataclass
class Model:
    graph: Graph
    ir_version: int
    opset_imports: dict[str, int]
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    #: Model-local functions of the input, as FunctionProto (no pass rewrites their bodies).
    functions: list[Any] = field(default_factory=list)
    #: Calls of model-local functions the loader replaced by their bodies, per (domain, name, overload).
    inlined_functions: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: Parts of ModelProto no pass reads (training_info, configuration), kept for the writer.
    extra: dict[str, Any] = field(default_factory=dict)
    #: Bytes of the external data files the input's weights were read from (0: all in the model file).
    external_data_bytes: int = 0
    #: The files the weights are mapped from (``tensors.MappedFile``), whose pages ``release_pages`` drops.
    mapped_files: list[Any] = field(default_factory=list)

    def opset(self, domain: str = "") -> int:
        """The imported opset version of a domain ("" and "ai.onnx" are the same), 0 when not imported."""
        if domain in ("", "ai.onnx"):
            return self.opset_imports.get("", self.opset_imports.get("ai.onnx", 0))
        return self.opset_imports.get(domain, 0)

    def node_count(self) -> int:
        return len(self.graph)

    def release_pages(self) -> None:
        """Drop the pages of the mapped weight files from the process's resident set (the page cache keeps
        them, and a weight read again maps them again): what a pass read through the mapping does not stay in
        the resident set for the rest of the run. The kernel maps whole readahead windows (megabytes) on a
        fault, so even sampling a few elements per weight would otherwise add up to the whole model."""
        for mapped in self.mapped_files:
            mapped.release(0, len(mapped))

    def function_keys(self) -> set[tuple[str, str]]:
        return {(f.domain, f.name) for f in self.functions}
