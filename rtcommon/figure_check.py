"""Does a figure read? Text artists that overlap each other, text cut off by the canvas or by its clip
box, and legends drawn over plotted data, measured on the figure as Agg draws it.

:func:`check_figure` draws the figure once, recording every text artist that is drawn (titles, axis
and tick labels, legend entries, annotations, bar labels, the suptitle) and every legend, then
compares their extents in display pixels. Rotated text is compared as the rotated rectangle it
fills, not its axis-aligned box, so labels slanted side by side do not count as overlapping.
"Data" under a legend is what an axes plots: line segments and markers, bar and other patches,
scatter offsets, filled areas and images.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from rtcommon.plotting import matplotlib

TOLERANCE_PX = 1.0     # extents may touch or overlap by this much (antialiasing, rounding)


@dataclass(frozen=True)
class Finding:
    """One thing that does not read: ``kind`` is "overlap", "outside canvas", "clipped" or
    "legend over data"; ``first`` and ``second`` name the two artists (``second`` may be the canvas)."""

    kind: str
    first: str
    second: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.first} / {self.second}"


@contextmanager
def _recording_texts() -> Iterator[list]:
    """Every Text drawn while the context is open (Annotation.draw calls Text.draw too)."""
    text_cls = matplotlib.text.Text
    real = text_cls.draw
    drawn: list = []

    def draw(self, renderer):
        real(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)

    text_cls.draw = draw
    try:
        yield drawn
    finally:
        text_cls.draw = real


def _short(text: str, width: int = 40) -> str:
    text = " ".join(text.split())
    return "'" + (text if len(text) <= width else text[: width - 3] + "...") + "'"


def _roles(fig) -> dict[int, tuple[str, str]]:
    """id(text) -> (what it is, where it is): ("x tick label", " of axes 1 'Table 2'"), for the texts a
    figure owns."""
    roles: dict[int, tuple[str, str]] = {}

    def put(artist, kind: str, where: str) -> None:
        if artist is not None:
            roles.setdefault(id(artist), (kind, where))

    def legend(leg, where: str) -> None:
        if leg is not None:
            put(leg.get_title(), "legend title", where)
            for t in leg.get_texts():
                put(t, "legend entry", where)

    for i, ax in enumerate(fig.axes):
        title = ax.get_title() or ax.get_title("left") or ax.get_title("right")
        where = f" of axes {i}" + (f" ({_short(title, 30)})" if title else "")
        for t in (ax.title, ax._left_title, ax._right_title):
            put(t, "title", f" of axes {i}")
        for axis, letter in ((ax.xaxis, "x"), (ax.yaxis, "y")):
            put(axis.label, f"{letter} label", where)
            put(axis.get_offset_text(), f"{letter} offset text", where)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                put(tick.label1, f"{letter} tick label", where)
                put(tick.label2, f"{letter} tick label", where)
        for t in ax.texts:
            put(t, "text", where)
        legend(ax.get_legend(), where)
    for attr, kind in (("_suptitle", "suptitle"), ("_supxlabel", "figure x label"), ("_supylabel", "figure y label")):
        put(getattr(fig, attr, None), kind, "")
    for t in fig.texts:
        put(t, "figure text", "")
    for leg in fig.legends:
        legend(leg, " of the figure")
    return roles


def text_corners(text, renderer) -> np.ndarray:
    """The four corners (display px) of the rectangle ``text`` fills, rotated with it."""
    box = text.get_window_extent(renderer)
    rotation = text.get_rotation()
    angle = rotation % 180           # a rectangle turned half a turn covers the same pixels
    if angle % 90 == 0:
        return _box_corners(box)
    # the axis-aligned box of a rotated rectangle shares its centre; its sides are the unrotated layout's
    text.set_rotation(0)
    flat = text.get_window_extent(renderer)
    text.set_rotation(rotation)
    w, h = flat.width / 2, flat.height / 2
    c, s = np.cos(np.radians(angle)), np.sin(np.radians(angle))
    local = np.array([[-w, -h], [w, -h], [w, h], [-w, h]])
    return local @ np.array([[c, s], [-s, c]]) + [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2]


def polygons_overlap(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    """Convex polygons overlap by more than ``tol`` px along every separating-axis candidate (a
    negative ``tol``: they come closer than ``-tol`` px)."""
    for poly in (a, b):
        edges = np.roll(poly, -1, axis=0) - poly
        for ex, ey in edges:
            norm = np.hypot(ex, ey)
            if norm == 0:
                continue
            axis = np.array([-ey, ex]) / norm
            pa, pb = a @ axis, b @ axis
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= tol:
                return False
    return True


def _touching_pairs(extents: np.ndarray, tol: float) -> list[tuple[int, int]]:
    """Index pairs (i < j) of boxes (x0, y0, x1, y1 rows) that overlap by more than ``tol`` both ways."""
    x0, y0, x1, y1 = extents.T
    dx = np.minimum(x1[:, None], x1[None, :]) - np.maximum(x0[:, None], x0[None, :])
    dy = np.minimum(y1[:, None], y1[None, :]) - np.maximum(y0[:, None], y0[None, :])
    i, j = np.nonzero(np.triu((dx > tol) & (dy > tol), k=1))
    return list(zip(i.tolist(), j.tolist(), strict=True))


def _box_corners(box) -> np.ndarray:
    return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])


def _inside(box, outer, tol: float) -> bool:
    return (box.x0 >= outer.x0 - tol and box.y0 >= outer.y0 - tol and box.x1 <= outer.x1 + tol
            and box.y1 <= outer.y1 + tol)


def _shrunk(box, by: float):
    """``box`` less ``by`` px on every side, or None if nothing is left."""
    x0, y0, x1, y1 = box.x0 + by, box.y0 + by, box.x1 - by, box.y1 - by
    return matplotlib.transforms.Bbox([[x0, y0], [x1, y1]]) if x1 > x0 and y1 > y0 else None


def _intersection(box, other):
    x0, y0 = max(box.x0, other.x0), max(box.y0, other.y0)
    x1, y1 = min(box.x1, other.x1), min(box.y1, other.y1)
    return matplotlib.transforms.Bbox([[x0, y0], [x1, y1]]) if x1 > x0 and y1 > y0 else None


def _segments_cross(points: np.ndarray, region) -> bool:
    """Does the polyline ``points`` (display px; non-finite points break it) enter ``region``?"""
    x0, y0, x1, y1 = region.extents
    p0, p1 = points[:-1], points[1:]
    keep = np.isfinite(p0).all(axis=1) & np.isfinite(p1).all(axis=1)
    p0, p1 = p0[keep], p1[keep]
    if not len(p0):
        return False
    d = p1 - p0
    lo, hi = np.zeros(len(p0)), np.ones(len(p0))
    ok = np.ones(len(p0), bool)
    # Liang-Barsky: the segment's parameter range inside each slab, intersected
    for p, q in ((-d[:, 0], p0[:, 0] - x0), (d[:, 0], x1 - p0[:, 0]),
                 (-d[:, 1], p0[:, 1] - y0), (d[:, 1], y1 - p0[:, 1])):
        flat = p == 0
        ok &= ~(flat & (q < 0))
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(flat, 0.0, q / np.where(flat, 1.0, p))
        lo = np.where(~flat & (p < 0), np.maximum(lo, r), lo)
        hi = np.where(~flat & (p > 0), np.minimum(hi, r), hi)
    return bool((ok & (lo <= hi)).any())


def _points_in(points: np.ndarray, region, radius: float) -> bool:
    x0, y0, x1, y1 = region.extents
    pts = points[np.isfinite(points).all(axis=1)]
    return bool(((pts[:, 0] >= x0 - radius) & (pts[:, 0] <= x1 + radius) & (pts[:, 1] >= y0 - radius)
                 & (pts[:, 1] <= y1 + radius)).any())


def _data_under(ax, box, renderer, tol: float) -> str | None:
    """What of ``ax``'s plotted data lies under ``box`` (display px), named, or None."""
    clipped = _intersection(box, ax.bbox)        # data are drawn inside the axes only
    region = _shrunk(clipped, tol) if clipped is not None else None
    if region is None:
        return None
    px_per_pt = ax.figure.dpi / 72
    for line in ax.lines:
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
        drawn = line.get_linestyle() not in ("None", "none", "", " ") and line.get_linewidth() > 0
        marker = line.get_marker() not in (None, "None", "none", "", " ")
        if (drawn and _segments_cross(xy, region)) or \
                (marker and _points_in(xy, region, line.get_markersize() * px_per_pt / 2 - tol)):
            return f"line {_short(line.get_label())}"
    for patch in ax.patches:
        if not patch.get_visible():
            continue
        extent = patch.get_window_extent(renderer)
        if extent.width > 0 and extent.height > 0 and _intersection(extent, region) is not None:
            return f"{type(patch).__name__.lower()} {_short(patch.get_label())}"
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        name = f"{type(coll).__name__} {_short(coll.get_label())}"
        if isinstance(coll, matplotlib.collections.PathCollection):      # scatter: markers at offsets
            offsets = coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), float))
            sizes = coll.get_sizes()
            radius = (np.sqrt(sizes.max()) if len(sizes) else 0.0) * px_per_pt / 2
            if len(offsets) and _points_in(offsets, region, radius - tol):
                return name
            continue
        transform = coll.get_transform()
        filled = not isinstance(coll, matplotlib.collections.LineCollection)
        for path in coll.get_paths():
            shown = transform.transform_path(path)
            if shown.intersects_bbox(region, filled=filled):
                return name
    for image in ax.images:
        if image.get_visible() and _intersection(image.get_window_extent(renderer), region) is not None:
            return "image"
    return None


def canvas_box(fig, renderer, savefig_kwargs: dict[str, Any] | None = None):
    """The canvas a save with ``savefig_kwargs`` writes, in display px: the figure, or with
    ``bbox_inches="tight"`` the artists' tight box padded by ``pad_inches``."""
    kwargs = savefig_kwargs or {}
    if kwargs.get("bbox_inches") != "tight":
        return fig.bbox
    pad = kwargs.get("pad_inches", matplotlib.rcParams["savefig.pad_inches"])
    tight = fig.get_tightbbox(renderer).padded(pad)
    return matplotlib.transforms.TransformedBbox(tight, fig.dpi_scale_trans)


def check_figure(fig, savefig_kwargs: dict[str, Any] | None = None, tol: float = TOLERANCE_PX) -> list[Finding]:
    """Lay ``fig`` out as Agg draws it and list what does not read: pairs of drawn text artists that overlap by more
    than ``tol`` px, text reaching outside the canvas ``savefig_kwargs`` would write (or cut by its clip
    box), and legends whose box covers plotted data or another text."""
    if not hasattr(fig.canvas, "get_renderer"):      # closed by pyplot: draw it on Agg again
        matplotlib.backends.backend_agg.FigureCanvasAgg(fig)
    with _recording_texts() as drawn:
        fig.draw_without_rendering()       # every artist placed as a draw places it, nothing rasterised
    renderer = fig.canvas.get_renderer()
    roles = _roles(fig)
    texts = list({id(t): t for t in drawn}.values())

    def name(t) -> str:
        kind, where = roles.get(id(t), ("text", ""))
        return f"{kind} {_short(t.get_text())}{where}"

    findings: list[Finding] = []
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    boxes = [(t, b) for t, b in boxes if b.width > 0 and b.height > 0]
    corners = {id(t): text_corners(t, renderer) for t, _ in boxes}
    extents = np.array([b.extents for _, b in boxes]).reshape(-1, 4)
    for i, j in _touching_pairs(extents, tol):
        (a, _), (b, _) = boxes[i], boxes[j]
        if polygons_overlap(corners[id(a)], corners[id(b)], tol):
            findings.append(Finding("overlap", name(a), name(b)))
    canvas = canvas_box(fig, renderer, savefig_kwargs)
    for t, box in boxes:
        clip = t.get_clip_box() if t.get_clip_on() else None
        if clip is not None and not _inside(box, clip, tol):       # what the canvas shows of it is clipped
            findings.append(Finding("clipped", name(t), "its axes"))
        elif not _inside(box, canvas, tol):
            findings.append(Finding("outside canvas", name(t), "the canvas"))
    legends = [(leg, f"legend of axes {i}") for i, ax in enumerate(fig.axes)
               if (leg := ax.get_legend()) is not None and leg.get_visible()]
    legends += [(leg, "legend of the figure") for leg in fig.legends if leg.get_visible()]
    for leg, where in legends:
        box = leg.get_window_extent(renderer)
        own = {id(t) for t in leg.get_texts()} | {id(leg.get_title())}
        for i, ax in enumerate(fig.axes):
            if ax.get_visible() and (what := _data_under(ax, box, renderer, tol)) is not None:
                findings.append(Finding("legend over data", where, f"{what} of axes {i}"))
        for t, _ in boxes:
            if id(t) not in own and polygons_overlap(_box_corners(box), corners[id(t)], tol):
                findings.append(Finding("legend over data", where, name(t)))
    return findings


__all__ = ["TOLERANCE_PX", "Finding", "canvas_box", "check_figure", "polygons_overlap", "text_corners"]
