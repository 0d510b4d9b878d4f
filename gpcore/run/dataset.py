"""The data side of a run as the dashboard shows it: what a file holds (to map its columns) and the data set a
run configuration reads (:func:`gpcore.run.pipeline.load_frame`, the same code a run uses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpcore.identity import dataset_identity
from gpcore.run.config import RunConfig

#: Columns the reader adds (never offered as target, weight or strata).
INTERNAL_COLUMNS = {"geometry", "lon", "lat", "time_year"}


def units_of(column: str) -> str:
    """Units read off a column name (``download_mbps`` -> ``Mbps``); empty when unknown."""
    low = column.lower()
    for suffix, unit in (("_mbps", "Mbps"), ("_kbps", "kbps"), ("_ms", "ms"), ("_km", "km"), ("_m", "m")):
        if low.endswith(suffix):
            return unit
    return ""


@dataclass
class Dataset:
    """A data set read, validated and stratified exactly as a run reads it."""

    frame: Any  # GeoDataFrame: lon, lat, target, stratum, ...
    source: str
    state: str | None
    y_t: np.ndarray  # the transformed target
    data_hash: str


def load_dataset(cfg: RunConfig) -> Dataset:
    """The data set of ``cfg``, its transformed target and its identity (:func:`gpcore.identity.dataset_identity`)."""
    from gpcore import data as D
    from gpcore.run.pipeline import frame_hash, load_frame

    gdf, source, state = load_frame(cfg)
    X = gdf[["lon", "lat"]].to_numpy(dtype=np.float64)
    y_t = D.get_transform(cfg.transform).forward(gdf[cfg.y].to_numpy(dtype=np.float64))
    return Dataset(gdf, source, state, y_t, dataset_identity(cfg.to_dict()) or frame_hash(X, y_t))


@dataclass
class Inspection:
    """What a file holds, for the column-mapping widgets (auto-detected picks included)."""

    columns: list[str]
    numeric: list[str]  # number columns as the reader treats them (a few text cells allowed), no coordinates
    lon: str | None
    lat: str | None
    time: str | None
    quarters: list[str]
    rows: int
    report_text: str
    profiles: dict  # name -> gpcore.data.columns.ColumnProfile (of the raw file rows)

    def default_target(self) -> str | None:
        from gpcore.data.columns import guess_target

        return guess_target({n: self.profiles[n] for n in self.numeric}, coordinates=(self.lon, self.lat))


def file_columns(path) -> tuple[list[str], dict]:
    """The file's columns as read and their profiles (DataError only when the file cannot be read at all)."""
    from gpcore.data.columns import profile_columns, read_table

    profiles = profile_columns(read_table(path))
    return list(profiles), profiles


def inspect_source(path, lon: str | None = None, lat: str | None = None, raw: dict | None = None) -> Inspection:
    """Read a file once without a target to list its columns and what gpcore detects (DataError if unusable).

    ``lon`` / ``lat`` are the user's coordinate columns (None: auto-detect); ``raw`` the file's column profiles
    (:func:`file_columns`) when already at hand.
    """
    from gpcore import data as D
    from gpcore.data.columns import is_coordinate_name, profile_column

    gdf = D.read_measurements(path, lon=lon, lat=lat, allow_drop=True)
    rep = gdf.attrs["report"]
    raw = file_columns(path)[1] if raw is None else raw
    # columns the reader derives (Ookla's download_mbps from avg_d_kbps) are profiled as read
    profiles = {**raw, **{c: profile_column(gdf[c]) for c in gdf.columns if c not in raw and c != "geometry"}}
    columns = [c for c in gdf.columns if c != "geometry"]
    used = {rep.columns.get("lon"), rep.columns.get("lat")}
    numeric = [c for c in columns if c in profiles and profiles[c].numeric and c not in INTERNAL_COLUMNS
               and c not in used and not is_coordinate_name(c)]
    time_col = rep.columns.get("time")
    quarters: list[str] = []
    if time_col:
        labels = pd.Series(D.temporal.quarter_labels(gdf[time_col])).dropna().astype(str)
        quarters = sorted(labels.unique().tolist())
    return Inspection(columns=columns, numeric=numeric, lon=rep.columns.get("lon"), lat=rep.columns.get("lat"),
                      time=time_col, quarters=quarters, rows=len(gdf), report_text=rep.to_text(), profiles=profiles)
