"""The pass trace as a standalone SVG timeline: one row per pass that took time, its bar where and how long it ran.

For people who would rather look than open Perfetto: the job page shows it. Like the memory timeline it reads
only the report (``trace`` entries with ``start`` and ``seconds``, see ``trace_events``), so any saved report
can be drawn. Fixed-point groups get a band behind their passes; passes faster than ``MIN_SHARE`` of the run
are summed into one row so that a 200-entry trace stays readable; hovering a bar shows its figures.
"""
from __future__ import annotations

from typing import Any, Mapping
from xml.sax.saxutils import escape

from worker.engine.trace_events import timed_entries

WIDTH, ROW, LEFT, RIGHT, TOP = 900, 16, 230, 20, 40
MIN_SHARE = 0.002
COLORS = {"program": "#4e79a7", "stmt": "#59a14f", "debug": "#9c755f", "fixed_point": "#f1ce63"}


def render_trace(report: Mapping[str, Any], title: str = "passes over time") -> str:
    """An SVG document: a row per pass (in order of first run), bars for each run of it, a time axis."""
    timed = [(entry, start, duration) for entry, start, duration in timed_entries(report.get("trace") or [])
             if not entry.get("skipped")]
    end = max((start + duration for _, start, duration in timed), default=0) or 1
    rows: dict[str, list[tuple[Mapping[str, Any], int, int]]] = {}
    groups = []
    for entry, start, duration in timed:
        if entry.get("kind") == "fixed_point":
            groups.append((entry, start, duration))
        else:
            rows.setdefault(str(entry.get("pass")), []).append((entry, start, duration))
    shown = {name: runs for name, runs in rows.items() if sum(d for _, _, d in runs) >= MIN_SHARE * end}
    hidden = [run for name, runs in rows.items() if name not in shown for run in runs]
    height = TOP + ROW * (len(shown) + (1 if hidden else 0)) + 40
    scale = (WIDTH - LEFT - RIGHT) / end
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" '
             f'font-size="11">', f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
             f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']
    for entry, start, duration in groups:
        x, w = LEFT + start * scale, max(duration * scale, 1)
        parts.append(f'<rect class="group" x="{x:.1f}" y="{TOP - 4}" width="{w:.1f}" height="{height - TOP - 32}" '
                     f'fill="{COLORS["fixed_point"]}" opacity="0.25"><title>{escape(_tip(entry, duration))}</title>'
                     f'</rect>')
    y = TOP
    for name, runs in shown.items():
        parts.append(f'<text x="{LEFT - 6}" y="{y + 11}" text-anchor="end">{escape(name)}</text>')
        for entry, start, duration in runs:
            parts.append(_bar(entry, start, duration, scale, y))
        y += ROW
    if hidden:
        total = sum(d for _, _, d in hidden)
        parts.append(f'<text x="{LEFT - 6}" y="{y + 11}" text-anchor="end" fill="#666">{len(hidden)} faster runs '
                     f'({total / 1e6:.3f} s)</text>')
        for entry, start, duration in hidden:
            parts.append(_bar(entry, start, duration, scale, y))
        y += ROW
    parts += _axis(end, scale, y + 6)
    parts.append("</svg>")
    return "\n".join(parts)


def _bar(entry: Mapping[str, Any], start: int, duration: int, scale: float, y: int) -> str:
    colour = COLORS.get(str(entry.get("kind")), "#888888")
    return (f'<rect class="pass" x="{LEFT + start * scale:.1f}" y="{y + 2}" width="{max(duration * scale, 1):.1f}" '
            f'height="{ROW - 4}" fill="{colour}"><title>{escape(_tip(entry, duration))}</title></rect>')


def _tip(entry: Mapping[str, Any], duration: int) -> str:
    text = f"{entry.get('pass')}: {duration / 1e6:.4f} s"
    if entry.get("iteration"):
        text += f", round {entry['iteration']}"
    if entry.get("rewrites"):
        text += f", {entry['rewrites']} rewrite(s)"
    if entry.get("nodes_after") is not None:
        text += f", nodes {entry.get('nodes_before')} -> {entry['nodes_after']}"
    return text


def _axis(end: int, scale: float, y: int) -> list[str]:
    seconds = end / 1e6
    step = next((s for s in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200)
                 if seconds / s <= 10), 500)
    parts = [f'<line x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}" stroke="#333"/>']
    tick = 0.0
    while tick <= seconds + 1e-9:
        x = LEFT + tick * 1e6 * scale
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#333"/>')
        parts.append(f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{tick:g} s</text>')
        tick += step
    return parts
