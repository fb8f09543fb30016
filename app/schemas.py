"""What the API answers, apart from how jobs are stored (``worker.jobs.store``)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStatus = Literal["queued", "running", "succeeded", "failed", "canceled"]


class JobProgress(BaseModel):
    current_pass: str = Field(description="the pass the engine is running (or has just finished)")
    index: int = Field(description="1-based position of that pass")
    total: int = Field(description="passes in this run")


class JobInput(BaseModel):
    filename: str
    bytes: int
    sha256: str


class JobArtifact(BaseModel):
    bytes: int
    sha256: str = Field(description="also the artifact's strong ETag")
    url: str
    data_url: str | None = Field(None, description="a model over 2 GB keeps its weights in a second file: "
                                                   "save it beside the model under the name its "
                                                   "Content-Disposition gives")
    archive_url: str | None = Field(None, description="the model and its external data (if any) as one tar, "
                                                      "resumable with Range")


class JobError(BaseModel):
    type: str = Field(description="kind of failure, e.g. ModelError, OptionsError, VerificationError")
    message: str
    field: str | None = Field(None, description="the option or request field at fault, when there is one")


class OpTypeCount(BaseModel):
    op: str = Field(description="op type, domain-qualified outside the default domain")
    before: int
    after: int


class HostFallback(BaseModel):
    op: str
    place: str = Field(description="the host place the nodes landed on")
    nodes: int
    examples: list[str] = Field(description="a few of the nodes")
    reason: str = Field(description="why no place the user listed runs them")
    kind: str | None = Field(None, description="the kind of reason: no kernel, precision, layout, constraints, "
                                               "rewrite (an op a rewrite made), plan (a listed place applied, the placement "
                                               "plan chose the host), pick (a listed place applied)")
    user_place_possible: int | None = Field(None, description="how many of the nodes a place the user listed "
                                                              "could have run (each is also a warning)")


class MemorySpace(BaseModel):
    space: str
    weights_bytes: int | None = None
    arena_bytes: int | None = Field(None, description="planned activation memory")
    lower_bound_bytes: int | None = Field(None, description="no plan over this execution order does better")
    ratio: float | None = None
    paddle_lite_style_bytes: int | None = None
    no_reuse_bytes: int | None = None
    peak_step: int | None = None
    peak_node: str | None = None


class CastFigures(BaseModel):
    count: int | None = None
    bytes: int | None = Field(None, description="bytes the casts write")


class PlacementCost(BaseModel):
    cost: float | None = Field(None, description="the kernel pick's plan: compute and casts, in the cost model's units")
    greedy_cost: float | None = Field(None, description="Paddle-Lite's greedy per-node pick on the same graph")
    lower_bound: float | None = Field(None, description="every node on its cheapest kernel, no cast: no plan does better")
    method: str | None = Field(None, description="exact (chains and trees) or local search from the greedy pick")
    casts: CastFigures | None = None
    greedy_casts: CastFigures | None = None


class PrecisionFallback(BaseModel):
    nodes: list[str] = Field(description="nodes kept in fp32 because the model did not verify with them in fp16 "
                                         "or int8")
    precisions: list[str] = Field(default_factory=list, description="the precisions they were taken out of "
                                                                    "(fp16, int8)")
    runs: int | None = Field(None, description="verification runs auto mixed precision took to find them")
    seconds: float | None = None


class StorageFallback(BaseModel):
    weights: list[str] = Field(description="weights kept in fp32 because the model did not verify with them "
                                           "stored in fp16")
    runs: int | None = Field(None, description="verification runs the storage fallback took to find them")
    seconds: float | None = None


class JobSummary(BaseModel):
    model_config = ConfigDict(extra="allow")

    nodes_before: int | None = None
    nodes_after: int | None = None
    bytes_before: int | None = None
    bytes_after: int | None = None
    external_data: bool | None = Field(None, description="the weights are in a second file (artifact.data_url)")
    passes_run: int | None = None
    rewrites: int | None = None
    places: list[str] | None = None
    verified: bool | None = None
    max_abs_diff: float | None = None
    arena_bytes: int | None = Field(None, description="planned activation memory, all memory spaces together")
    weights_bytes: int | None = None
    macs: int | None = Field(None, description="multiply-accumulates of one run; null when any node's count is "
                                                "unknown (macs_unknown says why)")
    macs_unknown: list[str] | None = Field(None, description="why MACs are unknown: the distinct reasons, each "
                                                             "with a node it applies to")
    seconds: float | None = None
    op_types: list[OpTypeCount] | None = Field(None, description="top-level nodes per op type, before and after")
    nodes_per_place: dict[str, int] | None = None
    casts: dict[str, int] | None = Field(None, description="io_copy, calib and layout casts inserted")
    cast_bytes: dict[str, int | None] | None = Field(None, description="bytes the casts of each kind write "
                                                                       "(null when a shape is not static)")
    host_fallbacks: list[HostFallback] | None = Field(None, description="nodes on a host place the user did not "
                                                      "list, by op, with the reason")
    memory_spaces: list[MemorySpace] | None = None
    placement: PlacementCost | None = Field(None, description="the cost of the kernel pick against the greedy pick")
    precision_fallback: PrecisionFallback | None = Field(
        None, description="auto mixed precision (option precision_fallback): with fp16 or int8 places, the fewest "
                          "nodes kept in fp32 for the output to verify; the report's precision_fallback says why each")
    storage_fallback: StorageFallback | None = Field(
        None, description="with option fp16_storage (and precision_fallback): the fewest weights kept in fp32 for "
                          "the output to verify; the report's storage_fallback says why each")
    warnings: list[str] | None = Field(None, description="what the run went on despite: a pass that failed and "
                                                         "was undone (the trace has the details), a plugin that "
                                                         "failed to load, a skipped verification")
    pass_failures: int | None = Field(None, description="passes that failed and were undone; the job succeeded "
                                                        "without them")


class CallbackOut(BaseModel):
    url: str
    state: Literal["pending", "delivered", "failed"] = Field(description="pending until the job ends and the "
                                                             "receiver answers 2xx; failed after the last try")
    attempts: int
    next_at: datetime | None = Field(None, description="when the next try is due, while pending")
    delivered_at: datetime | None = None
    last_error: str | None = Field(None, description="why the latest try did not succeed")


class JobLinks(BaseModel):
    self: str
    artifact: str
    trace: str
    memory: str
    report: str
    cancel: str


class JobOut(BaseModel):
    id: str
    status: JobStatus
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempt: int = Field(description="attempts started so far (a killed worker's job is retried)")
    max_attempts: int
    cancel_requested: bool
    progress: JobProgress | None
    places: str
    options: dict[str, Any]
    input: JobInput
    artifact: JobArtifact | None
    error: JobError | None
    retry_reason: str | None = Field(description="why the latest retry happened, if any")
    summary: JobSummary | None
    cached: bool = Field(False, description="the job reused the result of an earlier job with the same model, "
                         "places, options and engine, and ran no attempt (option cache=false opts out)")
    cached_from: str | None = Field(None, description="the id of the job whose result a cached job reuses; the "
                                    "cached job keeps its own copy, so deleting that job does not affect it")
    links: JobLinks


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int
    next_offset: int | None


class TraceEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    pass_: str = Field(alias="pass")
    kind: str | None = None
    skipped: Any = None
    seconds: float | None = None
    rewrites: int | None = None


class PassInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    kind: str
    description: str
    level: int
    targets: list[str] | None
    position: int | None
    peer: str | None = Field(None, description="the optimizer whose pass this one reproduces (onnxoptimizer, "
                                               "onnxruntime, Paddle-Lite, ncnn, NNVM); none for mirserve's own")


class FilterInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    kind: str = Field(description="filter, pre_callback or post_callback")
    description: str
    level: int
    origin: str = Field(description="the plugin file, or the package and entry point, that registered it")
    stage: str = Field(description="the filter stage pass that runs it")
    priority: int | None = Field(None, description="filters only: lower runs first")
    binds: str | None = Field(None, description="filters only: the op type, or every node")


class FilterBand(BaseModel):
    name: str
    priorities: list[int] = Field(description="lowest and highest priority of the band")
    stage: str
    runs: str


class PipelineInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str
    origin: str
    passes: list[str] | None = Field(description="none when the pipeline chooses its passes per run")


class PluginInfo(BaseModel):
    origin: str
    found_by: str = Field(description="MIRSERVE_PLUGIN_PATH, entry point or --plugin")
    status: Literal["loaded", "failed"]
    error: str | None = Field(description="why it failed to load; nothing it registered is kept")
    provides: dict[str, list[str]] = Field(description="what it registered (or tried to), by kind")


class PassCatalog(BaseModel):
    """What the engine can run: passes, plugin filters and callbacks, pipelines, and every plugin found."""

    passes: list[PassInfo]
    filters: list[FilterInfo]
    filter_bands: list[FilterBand]
    pipelines: list[PipelineInfo]
    plugins: list[PluginInfo]


class KernelInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    op: str = Field(description="the op, domain-qualified outside the default domain")
    since: int | None = Field(None, description="first opset version the kernel covers")
    until: int | None = Field(None, description="last opset version it covers (none: still current)")
    precision: str
    layout: str


class TargetInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    memory_space: str
    description: str | None = None
    origin: str | None = None
    source: str | None = Field(None, description="where the target's kernel table comes from")
    kernel_count: int
    kernels: list[KernelInfo] | None = Field(None, description="omitted with kernels=false")


class Check(BaseModel):
    ok: bool
    detail: str


class Readiness(BaseModel):
    status: Literal["ready"]
    checks: dict[str, Check]
    plugins: list[PluginInfo] = Field(default_factory=list, description="every plugin found; one that failed "
                                      "is listed with its error and does not make the service unready")


class Liveness(BaseModel):
    status: Literal["ok"]
    version: str
