"""The run report's SVG line charts (alignment/training/svg_chart.py): round ticks, values placed where the axes
say, breaks at non-finite values, events inside the steps drawn, text escaped; well-formed XML throughout."""
import math
import sys
import xml.etree.ElementTree as ET

import pytest

from alignment.training.svg_chart import BOTTOM, LEFT, NAMESPACE, PANEL_HEIGHT, RIGHT, TITLE_HEIGHT, TOP, WIDTH, \
    chart_svg, nice_ticks

SVG = f"{{{NAMESPACE}}}"  # ElementTree's prefix for the SVG namespace


@pytest.mark.parametrize("low, high, whole, expected", [
    (0.1, 0.37, False, [0.1, 0.2, 0.3, 0.4]),  # 0.30000000000000004 is written 0.3
    (-2.3, 7.9, False, [-5.0, 0.0, 5.0, 10.0]),
    (5.0, 5.0, False, [4.5, 5.0, 5.5]),  # one value: +-10% around it
    (0.0, 0.0, False, [-1.0, -0.5, 0.0, 0.5, 1.0]),
    (1e-14, 3e-14, False, [1e-14, 1.5e-14, 2e-14, 2.5e-14, 3e-14]),  # not rounded to 0
    (1.0, 3.0, True, [1.0, 2.0, 3.0]),  # steps: no 1.5
    (7.0, 7.0, True, [6.0, 7.0, 8.0]),
    (-1e308, 1e308, False, [-1e308, 1e308]),  # the range overflows a float: the ends themselves
    (1.7e308, 1.7e308, False, [1.7e308 - 1.7e308 * 0.1, sys.float_info.max]),  # padded ends stay finite
])
def test_ticks_are_round_and_cover_the_range(low, high, whole, expected):
    assert nice_ticks(low, high, whole=whole) == expected


def panels(svg):
    root = ET.fromstring(svg)  # raises on malformed XML
    return root, root.findall(f"{SVG}polyline"), [t.text for t in root.findall(f"{SVG}text")]


def test_points_sit_where_the_ticks_say():
    svg = chart_svg("rewards", [("reward/mean", [(1, 0.0), (2, 0.5), (3, 1.0)])])
    root, lines, texts = panels(svg)
    assert root.get("height") == str(TITLE_HEIGHT + PANEL_HEIGHT + 10)
    points = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TITLE_HEIGHT + TOP, TITLE_HEIGHT + PANEL_HEIGHT - BOTTOM
    # y ticks 0, 0.5, 1 span the plot area; x ticks 1, 2, 3 (whole steps)
    assert points == [(x0, y1), ((x0 + x1) / 2, (y0 + y1) / 2), (x1, y0)]
    assert {"0", "0.5", "1", "2", "3", "rewards", "reward/mean"} <= set(texts) and "1.5" not in texts
    assert len(root.findall(f"{SVG}circle")) == 3


def test_a_non_finite_value_breaks_the_line_and_a_panel_without_values_says_so():
    svg = chart_svg("kl", [("kl", [(1, 0.1), (2, 0.2), (3, math.nan), (4, 0.3), (5, math.inf), (6, 0.4)]),
                           ("empty", [(1, math.nan)])])
    _, lines, texts = panels(svg)
    assert [len(line.get("points").split()) for line in lines] == [2, 1, 1]
    assert "no finite value" in texts and "nan" not in svg and "inf" not in svg


def test_events_inside_the_steps_are_red_dashed_lines_in_every_panel_and_text_is_escaped():
    series = [("a<b", [(1, 1.0), (10, 2.0)]), ("c&d", [(1, 3.0), (10, 4.0)])]
    svg = chart_svg('rewards "<&>"', series, [(4, "kl_spike"), (99, "after the run")])
    root, _, texts = panels(svg)
    dashed = [line for line in root.findall(f"{SVG}line") if line.get("stroke") == "red"]
    x = LEFT + (4 - 0) / 10 * (WIDTH - RIGHT - LEFT)  # x ticks 0, 5, 10
    assert [float(line.get("x1")) for line in dashed] == [x, x]
    assert texts.count("kl_spike") == 2 and "after the run" not in texts
    assert {'rewards "<&>"', "a<b", "c&d"} <= set(texts)
