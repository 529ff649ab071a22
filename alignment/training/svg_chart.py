"""Line charts as SVG text, for the run report: one panel per metric stacked in a page, the monitors' events as red
dashed lines. Written directly rather than through matplotlib, whose import and layout took ~2 s of every run's
end (five pages) while this takes milliseconds and needs no package; browsers, GitHub and editors' Markdown
previews show SVG where they show PNG."""
from __future__ import annotations

import itertools
import math
import sys
from typing import List, Sequence, Tuple
from xml.sax.saxutils import escape

NAMESPACE = "http://www.w3.org/2000/svg"
WIDTH, PANEL_HEIGHT, TITLE_HEIGHT = 640, 190, 34
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 26, 30  # a panel's margins around its plot area, in pixels
FONT = 'font-family="sans-serif"'


def nice_ticks(low: float, high: float, count: int = 5, whole: bool = False) -> List[float]:
    """Round tick values (1, 2 or 5 x 10^k apart; whole numbers if `whole`) covering [low, high] (finite) with about
    `count` ticks; [low, high] itself where the range is too wide or too fine for floats to step through."""
    if not high > low:
        pad = abs(low) * 0.1 or 1.0
        low, high = max(low - pad, -sys.float_info.max), min(high + pad, sys.float_info.max)
    rough = (high - low) / max(count - 1, 1)
    if not 0 < rough < math.inf:
        return [low, high]
    power = 10.0 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    step = max(step, 1.0) if whole else step
    first = math.floor(low / step + 1e-9) * step
    digits, ticks = max(0, 1 - math.floor(math.log10(step))), []
    for k in range(2 * count + 2):
        value = first + k * step
        ticks.append(round(value, digits) + 0.0)  # round: 0.30000000000000004 -> 0.3; + 0.0: -0.0 -> 0.0
        if value >= high - step * 1e-9:
            return ticks if ticks[0] < ticks[-1] < math.inf else [low, high]
    return [low, high]


def label(value: float) -> str:
    return f"{value:.4g}"


def panel(key: str, points: Sequence[Tuple[float, float]], events: Sequence[Tuple[float, str]],
          top: float) -> List[str]:
    """The SVG elements of one metric's panel whose top edge is at y = top. Non-finite values are left out (the
    line breaks there)."""
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, top + TOP, top + PANEL_HEIGHT - BOTTOM  # the plot area
    parts = [f'<text x="{WIDTH / 2}" y="{top + 16}" text-anchor="middle" font-size="12" {FONT}>{escape(key)}</text>',
             f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="white" stroke="#444"/>']
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    if not finite:
        return parts + [f'<text x="{(x0 + x1) / 2}" y="{(y0 + y1) / 2}" text-anchor="middle" font-size="11" '
                        f'{FONT}>no finite value</text>']
    xs = nice_ticks(min(s for s, _ in points), max(s for s, _ in points), whole=True)  # steps
    ys = nice_ticks(min(v for _, v in finite), max(v for _, v in finite))

    def to_x(step: float) -> float:
        return round(x0 + (step - xs[0]) / (xs[-1] - xs[0]) * (x1 - x0), 2)

    def to_y(value: float) -> float:
        return round(y1 - (value - ys[0]) / (ys[-1] - ys[0]) * (y1 - y0), 2)

    for tick in ys:
        y = to_y(tick)
        parts += [f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#ddd"/>',
                  f'<text x="{x0 - 4}" y="{y + 4}" text-anchor="end" font-size="10" {FONT}>{label(tick)}</text>']
    for tick in xs:
        x = to_x(tick)
        parts += [f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" stroke="#eee"/>',
                  f'<text x="{x}" y="{y1 + 14}" text-anchor="middle" font-size="10" {FONT}>{label(tick)}</text>']
    for is_finite, stretch in itertools.groupby(points, key=lambda point: math.isfinite(point[1])):
        if is_finite:
            line = " ".join(f"{to_x(s)},{to_y(v)}" for s, v in stretch)
            parts.append(f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>')
    if len(finite) < 30:
        parts += [f'<circle cx="{to_x(s)}" cy="{to_y(v)}" r="2.5" fill="#1f77b4"/>' for s, v in finite]
    for step, name in (event for event in events if xs[0] <= event[0] <= xs[-1]):
        x = to_x(step)
        parts += [f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" stroke="red" stroke-dasharray="5,3"/>',
                  f'<text x="{x - 3}" y="{y0 + 4}" transform="rotate(-90 {x - 3} {y0 + 4})" text-anchor="end" '
                  f'font-size="9" fill="red" {FONT}>{escape(name)}</text>']
    return parts


def chart_svg(title: str, series: Sequence[Tuple[str, Sequence[Tuple[float, float]]]],
              events: Sequence[Tuple[float, str]] = ()) -> str:
    """An SVG page: `title`, then one panel per (metric name, [(step, value), ...]), the x axis the step; each
    (step, name) of `events` a red dashed line in every panel."""
    height = TITLE_HEIGHT + PANEL_HEIGHT * len(series) + 10
    parts = [f'<svg xmlns="{NAMESPACE}" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}">', f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
             f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15" {FONT}>{escape(title)}</text>']
    for i, (key, points) in enumerate(series):
        parts += panel(key, points, events, TITLE_HEIGHT + i * PANEL_HEIGHT)
    return "\n".join(parts + ["</svg>"]) + "\n"
