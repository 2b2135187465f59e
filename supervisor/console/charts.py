"""The overview's small chart: turns ended per second and their p50 latency over the last ten
minutes, as an inline SVG (no script, no style attribute: the page's Content-Security-Policy
allows neither). Pure: buckets in, markup out; the markup holds only numbers we format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from supervisor.console.live import BUCKET_S, Bucket

__all__ = ["throughput_svg"]

_W: Final = 600
_H: Final = 120
_PAD: Final = 4


def throughput_svg(buckets: Sequence[Bucket]) -> str:
    """Bars: turns ended per second in each bucket; a line: the bucket's p50 latency (own scale,
    right). Both scales' maxima are written in the corners."""
    if not buckets:
        return ""
    rates = [b.ended / BUCKET_S for b in buckets]
    p50s = [b.percentile(0.5) for b in buckets]
    top_rate = max(*rates, 1.0)
    known = [p for p in p50s if p is not None]
    top_ms = max(*known, 1.0) if known else 1.0
    step = (_W - 2 * _PAD) / len(buckets)
    height = _H - 2 * _PAD - 14
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="turns per second'
        f' and p50 latency, last {len(buckets) * BUCKET_S // 60} minutes">'
    ]
    for i, rate in enumerate(rates):
        if rate <= 0:
            continue
        h = rate / top_rate * height
        x = _PAD + i * step
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{_H - _PAD - h:.1f}" width="{max(step - 1, 1):.1f}"'
            f' height="{h:.1f}"><title>{rate:.1f} turns/s</title></rect>'
        )
    points = [
        f"{_PAD + (i + 0.5) * step:.1f},{_H - _PAD - p / top_ms * height:.1f}"
        for i, p in enumerate(p50s)
        if p is not None
    ]
    if len(points) > 1:
        parts.append(f'<polyline class="line" fill="none" points="{" ".join(points)}"/>')
    parts.append(f'<text class="axis" x="{_PAD}" y="12">{top_rate:,.0f} turns/s</text>')
    parts.append(
        f'<text class="axis line-label" x="{_W - _PAD}" y="12" text-anchor="end">'
        f"p50 {top_ms:,.0f} ms</text>"
    )
    parts.append("</svg>")
    return "".join(parts)
