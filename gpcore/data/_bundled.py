"""Where the bundled files live and cached loaders for the two boundary layers.

``sample_data/`` sits at the repository root. ``GPCORE_SAMPLE_DATA`` overrides the location
(for installs where the package and the data are apart).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import geopandas as gpd
import numpy as np

from gpcore.errors import DataError

STATES_FILE = "us_states_cb2022_500k_GA_NM_MO_PR_HI.geojson"
COUNTIES_FILE = "us_counties_tiger2009_rucc2023_GA_NM_MO_PR_HI.geojson"
RUCC_FILE = "usda_rucc2023_GA_NM_MO_PR_HI.csv"


def sample_data_dir() -> Path:
    """The folder holding the bundled data (``$GPCORE_SAMPLE_DATA`` or ``<repo>/sample_data``)."""
    env = os.environ.get("GPCORE_SAMPLE_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "sample_data"


def bundled_path(filename: str) -> Path:
    """Path of one bundled file; a clear error when the folder was not shipped."""
    path = sample_data_dir() / filename
    if not path.is_file():
        raise DataError(
            f"bundled file '{filename}' not found in {path.parent}; run from a full checkout of the "
            "repository or set GPCORE_SAMPLE_DATA to the folder holding sample_data/"
        )
    return path


@functools.lru_cache(maxsize=1)
def states() -> gpd.GeoDataFrame:
    """The bundled state boundaries (columns STATEFP, STUSPS, NAME, geometry; EPSG:4326)."""
    return gpd.read_file(bundled_path(STATES_FILE), engine="pyogrio").to_crs(4326)


@functools.lru_cache(maxsize=1)
def counties() -> gpd.GeoDataFrame:
    """The bundled counties with USDA RUCC 2023 (columns FIPS, STUSPS, NAME, RUCC_2023, metro, ...)."""
    return gpd.read_file(bundled_path(COUNTIES_FILE), engine="pyogrio").to_crs(4326)


@functools.lru_cache(maxsize=1)
def state_boxes() -> dict[str, tuple[float, float, float, float]]:
    """Bounding box ``(W, E, S, N)`` of each bundled state, keyed by postal code."""
    st = states()
    b = st.geometry.bounds.to_numpy()
    return {code: (float(w), float(e), float(s), float(n)) for code, (w, s, e, n) in zip(st["STUSPS"], b, strict=True)}


def fraction_in_states(lon: np.ndarray, lat: np.ndarray) -> tuple[float, str | None]:
    """Largest fraction of points inside one bundled state's bounding box, and that state.

    A cheap plausibility test used to spot swapped and projected coordinates.
    """
    best, best_code = 0.0, None
    if len(lon) == 0:
        return best, best_code
    for code, (w, e, s, n) in state_boxes().items():
        frac = float(np.mean((lon >= w) & (lon <= e) & (lat >= s) & (lat <= n)))
        if frac > best:
            best, best_code = frac, code
    return best, best_code
