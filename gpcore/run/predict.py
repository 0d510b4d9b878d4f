"""Prediction columns of a run, kernel slices over its grid, and streamed prediction over any number of cells
with bounded memory.

:func:`grid_predictions` defines the columns of a run's ``grid.parquet``: ``cell_id, lon, lat, mean_t, sd_t,
width_t, mean, lower, upper, width, sd`` (model space ``_t``; the others back-transformed to the data's units).

:func:`stream_predict` is a function of (model, source, sink): cells come ``batch_size`` at a time from a source
(:class:`gpcore.data.grid.RegularGrid`, generated row by row, or :class:`gpcore.data.grid.ParquetGrid`, read
by row groups), are predicted, and go to a sink (:func:`gpcore.data.export.open_sink`: Parquet/CSV writers,
one row group per batch, or GeoTIFF windows of whole raster rows). Peak memory is one batch plus the model,
whatever the number of cells (docs/scaling.md).

Under ``torchrun --nproc_per_node=N`` batch ``k`` is predicted by rank ``k mod N`` (each process on its own
GPU when there are GPUs) into a part file; rank 0 then stitches the parts, in order, into the sink.

A run fitted with time as an input (``RunConfig.time_input``, docs/methods/spacetime.md) takes ``(lon, lat, t)``,
``t`` in decimal years: :func:`run_inputs` builds them from a frame (its own time column, or one quarter ``at``
for every row), :func:`quarter_grid_predictions` predicts its grid at every quarter of its data, and
:class:`TimeSlice` makes it a ``(lon, lat)`` model at one time for the streamed prediction.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpcore import metrics as M
from gpcore.errors import ConfigError, DataError, GPCoreError

DEFAULT_BATCH = 65536


@dataclass
class KernelCache:
    """Per-grid kernel pieces: ``slicer(x_ref) -> k(grid, x_ref)`` and, on first use, ``k(x, x)`` on the grid."""

    slicer: object
    grid_X: np.ndarray
    model: object
    _diag: np.ndarray | None = None

    @property
    def diag(self) -> np.ndarray:
        """Prior variance ``k(x, x)`` at every grid cell (computed once, for the correlation view)."""
        if self._diag is None:
            self._diag = self.model.kernel_diag(self.grid_X)
        return self._diag

    def slice(self, x_ref, mode: str = "kernel") -> np.ndarray:
        """``k(grid, x_ref)``; ``mode`` "correlation" divides by ``sqrt(k(x,x) k(x_ref,x_ref))``,
        "max" by the largest ``|k|`` over the grid (the paper's Fig. 5)."""
        k = self.slicer(np.asarray(x_ref, dtype=float))
        if mode == "correlation":
            k_ref = float(self.model.kernel_diag(np.asarray(x_ref, dtype=float)[None, :])[0])
            with np.errstate(invalid="ignore", divide="ignore"):
                return k / np.sqrt(np.maximum(self.diag, 1e-300) * max(k_ref, 1e-300))
        if mode == "max":
            m = float(np.max(np.abs(k))) or 1.0
            return k / m
        return k


def grid_predictions(model, grid, transform, level: float = 0.95, t=None) -> pd.DataFrame:
    """Predict on grid centres; transformed-space mean/sd plus back-transformed map columns. ``t``: for a model
    with time as its last input, the decimal year of every cell (a number) or of each cell (``(n,)``); None for a
    spatial model."""
    Xg = grid[["lon", "lat"]].to_numpy(dtype=np.float64)
    pred = model.predict(Xg if t is None else np.column_stack([Xg, np.broadcast_to(np.asarray(t, float), len(Xg))]))
    lo_t, hi_t = pred.interval(level)
    out = pd.DataFrame(
        {
            "cell_id": grid["cell_id"].to_numpy(),
            "lon": Xg[:, 0],
            "lat": Xg[:, 1],
            "mean_t": pred.mean,
            "sd_t": pred.sd,
            "width_t": hi_t - lo_t,
            "mean": transform.inverse(pred.mean),
            "lower": transform.inverse(lo_t),
            "upper": transform.inverse(hi_t),
        }
    )
    out["width"] = out["upper"] - out["lower"]
    out["sd"] = out["sd_t"] if transform.name == "identity" else (out["upper"] - out["lower"]) / (2 * M.Z95)
    return out


def input_columns(time_input: bool) -> tuple[str, ...]:
    """The frame columns a run's model takes: ``lon, lat`` and, with time as an input, ``time_year``."""
    return ("lon", "lat", "time_year") if time_input else ("lon", "lat")


def run_time_at(cfg, at: str | None, what: str = "--at") -> float | None:
    """The decimal year of quarter ``at`` for a run with time as an input (None when ``at`` is None); an error
    naming ``what`` when the run has no time input."""
    from gpcore.data.temporal import parse_quarter

    if at is None:
        return None
    if not _time_input(cfg):
        raise ConfigError(f"{what} {at}: this run was not fitted with time as an input, so it has no time to predict "
                          "at; drop the flag or fit with --time-input")
    return parse_quarter(at, what)


def _time_input(cfg) -> bool:
    return bool(cfg.get("time_input") if isinstance(cfg, dict) else getattr(cfg, "time_input", False))


def place_inputs(places, t: float | None = None, d: int | None = None) -> np.ndarray:
    """The model inputs of ``places`` (rows with ``lon``, ``lat``): ``(lon, lat)``, or with ``t`` (decimal years)
    ``(lon, lat, t)`` for a run with time as an input. ``d``: the model's input count, to name a missing ``t``."""
    X = places[["lon", "lat"]].to_numpy(float)
    if t is None:
        if d is not None and d == X.shape[1] + 1:
            raise GPCoreError("this run takes time as an input (lon, lat, t): say at which quarter (--at 2023Q4)")
        return X
    return np.column_stack([X, np.full(len(X), float(t))])


def run_inputs(cfg, gdf, at: float | None = None) -> np.ndarray:
    """Model inputs of a run (``cfg`` a :class:`RunConfig` or its dict) at the rows of a frame read by
    ``read_measurements``: ``(lon, lat)``, or with time as an input ``(lon, lat, t)`` with ``t`` = ``at`` (decimal
    years) for every row or else the rows' own time column."""
    X = gdf[["lon", "lat"]].to_numpy(dtype=np.float64)
    if not _time_input(cfg):
        return X
    if at is None:
        if "time_year" not in gdf.columns:
            raise DataError("this run takes time as an input and the data has no time column: give --at QUARTER "
                            "(e.g. --at 2024Q1) or a file with a quarter or date column")
        t = gdf["time_year"].to_numpy(dtype=np.float64)
    else:
        t = np.full(len(X), float(at))
    return np.column_stack([X, t])


class TimeSlice:
    """A model with time as its last input, seen as a ``(lon, lat)`` model at the decimal year ``t``: ``predict``
    appends ``t`` to every row (what the streamed prediction calls)."""

    def __init__(self, model, t: float):
        self.model, self.t = model, float(t)

    def predict(self, X, batch_size: int | None = None, **kw):
        X = np.asarray(X, dtype=np.float64)
        return self.model.predict(np.column_stack([X, np.full(len(X), self.t)]), batch_size, **kw)


def quarter_grid_predictions(model, grid, transform, t, level: float = 0.95) -> dict[str, pd.DataFrame]:
    """:func:`grid_predictions` at the middle of every quarter of the decimal years ``t`` (the run's rows), keyed
    by quarter label (``"2019Q1"``; labels sort in time)."""
    from gpcore.data.temporal import quarter_index, quarter_label, quarter_middle

    quarters = np.unique(quarter_index(t[np.isfinite(t)]))
    return {quarter_label(q): grid_predictions(model, grid, transform, level, t=quarter_middle(int(q)))
            for q in quarters}


def time_summary(cfg, t, quarter_grids: dict | None, column: str | None = None) -> dict:
    """The manifest's ``time`` record: the time column, the quarters of the data, whether t is an input, the
    forecast test period, and the quarter of ``grid.parquet`` (the latest) and of the per-quarter grids."""
    from gpcore.data.temporal import quarter_index, quarter_label

    quarters = [quarter_label(q) for q in np.unique(quarter_index(t[np.isfinite(t)]))]
    return {"column": column or cfg.time, "input": bool(cfg.time_input), "quarters": quarters,
            "t_min": float(np.nanmin(t)) if len(t) else None, "t_max": float(np.nanmax(t)) if len(t) else None,
            "test_period": cfg.test_period if cfg.split == "forecast" else None,
            "grid_quarter": max(quarter_grids) if quarter_grids else None,
            "grid_quarters": sorted(quarter_grids) if quarter_grids else []}


def predict_points(run_dir, data: str, *, quarter: str | None = None, allow_drop: bool = True,
                   at: str | None = None) -> pd.DataFrame:
    """A stored run's :func:`grid_predictions` at the rows of a data file (held in memory). For a run with time as
    an input, ``at`` (a quarter, ``"2024Q1"``) is the time of every row; without it each row's own time column."""
    from gpcore import data as D
    from gpcore.run.store import load_run

    manifest, model = load_run(run_dir)
    cfg = manifest["config"]
    t_at = run_time_at(cfg, at)
    gdf = D.read_measurements(D.resolve_data(data), quarter=quarter, allow_drop=allow_drop,
                              time=cfg.get("time") if _time_input(cfg) and at is None else None)
    if "cell_id" not in gdf.columns:
        gdf["cell_id"] = range(len(gdf))
    X = run_inputs(cfg, gdf, t_at)
    frame = pd.DataFrame({"cell_id": gdf["cell_id"].to_numpy(), "lon": X[:, 0], "lat": X[:, 1]})
    tr = D.get_transform(cfg.get("transform", "identity"))
    if X.shape[1] == 2:
        return grid_predictions(model, frame, tr)
    out = grid_predictions(model, frame, tr, t=X[:, 2])
    out.insert(3, "t", X[:, 2])
    return out


def predict_columns(model, chunk, transform, level: float = 0.95) -> dict[str, np.ndarray]:
    """The :func:`grid_predictions` columns for one chunk of cells."""
    frame = pd.DataFrame({"cell_id": chunk.cell_id, "lon": chunk.X[:, 0], "lat": chunk.X[:, 1]})
    out = grid_predictions(model, frame, transform, level)
    return {c: out[c].to_numpy() for c in out.columns}


def rank_cells(total: int, batch_size: int, rank: int, world: int) -> int:
    """Cells that ``rank`` predicts when batches of ``batch_size`` rows go round-robin over ``world`` ranks (batch
    ``k`` to rank ``k mod world``; the last batch may be short): the progress total of a source that cannot count
    its own chunks (a grid source with ``rank_cells`` counts them exactly).

    >>> rank_cells(10, 3, 0, 2), rank_cells(10, 3, 1, 2)
    (6, 4)
    """
    n_batches = -(-total // batch_size)
    return sum(min(batch_size, total - k * batch_size) for k in range(rank, n_batches, world))


@dataclass
class StreamResult:
    path: Path
    cells: int
    rows_written: int
    seconds: float
    world_size: int = 1

    @property
    def cells_per_second(self) -> float:
        return self.cells / self.seconds if self.seconds > 0 else float("inf")


def stream_predict(model, source, sink, transform=None, *, batch_size: int = DEFAULT_BATCH, level: float = 0.95,
                   progress=None, ctx=None, tags: dict | None = None) -> StreamResult:
    """Predict every cell of ``source`` into ``sink`` (a sink, or a file path :func:`open_sink` opens).

    ``progress(total, label)`` makes a progress reporter with ``update(cells)`` and ``close()`` (rank 0 only;
    e.g. the CLI's terminal bar); ``None`` reports nothing. ``ctx`` (a :class:`gpcore.distributed.DistContext`)
    shards batches over ranks; every rank must call this with the same arguments; the result (and the file) is
    complete on rank 0.
    """
    from gpcore.data.export import open_sink
    from gpcore.data.transforms import get_transform

    if isinstance(sink, (str, os.PathLike)):
        sink = open_sink(sink, source, tags)
    transform = get_transform(transform)
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    world = ctx.world_size if ctx is not None else 1
    rank = ctx.rank if ctx is not None else 0
    t0 = time.perf_counter()
    total = source.n_cells
    bar = _Silent()
    if progress and rank == 0:
        count = getattr(source, "rank_cells", None)  # exact where the source knows its chunks (RegularGrid)
        share = count(batch_size, 0, world) if count else rank_cells(total, batch_size, 0, world)
        bar = progress(share, "cells" if world == 1 else f"cells (rank 0 of {world})")
    if world == 1:
        complete = False
        try:
            for chunk in source.chunks(batch_size):
                sink.write(predict_columns(model, chunk, transform, level), chunk)
                bar.update(len(chunk.cell_id))
            complete = True
        finally:
            sink.close(complete)
            bar.close()
        return StreamResult(sink.path, total, sink.rows, time.perf_counter() - t0)

    # distributed: each rank writes its batches (all rows, plus the inside mask) to a part file
    from gpcore import distributed as D
    from gpcore.data.export import TableSink

    parts = sink.path.with_name(sink.path.name + ".parts")
    if rank == 0:
        if parts.exists():
            shutil.rmtree(parts)
        parts.mkdir(parents=True)
    D.barrier(ctx)
    part = TableSink(parts / f"part-{rank:05d}.parquet", "parquet")
    try:
        for chunk in source.chunks(batch_size, rank, world):
            cols = predict_columns(model, chunk, transform, level)
            if chunk.inside is not None:
                cols["_inside"] = chunk.inside
            part.write(cols)
            bar.update(len(chunk.cell_id))
    finally:
        part.close(complete=False)
        bar.close()
    D.barrier(ctx)
    rows = 0
    if rank == 0:
        rows = _merge_parts(parts, sink, source, batch_size, world)
        shutil.rmtree(parts, ignore_errors=True)
    D.barrier(ctx)
    return StreamResult(sink.path, total, rows, time.perf_counter() - t0, world)


class _Silent:
    def update(self, k: int) -> None:
        pass

    def close(self) -> None:
        pass


def _merge_parts(parts: Path, sink, source, batch_size: int, world: int) -> int:
    """Stitch part files (batch ``k`` = row group ``k // world`` of part ``k % world``) into ``sink``."""
    import pyarrow.parquet as pq

    files = [pq.ParquetFile(str(parts / f"part-{r:05d}.parquet")) if (parts / f"part-{r:05d}.parquet").exists()
             else None for r in range(world)]
    complete = False
    try:
        for k in range(source.n_chunks(batch_size)):
            table = files[k % world].read_row_group(k // world)
            inside = None
            if "_inside" in table.column_names:
                inside = table.column("_inside").to_numpy(zero_copy_only=False)
                table = table.drop_columns(["_inside"])
            if hasattr(sink, "write_table"):
                sink.write_table(table.filter(inside) if inside is not None else table)
            else:
                sink.write({c: table.column(c).to_numpy() for c in table.column_names}, source.chunk(k, batch_size))
        complete = True
    finally:
        sink.close(complete)
    return sink.rows


def predict_run_stream(run_dir, out, *, grid: str | None = None, grid_region: str | None = None,
                       x_cols: tuple[str, str] | None = None, id_col: str | None = None, cell_km: float | None = None,
                       cell_deg: float | None = None, cells: int | None = None, batch_size: int = DEFAULT_BATCH,
                       level: float = 0.95, progress=None, distributed: bool | None = None,
                       at: str | None = None) -> StreamResult:
    """Stream a stored run's predictions over the cells of a Parquet file (``grid``) or a generated raster
    (``grid_region``: ``bbox:W,E,S,N``, ``state:CODE`` or ``run``) into ``out``; sharded under torchrun. A run with
    time as an input needs ``at`` (a quarter, ``"2024Q1"``): every cell is predicted at that time."""
    from gpcore import distributed as D
    from gpcore.data.export import open_sink
    from gpcore.data.grid import ParquetGrid, region_grid
    from gpcore.run.store import load_run

    if (grid is None) == (grid_region is None):
        raise ConfigError("give exactly one of grid (a Parquet file of cells) or grid_region (a region spec)")
    if distributed is None:
        distributed = D.launched_by_torchrun() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    ctx = D.init_distributed(backend="gloo") if distributed else None
    try:
        manifest, model = load_run(run_dir)
        transform = manifest["config"].get("transform", "identity")
        t_at = run_time_at(manifest["config"], at)
        if _time_input(manifest["config"]) and t_at is None:
            raise GPCoreError("this run takes time as an input: give the quarter to predict at, e.g. --at 2024Q1")
        if grid is not None:
            source = ParquetGrid(grid, x_cols, id_col)
        else:
            source = region_grid(grid_region, model, cell_km=cell_km, cell_deg=cell_deg, cells=cells)
        tags = {"model": manifest["config"].get("model", ""), "transform": transform, "level": f"{level:g}",
                "run": Path(run_dir).name, **({"quarter": at} if at else {})}
        model = model if t_at is None else TimeSlice(model, t_at)
        return stream_predict(model, source, open_sink(out, source, tags), transform, batch_size=batch_size,
                              level=level, progress=progress, ctx=ctx)
    finally:
        if ctx is not None:
            D.shutdown()
