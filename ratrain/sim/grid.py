"""A simulated step as a text grid, like the pipeline figures of the Megatron and zero-bubble papers.

One row per stage, one column per time bucket of ``bucket_ms`` from 0 to the end of the last
main-path op (B or W). A cell shows the op whose compute task covers the bucket's midpoint, as
``ratrain.sim.pipeline_order.op_token`` writes it (``F3``, ``B0``, ``W2``; ``F0.1`` under
interleaving, chunk after the dot), and ``.`` when the stage's compute runs no F, B or W then (idle,
or recovery and lifecycle tasks, which the figures leave out). Every cell is as wide as the widest
token, so columns line up.

The default bucket is the shortest F/B/W op of the step (its layers' tasks together), so each op
shows at least once, widened until at most ``max_columns`` columns remain.
"""
from __future__ import annotations

from bisect import bisect_right

from ratrain.errors import ConfigError
from ratrain.sim.pipeline_order import op_token

MAIN_KINDS = ("F", "B", "W")


def _chunk_of(result) -> dict[int, int]:
    """Global layer -> stage-local chunk (0 unless the step was interleaved)."""
    pipe = result.pipeline
    layers = sum(len(ls) for ls in result.stage_layers)
    if pipe.chunks_per_stage == 1:
        return {layer: 0 for layer in range(layers)}
    P = len(result.stage_layers)
    return {layer: g // P for g, r in enumerate(pipe.chunks(layers, P)) for layer in r}


def _op_spans(result) -> list[list[tuple[float, float, str]]]:
    """Per stage, its F/B/W ops as (start, end, token), by start: an op's per-layer tasks merged
    while they run back to back (a task between them, e.g. a promoted recovery, splits it)."""
    P = len(result.stage_layers)
    chunk = _chunk_of(result)
    chunked = result.pipeline.chunks_per_stage > 1
    spans: list[list[tuple[float, float, str]]] = [[] for _ in range(P)]
    for t in result.tasks:
        if t.kind in MAIN_KINDS and t.resource == "compute":
            spans[t.stage].append((t.start_ms, t.end_ms, op_token((t.kind, t.microbatch, chunk[t.layer]), chunked)))
    out = []
    for s in spans:
        merged: list[tuple[float, float, str]] = []
        for a, b, tok in sorted(s):
            if merged and merged[-1][2] == tok and a <= merged[-1][1] + 1e-9:
                merged[-1] = (merged[-1][0], b, tok)
            else:
                merged.append((a, b, tok))
        out.append(merged)
    return out


def format_grid(result, bucket_ms: float | None = None, max_columns: int = 200) -> str:
    """The step's F/B/W ops per stage on a time grid (see the module docstring)."""
    if isinstance(max_columns, bool) or not isinstance(max_columns, int) or max_columns < 1:
        raise ConfigError(f"grid: max_columns must be an integer >= 1, got {max_columns!r}")
    spans = _op_spans(result)
    ops = [(a, b) for s in spans for a, b, _ in s]
    if not ops:
        return "(no F/B/W tasks to draw)"
    end = max(b for _, b in ops)
    if bucket_ms is None:
        bucket_ms = min(b - a for a, b in ops if b > a) if any(b > a for a, b in ops) else end
        bucket_ms = max(bucket_ms, end / max_columns)
    elif not bucket_ms > 0:
        raise ConfigError(f"grid: bucket_ms must be > 0, got {bucket_ms!r}")
    # a bucket of width exactly end / n would round up to n + 1 columns on floating-point noise
    columns = max(1, min(max_columns, round(end / bucket_ms + 0.5 - 1e-9)))
    cells: list[list[str]] = []
    for s in spans:
        starts = [a for a, _, _ in s]
        row = []
        for i in range(columns):
            mid = (i + 0.5) * bucket_ms
            j = bisect_right(starts, mid) - 1
            row.append(s[j][2] if j >= 0 and s[j][1] > mid else ".")
        cells.append(row)
    width = max(len(c) for row in cells for c in row)
    label = len(f"S{len(spans) - 1}")
    lines = [f"grid: one column per {bucket_ms:g} ms, {columns} columns to {end:g} ms; '.' = no F/B/W"]
    for p, row in enumerate(cells):
        lines.append(f"{f'S{p}':<{label}} | " + " ".join(f"{c:<{width}}" for c in row).rstrip())
    return "\n".join(lines)


__all__ = ["MAIN_KINDS", "format_grid"]
