"""Decisions over a stored run: exceedance, areas, joint samples and where to measure next.

The one implementation behind ``python -m gpcore exceed|areas|sample|suggest`` and the dashboard's Decide and
Export pages. Everything reads the run's stored grid and model (nothing is retrained); the model-level math is
:mod:`gpcore.decide` (docs/decide.md). Exceedance comes from the grid's stored marginals (``mean_t``, ``sd_t``:
``O(cells)``), areas and suggestions from the joint posterior.

**Time.** For a run with time as an input (``RunConfig.time_input``: the model's inputs are ``lon, lat, t``) every
function takes ``t``, the decimal year the places are evaluated at (:func:`place_inputs` appends it as the last
column); :func:`open_run` reads the run at a quarter (``at``, default the run's latest grid quarter) and carries
its ``t``. A spatial run takes ``t=None``. Method: docs/methods/spacetime.md.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpcore import decide
from gpcore.errors import GPCoreError
from gpcore.run import grid_joint, rundir
from gpcore.run.predict import place_inputs  # noqa: F401 - the places' model inputs, shared with grid_joint


@dataclass
class StoredRun:
    """A run read back for decisions: validated manifest, model, grid (cells, predictions, layout), transform;
    for a run with time as an input the quarter its grid's predictions are at and its decimal year ``t``."""

    path: Path
    manifest: dict
    model: object
    grid: object  # GeoDataFrame: cell_id, lon, lat, predictions, cell polygons; attrs["grid"] its GridSpec
    transform: object
    quarter: str | None = None
    t: float | None = None

    @property
    def state(self) -> str | None:
        return self.manifest.get("data", {}).get("state")

    @property
    def strata(self) -> str | None:
        return self.manifest["config"].get("strata")


def has_time_input(manifest_or_config: dict) -> bool:
    """Whether a run (its manifest or config) was fitted with time as an input (``lon, lat, t``)."""
    cfg = manifest_or_config.get("config", manifest_or_config)
    return bool(cfg.get("time_input"))


def open_run(run_dir, device: str | None = None, at: str | None = None) -> StoredRun:
    """A stored run with its grid (:class:`GPCoreError` when it has none, or is not a run).

    For a run with time as an input the grid's predictions are those at quarter ``at`` (``"2023Q4"``; default:
    the run's latest grid quarter, ``grid.parquet``): its stored per-quarter grid, or, for a quarter the run has no
    grid for (e.g. a forecast beyond its data), predicted now. ``at`` on a run without time input is an error."""
    from gpcore.data.transforms import get_transform
    from gpcore.run.predict import run_time_at
    from gpcore.run.store import load_run

    manifest, model = load_run(run_dir, device=device)
    transform = get_transform(manifest["config"].get("transform", "identity"))
    if not has_time_input(manifest):
        run_time_at(manifest["config"], at)  # --at on a spatial run: an error naming the flag
        grid = rundir.read_grid_frame(run_dir, manifest)
        grid_joint.prime(run_dir, model, grid)  # vecchia / dbk-nn: the factor the fit stored, when it matches
        return StoredRun(Path(run_dir), manifest, model, grid, transform)
    quarter = at or (manifest.get("time") or {}).get("grid_quarter")
    t = run_time_at(manifest["config"], quarter) if quarter else None
    stored = quarter in rundir.grid_quarters(run_dir)
    grid = rundir.read_grid_frame(run_dir, manifest, quarter=quarter if stored else None)
    if quarter == (manifest.get("time") or {}).get("grid_quarter"):  # the factor the fit stored at that quarter
        grid_joint.prime(run_dir, model, grid, quarter)  # (other quarters build theirs when a decision asks)
    if quarter and not stored:  # a quarter without a stored grid: predict the cells at it
        from gpcore.run.predict import grid_predictions

        preds = grid_predictions(model, grid, transform, t=t)
        for col in preds.columns.drop(["cell_id", "lon", "lat"]):
            grid[col] = preds[col].to_numpy()
    return StoredRun(Path(run_dir), manifest, model, grid, transform, quarter, t)


def run_grid(run_dir, rebuild: bool = False, quarter: str | None = None):
    """The run's grid as a GeoDataFrame with its predictions (for a run with time as an input: at ``quarter``, default
    its latest grid quarter) and its ``GridSpec`` (needed for GeoTIFF).

    A run that recorded no layout keeps point cells, unless ``rebuild``: then the grid is rebuilt with
    :func:`gpcore.run.pipeline.build_grid` (deterministic) and matched by ``cell_id``.
    """
    manifest = rundir.read_manifest(run_dir)
    grid = rundir.read_grid_frame(run_dir, manifest, quarter)
    if "grid" in grid.attrs or not rebuild:
        return grid
    from gpcore.run import pipeline
    from gpcore.run.config import RunConfig

    cfg = RunConfig.from_dict(manifest["config"])

    class _Prep:  # what build_grid reads: the state, and the frame when the region is the data's hull
        state = manifest.get("data", {}).get("state")

        @property
        def frame(self):
            return pipeline.load_frame(cfg)[0]

    rebuilt = pipeline.build_grid(cfg, _Prep())
    if rebuilt is None:
        raise GPCoreError("this run has no prediction grid to export")
    preds = grid.drop(columns=[c for c in ("geometry", "row", "col") if c in grid.columns])
    out = rebuilt[["cell_id", "row", "col", "geometry"]].merge(pd.DataFrame(preds), on="cell_id", how="inner")
    if len(out) != len(grid):
        raise GPCoreError(
            f"the rebuilt grid matches {len(out)} of the run's {len(grid)} cells; export GeoJSON or CSV instead"
        )
    out.attrs["grid"] = rebuilt.attrs.get("grid")
    return out


def _tags(run_dir, **more) -> dict:
    manifest = rundir.read_manifest(run_dir)
    cfg = manifest["config"]
    return {"model": cfg.get("model", ""), "target": cfg.get("y", ""), "transform": cfg.get("transform", ""),
            "run_id": manifest.get("run_id", Path(run_dir).name), **{k: v for k, v in more.items() if v is not None}}


def _file_bytes(frame, fmt: str, columns, tags: dict) -> bytes:
    from gpcore import data as D

    suffix = {"geotiff": ".tif", "geojson": ".geojson", "csv": ".csv"}[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        out = D.export_predictions(frame, Path(tmp) / f"predictions{suffix}", columns=list(columns),
                                   tags=tags if fmt == "geotiff" else None)
        return out.read_bytes()


def export_grid_bytes(run_dir, fmt: str, quarter: str | None = None) -> bytes:
    """The run's prediction grid (a run with time as an input: at ``quarter``, default its latest grid quarter) as
    GeoTIFF, GeoJSON or CSV bytes (``gpcore.data.export_predictions``)."""
    from gpcore import data as D

    grid = run_grid(run_dir, rebuild=True, quarter=quarter)
    cols = [c for c in (*D.PRED_COLUMNS, "mean_t", "sd_t", "width_t") if c in grid.columns]
    return _file_bytes(grid, fmt, cols, _tags(run_dir, quarter=quarter))


#: the columns of a change written with its cells (:func:`change_frame`), GeoTIFF bands in this order
CHANGE_BANDS = ("change_mean", "change_sd", "change_lo", "change_hi", "p_increase")


def change_frame(run_dir, table: pd.DataFrame):
    """A change table (:func:`gpcore.run.change.change_table`: one row per grid cell) on the run's cells: a
    GeoDataFrame with their polygons and ``GridSpec``, for GeoJSON and GeoTIFF (``python -m gpcore change --out``
    and the Export page)."""
    cells = run_grid(run_dir, rebuild=True)
    keep = [c for c in ("cell_id", "row", "col", "lon", "lat", cells.geometry.name) if c in cells.columns]
    out = cells[keep].merge(pd.DataFrame(table)[["cell_id", *CHANGE_BANDS]], on="cell_id", how="inner")
    if len(out) != len(table):
        raise GPCoreError(f"the change has {len(table)} cells but the run's grid matches {len(out)} of them")
    out.attrs = dict(cells.attrs)
    return out


def write_change(run_dir, table: pd.DataFrame, path, fmt: str, t_from: str, t_to: str) -> Path:
    """Write a change table to ``path`` as ``fmt``: ``"csv"`` / ``"parquet"`` the table itself, ``"geojson"`` on the
    run's cell polygons (:func:`change_frame`), ``"geotiff"`` one float32 band per :data:`CHANGE_BANDS` column on the
    grid's layout, tagged with the quarters and units. ``python -m gpcore change --out`` and the Export page."""
    from gpcore import data as D
    from gpcore.data.export import write_frame
    from gpcore.run.change import units_text

    path = Path(path)
    if fmt in ("csv", "parquet"):
        write_frame(table, path, fmt)
    elif fmt == "geojson":
        write_frame(change_frame(run_dir, table), path, fmt)
    else:
        units = units_text(rundir.read_manifest(run_dir)["config"])
        D.export_predictions(change_frame(run_dir, table), path, columns=list(CHANGE_BANDS),
                             tags=_tags(run_dir, change_from=t_from, change_to=t_to, units=units))
    return path


def export_change_bytes(run_dir, table: pd.DataFrame, fmt: str, t_from: str, t_to: str) -> bytes:
    """:func:`write_change`'s file as bytes (for a download)."""
    suffix = {"geotiff": ".tif", "geojson": ".geojson", "csv": ".csv", "parquet": ".parquet"}[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        return write_change(run_dir, table, Path(tmp) / f"change{suffix}", fmt, t_from, t_to).read_bytes()


# --------------------------------------------------------------------------------------------
# exceedance
# --------------------------------------------------------------------------------------------


def stored_prediction(model, grid):
    """The marginals stored with the grid (:func:`gpcore.decide.grid_prediction`), None when it has none."""
    if not {"mean_t", "sd_t"} <= set(grid.columns):
        return None
    return decide.grid_prediction(grid, model.observation_noise(), model.variance_scale(len(grid)),
                                  model.noise_shape())


def exceedance(model, grid, threshold: float, *, units: str = "model", transform="identity",
               direction: str = "below", t: float | None = None) -> decide.Exceedance:
    """P(f and y below/above the threshold) per grid cell, from the stored marginals when the grid has them (for
    a run with time as an input: the grid at the quarter of ``t``)."""
    return decide.exceedance(model, place_inputs(grid, t, getattr(model, "d_", None)), threshold, units=units,
                             transform=transform, direction=direction, pred=stored_prediction(model, grid))


def exceedance_frame(run: StoredRun, threshold: float, units: str, direction: str):
    """``(cells with p_<direction> and p_<direction>_y columns, Exceedance)`` for a stored run."""
    e = exceedance(run.model, run.grid, threshold, units=units, transform=run.transform, direction=direction,
                   t=run.t)
    out = run.grid[["cell_id", "lon", "lat", "geometry"]].copy()
    out[f"p_{direction}"] = e.p_f
    out[f"p_{direction}_y"] = e.p_y
    return out, e


# --------------------------------------------------------------------------------------------
# areas
# --------------------------------------------------------------------------------------------


def area_labels(places, areas: str, *, state: str | None, strata: str | None, name_column: str | None = None,
                where: str = "the run's grid"):
    """``(labels, polygons or None)`` of each place (rows with lon, lat) for ``areas``: ``counties`` (bundled, of
    the run's state), ``strata`` (the run's), ``column:NAME`` (a column of the places) or a polygon file."""
    from gpcore.run.pipeline import apply_strata

    lon, lat = places["lon"].to_numpy(float), places["lat"].to_numpy(float)
    if areas == "counties":
        polys = decide.bundled_counties(state)
        return decide.assign_areas(lon, lat, polys, "NAME"), polys.rename(columns={"NAME": "area"})
    if areas == "strata":
        if not strata:
            raise GPCoreError("areas 'strata': this run has no strata; use counties, column:NAME or a polygon file")
        return apply_strata(places[["lon", "lat"]].copy(), strata, state)["stratum"].to_numpy(dtype=object), None
    if areas.startswith("column:"):
        col = areas.split(":", 1)[1]
        if col not in places.columns:
            raise GPCoreError(f"areas '{areas}': {where} has no column '{col}'; columns: "
                              f"{', '.join(map(str, places.columns))}")
        return places[col].to_numpy(dtype=object), None
    from gpcore.data.regions import read_polygons

    polys = read_polygons(areas)
    name = name_column or next((c for c in ("NAME", "name", "Name") if c in polys.columns), None)
    if name is None or name not in polys.columns:
        raise GPCoreError(f"areas '{areas}': name the area column, one of: {', '.join(map(str, polys.columns))}")
    return decide.assign_areas(lon, lat, polys, name), polys.rename(columns={name: "area"})


def area_weights(places, weights: str, cells=None) -> np.ndarray | None:
    """Per-place weights of an area's mean: ``uniform`` (None), ``area`` (cell area in km², from the places'
    polygons or from ``cells`` matched by ``cell_id``) or a column of the places (finite, >= 0)."""
    if weights == "uniform":
        return None
    if weights == "area":
        if cells is not None:
            area = pd.Series(decide.cell_areas_km2(cells), index=cells["cell_id"].to_numpy())
            return area.reindex(places["cell_id"].to_numpy()).fillna(0.0).to_numpy()
        if "geometry" not in places or (places.geometry.geom_type == "Point").all():
            raise GPCoreError("weights 'area' need the run's grid cells (polygons); use uniform or a column")
        return decide.cell_areas_km2(places)
    if weights not in places.columns:
        raise GPCoreError(f"weights '{weights}': no such column; columns: {', '.join(map(str, places.columns))}")
    w = places[weights].to_numpy(float)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        rows = ", ".join(map(str, np.flatnonzero(bad)[:8]))
        raise GPCoreError(f"weights column '{weights}' has missing or negative values in rows {rows}; "
                          "fill them or drop those rows")
    return w


def area_table(model, places, labels, *, weights=None, threshold: float | None = None, units: str = "model",
               transform="identity", samples: int = 0, seed: int = 0, measurements=None,
               t: float | None = None) -> pd.DataFrame:
    """Posterior of each area's weighted mean (:func:`gpcore.decide.area_posteriors`) at the decimal year ``t``
    (a run with time as an input), ranked by P(area mean below the threshold) when there is one."""
    table = decide.area_posteriors(model, place_inputs(places, t, getattr(model, "d_", None)), labels, weights=weights,
                                   threshold=threshold, units=units, transform=transform, samples=samples,
                                   seed=seed, measurements=measurements)
    if threshold is not None:
        table = table.sort_values("p_below", ascending=False).reset_index(drop=True)
    return table


def with_polygons(table: pd.DataFrame, polys):
    """The area table with each area's polygon (a GeoDataFrame), or the table itself when there are none."""
    if polys is None:
        return table
    import geopandas as gpd

    shapes = polys[["area", "geometry"]].drop_duplicates("area")
    return gpd.GeoDataFrame(table.merge(shapes, on="area", how="left"), geometry="geometry", crs=polys.crs)


# --------------------------------------------------------------------------------------------
# samples and suggestions
# --------------------------------------------------------------------------------------------


def samples(model, grid, n: int, *, seed: int = 0, units: str = "model", transform="identity",
            t: float | None = None) -> np.ndarray:
    """``n`` seeded joint posterior samples over the grid cells (``n x cells``; at the decimal year ``t`` for a run
    with time as an input), in model or original units."""
    from gpcore.data.transforms import get_transform

    S = decide.plausible_maps(model, place_inputs(grid, t, getattr(model, "d_", None)), n, seed=seed)
    return get_transform(transform).inverse(S) if units == "original" else S


def target_mask(model, grid, target: str, *, threshold: float | None = None, units: str = "model",
                transform="identity", strata: str | None = None, state: str | None = None,
                require: bool = False, t: float | None = None) -> np.ndarray:
    """Which grid cells a suggestion targets: ``all``, ``undecided`` (0.2 < P(below threshold) < 0.8, from the
    stored marginals) or ``stratum:NAME`` (the cells of one of the run's strata). ``require``: an empty target
    set is an error naming why."""
    labels = None
    if target == "all":
        mask = np.ones(len(grid), dtype=bool)
    elif target == "undecided":
        if threshold is None:
            raise GPCoreError("target 'undecided' needs a threshold (cells with 0.2 < P(below) < 0.8)")
        mask = decide.undecided_mask(exceedance(model, grid, threshold, units=units, transform=transform, t=t).p_f)
    elif target.startswith("stratum:"):
        if not strata:
            raise GPCoreError(f"target '{target}': this run has no strata; use all or undecided")
        labels, _ = area_labels(grid, "strata", state=state, strata=strata)
        mask = labels == target.split(":", 1)[1]
    else:
        raise GPCoreError(f"target {target!r}: use all, undecided or stratum:NAME")
    if require and not mask.any():
        if labels is None:
            raise GPCoreError(f"no cell is undecided at threshold {threshold:g}; target all cells instead")
        raise GPCoreError(f"target '{target}': no cell in stratum '{target.split(':', 1)[1]}'; strata: "
                          f"{', '.join(sorted(set(labels)))}")
    return mask


def suggest(model, grid, mask, k: int, *, candidates=None, t: float | None = None, **kwargs) -> decide.Suggestion:
    """Greedy picks among ``candidates`` (a frame with lon, lat; default the grid cells) that most reduce the
    mean latent variance over the masked grid cells (:func:`gpcore.decide.suggest`); for a run with time as an
    input, measurements and targets at the decimal year ``t``. The grid's stored marginals (the grid at the quarter
    of ``t``) serve as the cells' marginal variances, as for the exceedance map."""
    X = place_inputs(grid, t, getattr(model, "d_", None))
    Xc = X if candidates is None else place_inputs(candidates, t, getattr(model, "d_", None))
    stored = stored_prediction(model, grid)
    if stored is not None:
        kwargs.setdefault("target_pred", stored.subset(mask))
        if candidates is None:
            kwargs.setdefault("pred", stored)
    return decide.suggest(model, Xc, X[mask], k=k, **kwargs)


def picks_table(res: decide.Suggestion, candidates) -> pd.DataFrame:
    """One row per pick: rank, [cell_id,] lon, lat, variance reduction and the mean latent variance after."""
    Xc = candidates[["lon", "lat"]].to_numpy(float)
    picks = pd.DataFrame({
        "rank": np.arange(1, len(res.index) + 1),
        "lon": Xc[res.index, 0],
        "lat": Xc[res.index, 1],
        "reduction": res.reduction,
        "mean_var_after": res.mean_var_before - np.cumsum(res.reduction),
    })
    if "cell_id" in candidates.columns:
        picks.insert(1, "cell_id", candidates["cell_id"].to_numpy()[res.index])
    return picks
