"""Prometheus text exposition for ``GET /metrics``: request counters and latencies kept by this process,
job and worker figures read from the job table at scrape time (so they are right across processes).
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from typing import Callable, Iterable

#: The methods counted by name; any other (a client may send any token) is counted as "other".
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The route label of a request no route matched (its raw path is never a label: clients choose it).
UNMATCHED = "unmatched"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + text + "}" if text else ""


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Counter:
    def __init__(self, name: str, help_text: str, label_names: tuple[str, ...] = ()):
        self.name, self.help, self.label_names = name, help_text, label_names
        self._values: dict[tuple[str, ...], float] = defaultdict(float)
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        with self._lock:
            self._values[labels] += amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.label_names:
            items = [((), 0.0)]
        for labels, value in items:
            lines.append(f"{self.name}{_labels(zip(self.label_names, labels))} {value:g}")
        return lines


class Histogram:
    def __init__(self, name: str, help_text: str, label_names: tuple[str, ...], buckets=LATENCY_BUCKETS):
        self.name, self.help, self.label_names, self.buckets = name, help_text, label_names, buckets
        self._series: dict[tuple[str, ...], list] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            series = self._series.setdefault(labels, [[0] * len(self.buckets), 0, 0.0])
            index = bisect.bisect_left(self.buckets, value)
            if index < len(self.buckets):
                series[0][index] += 1
            series[1] += 1
            series[2] += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            items = sorted((k, ([*v[0]], v[1], v[2])) for k, v in self._series.items())
        for labels, (counts, total, value_sum) in items:
            pairs = list(zip(self.label_names, labels))
            cumulative = 0
            for bound, count in zip(self.buckets, counts):
                cumulative += count
                lines.append(f"{self.name}_bucket{_labels(pairs + [('le', f'{bound:g}')])} {cumulative}")
            lines.append(f"{self.name}_bucket{_labels(pairs + [('le', '+Inf')])} {total}")
            lines.append(f"{self.name}_sum{_labels(pairs)} {value_sum:.6f}")
            lines.append(f"{self.name}_count{_labels(pairs)} {total}")
        return lines


class Metrics:
    def __init__(self):
        self.requests = Counter("mirserve_http_requests_total", "HTTP requests answered, by route and status.",
                                ("method", "route", "status"))
        # By route alone: a route template has one or two methods, and each label set costs 19 lines.
        self.latency = Histogram("mirserve_http_request_duration_seconds",
                                 "Time to answer an HTTP request, by route.", ("route",))
        self.jobs_submitted = Counter("mirserve_jobs_submitted_total", "Jobs accepted by this API process.")
        self.upload_bytes = Counter("mirserve_upload_bytes_total", "Model bytes accepted by this API process.")
        self.started = time.time()

    def render(self, gauges: Callable[[], list[str]]) -> str:
        lines = ["# HELP mirserve_process_start_time_seconds When this API process started (Unix time).",
                 "# TYPE mirserve_process_start_time_seconds gauge",
                 f"mirserve_process_start_time_seconds {self.started:.3f}"]
        for metric in (self.requests, self.latency, self.jobs_submitted, self.upload_bytes):
            lines.extend(metric.render())
        lines.extend(gauges())
        return "\n".join(lines) + "\n"


def request_labels(scope) -> tuple[str, str]:
    """(method, route) labels of a request, from a bounded set whatever the client sent: a known method or
    "other", a route template or "unmatched"."""
    method = scope.get("method", "GET")
    route = getattr(scope.get("route"), "path", None)
    return (method if method in KNOWN_METHODS else "other"), (route or UNMATCHED)


class MetricsMiddleware:
    """Counts and times every request by its method and route template (``request_labels``: label values from
    clients would grow the exposition without bound), and tells the client how long the server took in a
    ``Server-Timing: app;dur=<ms>`` header."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                took = (time.perf_counter() - started) * 1000
                message = {**message, "headers": [*message.get("headers", []),
                                                   (b"server-timing", f"app;dur={took:.2f}".encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            method, template = request_labels(scope)
            self.metrics.requests.inc(1, method, template, str(status["code"]))
            self.metrics.latency.observe(time.perf_counter() - started, template)
