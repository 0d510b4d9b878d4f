"""``python -m gpcore data inspect FILE``: show what was read from a file, or why it cannot be used.

The CLI stays thin: it calls :func:`add_inspect_arguments` on its sub-parser and :func:`run_inspect`
with the parsed arguments (exit status 0, or 2 with the error on stderr).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from gpcore.data import _bundled
from gpcore.data._source import DEFAULT_MAX_BYTES
from gpcore.data.readers import read_measurements
from gpcore.data.strata import assign_strata
from gpcore.data.transforms import TRANSFORMS
from gpcore.errors import DataError, GPCoreError

STRATA_HELP = (
    "county_metro | column:NAME | polygons:PATH | none | auto (default: a stratum or county_metro column, else the "
    "bundled county metro / non-metro split for points in the bundled states)"
)


def parse_strata(spec: str | None) -> tuple[str | None, dict]:
    """``"county_metro"``, ``"column:NAME"``, ``"polygons:PATH"``, ``"none"``/None or ``"auto"`` -> (source, kwargs)."""
    if spec is None or spec.strip().lower() in ("", "none"):
        return None, {}
    text = spec.strip()
    low = text.lower()
    if low == "auto":
        return "auto", {}
    if low in ("county_metro", "county-metro", "metro"):
        return "county_metro", {}
    if low.startswith("county_metro:"):
        return "county_metro", {"state": text.split(":", 1)[1]}
    if low.startswith("column:"):
        return "column", {"column": text.split(":", 1)[1]}
    if low.startswith("polygons:"):
        return "polygons", {"polygons": text.split(":", 1)[1]}
    raise DataError(f"--strata {spec!r} is not understood; use {STRATA_HELP}")


def inspect(path, *, strata: str | None = "auto", y: str | None = None, **options) -> str:
    """Read ``path`` and return the printable report (rows, columns picked, CRS, dropped rows, strata).

    Parameters
    ----------
    path : path, bytes or upload
    strata : str, optional
        See :func:`parse_strata`; ``"auto"`` uses a ``stratum`` or ``county_metro`` column when the data has
        one, else the bundled county metro / non-metro split when most points lie in a bundled state.
    y : str, optional
        Alias of ``target``.
    **options
        Passed to :func:`gpcore.data.read_measurements` (target, transform, quarter, allow_drop, lon, lat, ...).

    Raises
    ------
    DataError
        When the file cannot be used (the message says why and how to fix it).
    """
    if y is not None:
        options.setdefault("target", y)
    source, kwargs = parse_strata(strata)
    gdf = read_measurements(path, **options)
    if source == "auto":
        source = None
        for col in ("stratum", "county_metro"):
            if col in gdf.columns:
                source, kwargs = "column", {"column": col}
                break
        else:
            frac, _ = _bundled.fraction_in_states(gdf["lon"].to_numpy(), gdf["lat"].to_numpy())
            source = "county_metro" if frac > 0.5 else None
    if source is not None:
        gdf = assign_strata(gdf, source, **kwargs)
    text = gdf.attrs["report"].to_text()
    if source is None:
        text += "\nstrata:      none (pass --strata county_metro, column:NAME or polygons:PATH)"
    bounds = (gdf["lon"].min(), gdf["lon"].max(), gdf["lat"].min(), gdf["lat"].max())
    text += "\nextent:      W {:.4f}, E {:.4f}, S {:.4f}, N {:.4f}".format(*bounds)
    if gdf.attrs.get("time"):
        years = gdf["time_year"].to_numpy()
        text += f"\ntime range:  {np.nanmin(years):.3f} .. {np.nanmax(years):.3f} (decimal years)"
    return text


def add_inspect_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``data inspect`` options to ``parser`` (its own or a sub-parser)."""
    parser.add_argument("file", help="CSV/TSV, Parquet, GeoParquet, GeoJSON, GeoPackage or zipped Shapefile")
    parser.add_argument("--y", "--target", dest="target", default=None, help="target column to validate")
    parser.add_argument("--transform", default="identity", choices=sorted(TRANSFORMS), help="target transform")
    parser.add_argument("--strata", default="auto", help=STRATA_HELP)
    parser.add_argument("--quarter", default=None, help="period: 2023, 2023Q1, 2021Q3:2022Q2 or all")
    parser.add_argument("--allow-drop", action="store_true", help="drop unusable rows (counted) instead of failing")
    parser.add_argument("--lon", default=None, help="longitude (x) column")
    parser.add_argument("--lat", default=None, help="latitude (y) column")
    parser.add_argument("--geometry", default=None, help="WKT geometry column")
    parser.add_argument(
        "--crs", default=None, help="CRS of the coordinates when the file does not say, e.g. EPSG:32615"
    )
    parser.add_argument("--layer", default=None, help="layer of a GeoPackage / multi-layer zip")
    parser.add_argument("--weight", default=None, help="per-row weight column (e.g. tests)")
    parser.add_argument(
        "--time", default=None, help="quarter/date column (found automatically when named quarter/date)"
    )
    parser.add_argument("--sep", default=None, help="CSV delimiter (default: sniffed)")
    parser.add_argument(
        "--max-mb", type=float, default=DEFAULT_MAX_BYTES / 1024**2, help="largest file size read, in MB (default 200)"
    )
    return parser


def run_inspect(args: argparse.Namespace) -> int:
    """Print the report of ``args.file``; on a data problem print the error to stderr and return 2."""
    options = {
        k: getattr(args, k)
        for k in ("target", "transform", "quarter", "lon", "lat", "geometry", "crs", "layer", "weight", "time", "sep")
        if getattr(args, k, None) is not None
    }
    try:
        text = inspect(
            args.file,
            strata=args.strata,
            allow_drop=bool(args.allow_drop),
            max_bytes=int(args.max_mb * 1024**2),
            **options,
        )
    except GPCoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


def main(argv=None) -> int:
    """Stand-alone entry: ``python -m gpcore.data inspect FILE [options]``."""
    parser = argparse.ArgumentParser(prog="python -m gpcore.data")
    sub = parser.add_subparsers(dest="command", required=True)
    add_inspect_arguments(sub.add_parser("inspect", help="show what a data file holds, or why it cannot be used"))
    args = parser.parse_args(argv)
    return run_inspect(args)


__all__ = ["DataError", "add_inspect_arguments", "inspect", "main", "parse_strata", "run_inspect"]
