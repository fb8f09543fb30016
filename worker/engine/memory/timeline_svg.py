"""Draw live bytes per step for each arena as a standalone SVG, the peak marked, for people who would rather look.

It reads the report's ``memory`` section (not the planner's objects), so the CLI can draw any saved report.
Plain SVG text: no plotting library, nothing to install, opens in any browser.
"""
from __future__ import annotations

from typing import Mapping, Sequence
from xml.sax.saxutils import escape

WIDTH, PANEL_HEIGHT = 900, 260
LEFT, RIGHT, TOP, BOTTOM = 90, 30, 40, 45
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def render_timeline(memory: Mapping, title: str = "live bytes per step") -> str:
    """An SVG document with one panel per planned arena and a line per unplanned reason."""
    arenas: Sequence[Mapping] = memory.get("arenas", ())
    notes = [_unplanned_text(entry) for entry in memory.get("unplanned", ())]
    height = TOP + PANEL_HEIGHT * len(arenas) + 18 * len(notes) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
             f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']
    for index, arena in enumerate(arenas):
        parts += _panel(arena, TOP + index * PANEL_HEIGHT, COLORS[index % len(COLORS)])
    y = TOP + PANEL_HEIGHT * len(arenas) + 14
    for note in notes:
        parts.append(f'<text x="{LEFT}" y="{y}" fill="#a00">{escape(note)}</text>')
        y += 18
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _panel(arena: Mapping, top: int, color: str) -> list[str]:
    timeline = list(arena["timeline"]) or [0]
    ceiling = max(max(timeline), arena["arena_bytes"], 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PANEL_HEIGHT - BOTTOM - 20
    base = top + 20 + plot_h

    def x(step: float) -> float:
        return LEFT + plot_w * step / len(timeline)

    def y(value: float) -> float:
        return base - plot_h * value / ceiling

    parts = [f'<text x="{LEFT}" y="{top + 12}" font-weight="bold">{escape(_heading(arena))}</text>',
             f'<line x1="{LEFT}" y1="{base}" x2="{LEFT + plot_w}" y2="{base}" stroke="black"/>',
             f'<line x1="{LEFT}" y1="{base}" x2="{LEFT}" y2="{base - plot_h}" stroke="black"/>']
    parts += _y_ticks(ceiling, LEFT, y)
    parts += _x_ticks(len(timeline), x, base)
    parts.append(f'<path d="{_step_path(timeline, x, y)}" fill="{color}" fill-opacity="0.25" '
                 f'stroke="{color}" stroke-width="1.2"/>')
    arena_y = y(arena["arena_bytes"])
    parts.append(f'<line x1="{LEFT}" y1="{arena_y:.1f}" x2="{LEFT + plot_w}" y2="{arena_y:.1f}" '
                 f'stroke="#555" stroke-dasharray="5,4"/>')
    parts.append(f'<text x="{LEFT + plot_w - 4}" y="{arena_y - 4:.1f}" text-anchor="end" fill="#555">'
                 f'arena {escape(human_bytes(arena["arena_bytes"]))}</text>')
    parts += _peak_marker(arena, x, y)
    return parts


def _heading(arena: Mapping) -> str:
    return (f'{arena["space"]}: arena {human_bytes(arena["arena_bytes"])}, lower bound '
            f'{human_bytes(arena["lower_bound_bytes"])}, no reuse {human_bytes(arena["naive_bytes"])}')


def _step_path(timeline: Sequence[int], x, y) -> str:
    """A filled staircase: each step's live bytes held over that step's width."""
    points = [f"M{x(0):.1f},{y(0):.1f}"]
    for step, value in enumerate(timeline):
        points.append(f"L{x(step):.1f},{y(value):.1f} L{x(step + 1):.1f},{y(value):.1f}")
    points.append(f"L{x(len(timeline)):.1f},{y(0):.1f} Z")
    return " ".join(points)


def _peak_marker(arena: Mapping, x, y) -> list[str]:
    step = arena["peak_step"]
    cx, cy = x(step + 0.5), y(arena["lower_bound_bytes"])
    label = f'peak {human_bytes(arena["lower_bound_bytes"])} at step {step}'
    if arena.get("peak_node"):
        label += f' ({arena["peak_node"]})'
    anchor = "start" if step < len(arena["timeline"]) / 2 else "end"
    dx = 8 if anchor == "start" else -8
    return [f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="red"><title>{escape(label)}</title></circle>',
            f'<text x="{cx + dx:.1f}" y="{cy + 14:.1f}" text-anchor="{anchor}" fill="red">'
            f'{escape(label)}</text>']


def _y_ticks(ceiling: int, left: int, y) -> list[str]:
    parts = []
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        value = ceiling * fraction
        parts.append(f'<text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
                     f'{escape(human_bytes(value))}</text>')
    return parts


def _x_ticks(steps: int, x, base: float) -> list[str]:
    stride = max(1, steps // 8)
    parts = [f'<text x="{x(s + 0.5):.1f}" y="{base + 16}" text-anchor="middle">{s}</text>'
             for s in range(0, steps, stride)]
    parts.append(f'<text x="{x(steps / 2):.1f}" y="{base + 34}" text-anchor="middle">step</text>')
    return parts


def _unplanned_text(entry: Mapping) -> str:
    where = entry.get("space") or entry.get("value") or entry.get("node") or "?"
    return f"not planned ({where}): {entry.get('reason', '')}"
