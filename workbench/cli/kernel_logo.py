"""The workbench kernel's logo: four ranks in a ring, as the launcher's kernel icon.

JupyterLab's launcher shows ``logo-svg.svg`` (or ``logo-64x64.png``) from a kernel spec's
directory. The logo is drawn here from one description (four rounded squares, one per rank,
joined by a ring) as SVG text and as PNGs (written with zlib alone: no imaging library is
a dependency), so the package ships no binary files.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

__all__ = ["LOGO_FILES", "logo_png", "logo_svg", "write_logos"]

# The four ranks (the stepper's phase colors) at the corners of a 64-unit square.
_RANKS = (
    (8, 8, "#1f77b4"),
    (36, 8, "#ff7f0e"),
    (36, 36, "#2ca02c"),
    (8, 36, "#d62728"),
)
_SIDE = 20  # a rank's square
_RADIUS = 4  # its rounded corners
_RING = "#555555"  # the ring that joins them (a collective)
_RING_WIDTH = 3
LOGO_FILES = ("logo-svg.svg", "logo-32x32.png", "logo-64x64.png")


def logo_svg() -> str:
    squares = "".join(
        f'<rect x="{x}" y="{y}" width="{_SIDE}" height="{_SIDE}" rx="{_RADIUS}" fill="{c}"/>'
        for x, y, c in _RANKS
    )
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64" width="64" height="64">'
        f'<rect x="18" y="18" width="28" height="28" fill="none" stroke="{_RING}" '
        f'stroke-width="{_RING_WIDTH}"/>{squares}</svg>\n'
    )


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _pixel(u: float, v: float) -> tuple[int, int, int, int]:
    """The logo's color at (u, v) in 64-unit coordinates; transparent outside it."""
    for x, y, color in _RANKS:
        dx = max(x + _RADIUS - u, 0, u - (x + _SIDE - _RADIUS))
        dy = max(y + _RADIUS - v, 0, v - (y + _SIDE - _RADIUS))
        if x <= u <= x + _SIDE and y <= v <= y + _SIDE and dx * dx + dy * dy <= _RADIUS**2:
            return (*_rgb(color), 255)
    half = _RING_WIDTH / 2
    on_ring = (abs(u - 18) <= half or abs(u - 46) <= half) and 18 - half <= v <= 46 + half
    on_ring |= (abs(v - 18) <= half or abs(v - 46) <= half) and 18 - half <= u <= 46 + half
    return (*_rgb(_RING), 255) if on_ring else (0, 0, 0, 0)


def logo_png(size: int) -> bytes:
    """The logo as a ``size`` x ``size`` RGBA PNG (each pixel sampled at its center)."""
    scale = 64 / size
    rows = b"".join(
        b"\x00"
        + bytes(c for col in range(size) for c in _pixel((col + 0.5) * scale, (row + 0.5) * scale))
        for row in range(size)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def write_logos(folder: Path) -> list[Path]:
    """Write ``LOGO_FILES`` into a kernel spec's folder; returns their paths."""
    svg, small, large = (folder / name for name in LOGO_FILES)
    svg.write_text(logo_svg())
    small.write_bytes(logo_png(32))
    large.write_bytes(logo_png(64))
    return [svg, small, large]
