"""The PNG summary: training and generation ratios, memory ratios against
length, op cost against length (log-log).

Uses matplotlib (Agg backend) when it is installed. Without it a plain
PNG is still written (same four panels, no text labels) by a tiny
rasteriser, so the harness works in a bare install; the markdown table
carries the numbers either way.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple

PALETTE = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
]
GREY, BLACK, RED = (200, 200, 200), (0, 0, 0), (220, 0, 0)
PANEL_PAD = 30  # pixels between a fallback panel's edge and its axes


def _ratio_rows(section: Dict[str, dict]) -> List[Tuple[str, float, float, float]]:
    rows = []
    for key, r in section.items():
        ratio = r.get("ratio")
        if ratio:
            rows.append((key, ratio["median"], ratio["min"], ratio["max"]))
    return rows


def _panels(results: dict):
    """Plot data independent of the backend."""
    train = {**results.get("train", {}).get("translation", {}), **results.get("train", {}).get("lm", {})}
    generate = {**results.get("generate", {}).get("translation", {}), **results.get("generate", {}).get("lm", {})}
    memory = {
        key: [(int(n), v) for n, v in r["ratio"].items()]
        for key, r in results.get("memory", {}).items()
        if r.get("ratio") and r["kind"] != "baseline"
    }
    op_rows = list(results.get("ops", {}).values())
    # a run with --op-modes fwd has no fwd+bwd rows: plot what it timed
    plotted = [r for r in op_rows if r["mode"] == "fwd+bwd"] or op_rows
    ops = {r["op"]: [(int(n), s["median"]) for n, s in r["seconds_per_call"].items()] for r in plotted}
    return _ratio_rows(train), _ratio_rows(generate), memory, ops


def write_plot(results: dict, path: Path, targets: Optional[Dict[str, float]] = None) -> str:
    """Write the PNG; returns the backend used ("matplotlib" or "fallback")."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _fallback_plot(results, path)
        return "fallback"
    train, generate, memory, ops = _panels(results)
    targets = targets or {}
    fig, axes = plt.subplots(2, 2, figsize=(15, 11))
    _ratio_panel(axes[0][0], train, "Training throughput vs vanilla fairseq", "tokens/s ratio", targets)
    _ratio_panel(axes[0][1], generate, "Beam-5 generation vs vanilla fairseq", "sentences/s ratio", targets)
    _memory_panel(axes[1][0], memory)
    _ops_panel(axes[1][1], ops)
    machine = results.get("machine", {})
    fig.suptitle(
        f"fairseq-distattn benchmark - {machine.get('cpu', '')}, {machine.get('torch_threads')} thread(s), "
        f"torch {machine.get('torch')}, scale {results.get('meta', {}).get('scale')}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return "matplotlib"


def _ratio_panel(ax, rows: list, title: str, metric: str, targets: Dict[str, Dict[str, float]]) -> None:
    """Horizontal bars of each candidate's ratio to vanilla (median, min-max), a red tick at its target."""
    if rows:
        names = [r[0] for r in rows]
        y = list(range(len(rows)))
        med = [r[1] for r in rows]
        err = [[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]]
        ax.barh(
            y,
            med,
            xerr=err,
            color=[f"#{c[0]:02x}{c[1]:02x}{c[2]:02x}" for c in PALETTE * 3][: len(rows)],
            alpha=0.8,
            capsize=3,
        )
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linewidth=1)
        for i, name in enumerate(names):
            if name in targets.get(title, {}):
                ax.plot([targets[title][name]] * 2, [i - 0.4, i + 0.4], color="red", linewidth=2)
    ax.set_title(title)
    ax.set_xlabel(f"{metric} (median, min-max)" + ("; red: target" if targets.get(title) else ""))
    ax.grid(axis="x", alpha=0.3)


def _memory_panel(ax, memory: Dict[str, list]) -> None:
    """Peak memory ratio to vanilla against sequence length, with the 1.10 target."""
    for name, points in memory.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.axhline(1.10, color="red", linestyle="--", linewidth=1, label="target 1.10")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_title("Peak memory (forward+backward) vs vanilla")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("peak memory ratio")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _ops_panel(ax, ops: Dict[str, list]) -> None:
    """Each attention op's time per call against length, log-log; sdpa drawn heavier."""
    for name, points in ops.items():
        style = dict(color="black", linewidth=2.5) if name == "sdpa" else dict()
        ax.plot([p[0] for p in points], [p[1] * 1e3 for p in points], marker="o", label=name, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title("Attention ops, forward+backward (log-log)")
    ax.set_xlabel("length L")
    ax.set_ylabel("ms per call")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3, which="both")


# --------------------------------------------------------------------------- fallback rasteriser


class _Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def set(self, x: int, y: int, color):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x0, y0, x1, y1, color):
        for y in range(int(min(y0, y1)), int(max(y0, y1)) + 1):
            for x in range(int(min(x0, x1)), int(max(x0, x1)) + 1):
                self.set(x, y, color)

    def line(self, x0, y0, x1, y1, color, width: int = 1):
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            for o in range(width):
                self.set(x0 + o, y0, color)
                self.set(x0, y0 + o, color)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        )


def _fallback_plot(results: dict, path: Path, width: int = 800, height: int = 600):
    """The four panels of ``write_plot`` on a 2 x 2 grid, without text."""
    train, generate, memory, ops = _panels(results)
    canvas = _Canvas(width, height)
    pw, ph = width // 2, height // 2
    _bar_panel(canvas, _axes(canvas, 0, 0, pw, ph), train)
    _bar_panel(canvas, _axes(canvas, pw, 0, pw, ph), generate)
    _line_panel(canvas, _axes(canvas, 0, ph, pw, ph), memory, log_y=False)
    _line_panel(canvas, _axes(canvas, pw, ph, pw, ph), ops, log_y=True)
    canvas.line(pw, 0, pw, height, GREY)
    canvas.line(0, ph, width, ph, GREY)
    path.write_bytes(canvas.png())


def _axes(canvas: "_Canvas", px: int, py: int, pw: int, ph: int) -> Tuple[int, int, int, int]:
    """Draws the x and y axes of the panel at (px, py); returns its plot box (x0, y0, x1, y1)."""
    x0, y0, x1, y1 = px + PANEL_PAD, py + PANEL_PAD, px + pw - PANEL_PAD, py + ph - PANEL_PAD
    canvas.line(x0, y1, x1, y1, BLACK)
    canvas.line(x0, y0, x0, y1, BLACK)
    return x0, y0, x1, y1


def _bar_panel(canvas: "_Canvas", box: Tuple[int, int, int, int], rows: list) -> None:
    """``_ratio_panel`` without labels: a bar per median ratio, its min-max as a line, a red line at 1."""
    if not rows:
        return
    x0, y0, x1, y1 = box
    scale = (x1 - x0) / max(1.2, max(r[3] for r in rows) * 1.05)
    step = (y1 - y0) / len(rows)
    for i, (_, med, low, high) in enumerate(rows):
        yy = y0 + i * step
        canvas.rect(x0, yy + step * 0.15, x0 + med * scale, yy + step * 0.85, PALETTE[i % len(PALETTE)])
        canvas.line(x0 + low * scale, yy + step / 2, x0 + high * scale, yy + step / 2, BLACK)
    canvas.line(x0 + scale, y0, x0 + scale, y1, RED)


def _line_panel(canvas: "_Canvas", box: Tuple[int, int, int, int], series: Dict[str, list], log_y: bool) -> None:
    """One polyline per series over log x (and log y when ``log_y``); sdpa in black."""
    points = [p for s in series.values() for p in s if p[1] > 0]
    if not points:
        return
    x0, y0, x1, y1 = box
    xs = [math.log(p[0]) for p in points]
    ys = [math.log(p[1]) if log_y else p[1] for p in points]
    lo_x, hi_x = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    lo_y, hi_y = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1

    def to_px(p):
        v = math.log(p[1]) if log_y else p[1]
        return x0 + (math.log(p[0]) - lo_x) / (hi_x - lo_x) * (x1 - x0), y1 - (v - lo_y) / (hi_y - lo_y) * (y1 - y0)

    for i, (name, s) in enumerate(series.items()):
        color = BLACK if name == "sdpa" else PALETTE[i % len(PALETTE)]
        pts = [to_px(p) for p in s if p[1] > 0]
        for a, b in zip(pts, pts[1:]):
            canvas.line(a[0], a[1], b[0], b[1], color, width=2)
