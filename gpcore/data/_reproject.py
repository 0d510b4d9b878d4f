"""Checking that coordinates are what they claim (degrees in range, not swapped, not projected) and
reprojecting them to EPSG:4326. Internal to :mod:`gpcore.data.readers`.
"""

from __future__ import annotations

import numpy as np
import pyproj

from gpcore.data import _bundled
from gpcore.data._crs import WGS84, crs_name, project
from gpcore.data._validate import ReadContext
from gpcore.errors import DataError

#: Projected CRSs tried when lon/lat columns hold metres, to suggest crs= in the message.
_PROJECTED_GUESSES = (
    "EPSG:3857",
    "EPSG:5070",
    "EPSG:32604",
    "EPSG:32605",
    "EPSG:32612",
    "EPSG:32613",
    "EPSG:32615",
    "EPSG:32616",
    "EPSG:32617",
    "EPSG:32619",
    "EPSG:32620",
)


def to_wgs84(x, y, crs_in: pyproj.CRS, ctx: ReadContext, *, explicit: bool) -> tuple[np.ndarray, np.ndarray]:
    """Check degrees (swapped, projected, out of range) and reproject to EPSG:4326."""
    report = ctx.report
    report.crs_in = crs_name(crs_in)
    lon_name, lat_name = _names(ctx)
    fin = np.isfinite(x) & np.isfinite(y)
    if crs_in.is_geographic:
        x = x.copy()
        _check_degrees(x, y, fin, ctx, lon_name, lat_name, explicit, assumed=not ctx.crs_from_file)
        lon, lat = project(x, y, crs_in, WGS84) if crs_in != WGS84 else (x, y)
    else:
        if fin.sum() >= 3 and np.all(np.abs(x[fin]) <= 180) and np.all(np.abs(y[fin]) <= 90):
            declared = "the file declares" if ctx.crs_from_file else "crs= gives"
            raise DataError(
                f"{ctx.where()}: {declared} the projected CRS {report.crs_in} (coordinates in metres or feet), "
                f"but all {int(fin.sum())} coordinates lie within +-180 / +-90, like degrees; the file's CRS is "
                "probably wrong: set the file's CRS to EPSG:4326 (lon/lat degrees), or read it with crs='EPSG:4326'"
            )
        lon = np.full(len(x), np.nan)
        lat = np.full(len(y), np.nan)
        if fin.any():
            with np.errstate(all="ignore"):
                lon[fin], lat[fin] = project(x[fin], y[fin], crs_in, WGS84)
        outside = fin & ~(np.isfinite(lon) & np.isfinite(lat) & (np.abs(lat) <= 90) & (np.abs(lon) <= 180))
        if outside.sum() > 0.5 * max(int(fin.sum()), 1):
            raise DataError(
                f"{ctx.where()}: most coordinates cannot be converted from {report.crs_in} to lon/lat "
                f"(e.g. {ctx.rows_of(outside)}); check the CRS passed as crs= or stored in the file"
            )
        ctx.problem(f"points outside the valid area of {report.crs_in}", None, outside, "check the CRS")
        lon = np.where(outside, np.nan, lon)
        lat = np.where(outside, np.nan, lat)
        good = np.isfinite(lon)
        frac, _ = _bundled.fraction_in_states(lon[good], lat[good])
        if good.any() and frac < 0.05:
            swapped, code = _bundled.fraction_in_states(lat[good], lon[good])
            if swapped > 0.9:
                report.notes.append(
                    f"the points would fall in {code} if lon and lat were swapped; check the axis order"
                )
    return lon, lat


def _names(ctx: ReadContext) -> tuple[str, str]:
    c = ctx.report.columns
    g = c.get("geometry")
    return (c.get("lon") or (f"{g} (x)" if g else "x")), (c.get("lat") or (f"{g} (y)" if g else "y"))


def _check_degrees(x, y, fin, ctx: ReadContext, lon_name: str, lat_name: str, explicit: bool, assumed: bool) -> None:
    """Range, swap and projected-CRS checks of lon/lat degrees; fixes 0-360 longitudes in place."""
    report = ctx.report
    n_fin = int(fin.sum())
    if n_fin == 0:
        return
    ax, ay = np.abs(x), np.abs(y)
    with np.errstate(invalid="ignore"):
        bad_lat = fin & (ay > 90)
        bad_lon = fin & (ax > 180)
    bad = bad_lat | bad_lon
    crs_hint = "pass crs= if the file is projected" if assumed else "check the CRS stored in the file"
    if bad.any():
        wrap = bad_lon & ~bad_lat & (x > 180) & (x <= 360)
        if wrap.sum() == bad.sum() and np.nanmin(x[fin]) >= 0:
            x[wrap] -= 360.0
            report.notes.append(f"column '{lon_name}': {int(wrap.sum())} longitudes in 0-360 converted to -180..180")
            bad = bad_lat = bad_lon = np.zeros(len(x), dtype=bool)
    if bad.sum() > 0.5 * n_fin:
        mag = np.nanmedian(np.maximum(ax[fin], ay[fin]))
        if mag > 1000:
            raise DataError(_projected_message(x[fin], y[fin], ctx, lon_name, lat_name, assumed))
        looks_swapped = np.mean((ay[fin] <= 180) & (ax[fin] <= 90)) > 0.9 and np.mean(ay[fin] > 90) > 0.5
        if looks_swapped:
            raise DataError(
                f"{ctx.where()}: column '{lat_name}' has {int(bad_lat.sum())} of {n_fin} values outside [-90, 90] "
                f"({ctx.rows_of(bad_lat)}) while '{lon_name}' stays within +-90, so the columns look swapped; pass "
                f"lon='{_col(lat_name)}', lat='{_col(lon_name)}' to swap them, or check that '{lat_name}' holds "
                "latitude in degrees"
            )
        col, word, lim, mask = (
            (lat_name, "latitude", 90, bad_lat)
            if bad_lat.sum() >= bad_lon.sum()
            else (lon_name, "longitude", 180, bad_lon)
        )
        raise DataError(
            f"{ctx.where(col)}: {int(mask.sum())} of {n_fin} values outside [-{lim}, {lim}] ({ctx.rows_of(mask)}); "
            f"check that the column holds {word} in degrees, or {crs_hint}"
        )
    ctx.problem(
        "values outside [-90, 90]",
        lat_name,
        bad_lat,
        f"check that the column holds latitude in degrees, or {crs_hint}",
    )
    ctx.problem(
        "values outside [-180, 180]",
        lon_name,
        bad_lon,
        f"check that the column holds longitude in degrees, or {crs_hint}",
    )
    ok = fin & ~bad_lat & ~bad_lon
    if not ok.any():
        return
    given, _ = _bundled.fraction_in_states(x[ok], y[ok])
    swapped, code = _bundled.fraction_in_states(y[ok], x[ok])
    if given < 0.05 and swapped > 0.9:
        name = _state_name(code)
        msg = (
            f"columns '{lon_name}' and '{lat_name}' look swapped: as given the points fall in the ocean or "
            f"Antarctica, but swapped they fall in {name}"
        )
        if explicit:
            report.notes.append(msg + " (kept as given because lon=/lat= were passed)")
        else:
            raise DataError(
                f"{ctx.where()}: {msg}; pass lon='{_col(lat_name)}', lat='{_col(lon_name)}' to swap them "
                "(or pass lon=/lat= as they are to keep them)"
            )


def _col(label: str) -> str:
    return label.split(" (")[0]


def _state_name(code: str | None) -> str:
    if code is None:
        return "a bundled state"
    st = _bundled.states()
    names = st.loc[st["STUSPS"] == code, "NAME"]
    return f"{names.iloc[0]} ({code})" if len(names) else code


def _projected_message(x, y, ctx: ReadContext, lon_name: str, lat_name: str, assumed: bool) -> str:
    sample = np.linspace(0, len(x) - 1, min(len(x), 400)).astype(int)
    sx, sy = x[sample], y[sample]
    guess = ""
    for cand in _PROJECTED_GUESSES:
        with np.errstate(all="ignore"):
            lo, la = project(sx, sy, cand, WGS84)
        ok = np.isfinite(lo) & np.isfinite(la)
        if ok.mean() < 0.9:
            continue
        frac, code = _bundled.fraction_in_states(lo[ok], la[ok])
        if frac > 0.9:
            crs = pyproj.CRS.from_user_input(cand)
            guess = f"pass crs='{cand}' (in {crs.name} they fall in {_state_name(code)})"
            break
    if not guess:
        guess = "pass crs='EPSG:xxxx' with the file's projected CRS (e.g. a UTM zone such as EPSG:32615)"
    example = f"{x[0]:.6g}, {y[0]:.6g}"
    if assumed:
        lead = (
            f"columns '{lon_name}'/'{lat_name}': the data looks projected (values like {example} are metres, "
            "not degrees)"
        )
    else:
        lead = (
            f"the data looks projected (values like {example}) although the file's CRS is geographic; the stored "
            "CRS is probably wrong"
        )
    return f"{ctx.where()}: {lead}; {guess}"
