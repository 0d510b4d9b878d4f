"""Every problem a user can bring gets a specific DataError naming file, column, rows and the fix."""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pandas as pd
import pyproj
import pytest

from gpcore.data import DataError, read_measurements
from gpcore.errors import ConfigError, GPCoreError


def _zip(files: dict) -> bytes:
    """An in-memory zip archive holding ``{name: content}``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, content in files.items():
            zf.writestr(name, content)
    return buf.getvalue()


def _err(src, **kw) -> str:
    with pytest.raises(DataError) as info:
        read_measurements(src, **kw)
    assert isinstance(info.value, GPCoreError) and isinstance(info.value, ValueError)
    return str(info.value)


# ---------------------------------------------------------------- unreadable / empty / unknown files


def test_missing_file(tmp_path):
    msg = _err(tmp_path / "nope.csv")
    assert "nope.csv' not found" in msg and "check the path" in msg


def test_empty_blank_and_header_only_files(write_text):
    assert "is empty (0 bytes)" in _err(write_text("e.csv", ""))
    assert "only blank lines" in _err(write_text("b.csv", "\n \n\n"))
    msg = _err(write_text("h.csv", "lon,lat,mbps\n"))
    assert "file 'h.csv' has a header (lon, lat, mbps) but no data rows" in msg


def test_binary_garbage_and_unknown_formats(write_text):
    garbage = bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8))
    msg = _err(write_text("g.csv", garbage))
    assert "file 'g.csv'" in msg and "binary" in msg and "supported: CSV/TSV" in msg
    msg = _err(garbage, name="mystery.bin")
    assert "mystery.bin" in msg and "supported" in msg
    assert "not a Parquet file" in _err(write_text("x.parquet", "lon,lat\n1,2\n"))
    assert "not a GeoPackage" in _err(write_text("x.gpkg", "lon,lat\n1,2\n"))
    assert "one part of a Shapefile" in _err(write_text("x.dbf", b"\x03abc"))
    assert "bare .shp upload" in _err(b"\x00\x00\x27\x0a" + b"\x00" * 96, name="x.shp")
    msg = _err(write_text("x.geojson", '{"not": "geojson"}'))
    assert "cannot be opened as GeoJSON" in msg
    msg = _err(b"PK\x03\x04 broken zip", name="x.zip")
    assert "not a readable zip archive" in msg


def test_excel_workbooks_are_refused_with_the_fix(write_text):
    xlsx = _zip({"[Content_Types].xml": "<Types/>", "xl/workbook.xml": "<workbook/>"})
    msg = _err(xlsx, name="speeds.xlsx")
    assert "speeds.xlsx" in msg and "save the sheet as CSV" in msg
    msg = _err(xlsx, name="renamed.zip")  # detected from content too
    assert "Office document" in msg and "CSV" in msg
    assert "save the sheet as CSV" in _err(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 100, name="old.xls")


def test_zip_without_data(write_text):
    msg = _err(_zip({"readme.md": "hello", "a.png": "x"}), name="stuff.zip")
    assert "readme.md, a.png" in msg and "expected one Shapefile" in msg
    assert "lacks its .shx and .dbf" in _err(_zip({"p.shp": b"\x00\x00\x27\x0a"}), name="p.zip")


def test_file_above_the_size_limit(write_csv, table):
    path = write_csv(table)
    size = os.path.getsize(path)
    msg = _err(path, max_bytes=size - 1)
    assert "file 'data.csv' is" in msg and "above the limit" in msg and "max_bytes=" in msg
    assert "above the limit" in _err(io.BytesIO(path.read_bytes()), name="up.csv", max_bytes=100)
    assert len(read_measurements(path, max_bytes=size)) == len(table)


def test_ragged_rows_from_a_decimal_comma(write_text):
    text = "lon,lat,mbps\n" + "\n".join(f"-66.{i},18.{i},{i}.5" for i in range(1, 12)) + "\n-66.5,18.3,12,5\n"
    msg = _err(write_text("r.csv", text))
    assert "line 13 (data row 12) has 4 fields but the header has 3" in msg
    assert "decimal comma" in msg


# ---------------------------------------------------------------- coordinates


def test_no_coordinate_columns_lists_what_was_found(write_csv, table):
    df = table.rename(columns={"lon": "a", "lat": "b"})
    msg = _err(write_csv(df))
    assert "no coordinate columns found; columns are: a, b, mbps, tests" in msg
    assert "lon='COLUMN'" in msg
    msg = _err(write_csv(table.rename(columns={"lon": "west"}), "w.csv"))
    assert "columns are: west, lat" in msg
    # a file without a header line
    msg = _err(io.BytesIO(b"-66.1,18.2,5\n-66.2,18.3,6\n"), name="nohdr.csv")
    assert "first line looks like data" in msg


def test_explicit_columns_must_exist(write_csv, table):
    msg = _err(write_csv(table), lon="Lon", lat="lat")
    assert "no longitude column 'Lon'" in msg and "Did you mean 'lon'" in msg
    assert "pass both lon= and lat=" in _err(write_csv(table), lon="lon")
    assert "no geometry column 'geom'" in _err(write_csv(table), geometry="geom")


def test_latitude_out_of_range_rows_are_named(write_csv, table):
    df = table.copy()
    df.loc[[2, 7, 14], "lat"] = [95.0, -91.0, 180.0]
    msg = _err(write_csv(df, "x.csv"))
    assert msg.startswith("file 'x.csv', column 'lat': 3 values outside [-90, 90] (rows 3, 8, 15; 1-based data rows)")
    assert "check that the column holds latitude in degrees, or pass crs= if the file is projected" in msg
    assert "allow_drop=True" in msg
    gdf = read_measurements(write_csv(df, "x.csv"), allow_drop=True)
    assert len(gdf) == len(df) - 3
    ((reason, count, rows),) = gdf.attrs["report"].dropped
    assert reason == "column 'lat': values outside [-90, 90]" and count == 3 and rows == [3, 8, 15]


def test_longitude_out_of_range(write_csv, table):
    df = table.copy()
    df.loc[0, "lon"] = -200.0
    msg = _err(write_csv(df))
    assert "column 'lon': 1 value outside [-180, 180] (row 1; 1-based data rows)" in msg


def test_mostly_out_of_range_is_not_droppable(write_csv, make_table):
    df = make_table(20)
    df["lat"] = np.linspace(100, 120, 20)
    df["lon"] = np.linspace(-200, 200, 20)
    msg = _err(write_csv(df), allow_drop=True)
    assert "of 20 values outside" in msg and "degrees" in msg


def test_swapped_columns_by_range(write_csv, table):
    df = pd.DataFrame({"lon": table.lat, "lat": table.lon - 40, "mbps": table.mbps})  # |lat| > 90, |lon| < 90
    msg = _err(write_csv(df))
    assert "column 'lat' has 30 of 30 values outside [-90, 90] (rows 1, 2, 3, 4, 5 and 25 more;" in msg
    assert "look swapped; pass lon='lat', lat='lon' to swap them" in msg


def test_swapped_columns_detected_from_the_bundled_states(write_csv, table):
    df = pd.DataFrame({"lon": table.lat, "lat": table.lon, "mbps": table.mbps})  # all in range, but Antarctica
    msg = _err(write_csv(df))
    assert "look swapped" in msg and "Puerto Rico" in msg
    # explicit columns: kept as given, with a note
    gdf = read_measurements(write_csv(df), lon="lon", lat="lat")
    assert any("swapped" in n for n in gdf.attrs["report"].notes)
    gdf = read_measurements(write_csv(df), lon="lat", lat="lon")
    np.testing.assert_allclose(gdf["lon"], table.lon)


def test_projected_metres_say_pass_crs_with_a_guess(write_csv, table):
    x, y = pyproj.Transformer.from_crs(4326, 32619, always_xy=True).transform(table.lon.values, table.lat.values)
    df = pd.DataFrame({"x": x, "y": y, "mbps": table.mbps})
    msg = _err(write_csv(df, "utm.csv"))
    assert "file 'utm.csv': columns 'x'/'y': the data looks projected (values like" in msg
    assert "pass crs='EPSG:32619'" in msg and "Puerto Rico" in msg
    # somewhere unknown: generic advice
    df = pd.DataFrame({"x": np.linspace(4e5, 5e5, 20), "y": np.linspace(6.6e6, 6.7e6, 20)})
    msg = _err(write_csv(df, "far.csv"))
    assert "looks projected" in msg and "pass crs='EPSG:xxxx'" in msg


def test_geometry_file_with_a_wrong_crs(tmp_path, table):
    import geopandas as gpd

    x, y = pyproj.Transformer.from_crs(4326, 32619, always_xy=True).transform(table.lon.values, table.lat.values)
    bad = gpd.GeoDataFrame(table[["mbps"]], geometry=gpd.points_from_xy(x, y), crs=4326)  # metres labelled 4326
    bad.to_file(tmp_path / "bad.gpkg", driver="GPKG")
    msg = _err(tmp_path / "bad.gpkg")
    assert "looks projected" in msg and "the stored CRS is probably wrong" in msg
    gdf = read_measurements(tmp_path / "bad.gpkg", crs="EPSG:32619")
    np.testing.assert_allclose(gdf["lon"], table.lon, atol=1e-7)
    assert any("overrides" in n for n in gdf.attrs["report"].notes)


def test_bad_crs_and_bad_wkt(write_csv, table):
    assert "crs='EPSG:99999999' is not a CRS" in _err(write_csv(table), crs="EPSG:99999999")
    df = pd.DataFrame({"geometry": ["POINT (1 2"] * 12, "v": 1.0})
    assert "not valid WKT geometry" in _err(write_csv(df), geometry="geometry")


def test_text_in_coordinates(write_csv, table):
    df = table.astype({"lat": object})
    df.loc[[3, 5], "lat"] = ["n/a", "north"]
    msg = _err(write_csv(df))
    assert "file 'data.csv': 2 of 30 rows cannot be used:" in msg
    assert "column 'lat': 1 value with text where a number is expected ('north') (row 6;" in msg
    assert "column 'lat': 1 missing value (empty, NA or NaN) (row 4;" in msg
    gdf = read_measurements(write_csv(df), allow_drop=True)
    assert len(gdf) == 28 and len(gdf.attrs["report"].dropped) == 2


# ---------------------------------------------------------------- target, weight, time


def test_target_missing_or_not_numeric(write_csv, table):
    msg = _err(write_csv(table), target="Mbps")
    assert "no target column 'Mbps'; columns are: lon, lat, mbps, tests" in msg and "Did you mean 'mbps'" in msg
    msg = _err(write_csv(table), target="download_mbps")
    assert "only for Ookla files" in msg
    df = table.assign(name=[f"site {i}" for i in range(len(table))])
    msg = _err(write_csv(df), target="name")
    assert "column 'name': not numeric (30 of 30 values are text, e.g. 'site 0', 'site 1'" in msg
    assert "choose a numeric target column: lon, lat, mbps, tests" in msg
    df = table.assign(flag=True)
    assert "True/False" in _err(df, target="flag")


def test_target_text_and_decimal_commas(write_csv, table):
    df = table.astype({"mbps": object})
    df.loc[[1, 4], "mbps"] = ["12,5", "n/a"]
    msg = _err(write_csv(df, sep=","), target="mbps")
    # a quoted "12,5" in a comma file is text: the message shows it and suggests decimal=','
    assert "'12,5'" in msg and "decimal=','" in msg
    assert "column 'mbps': 1 missing value" in msg


def test_nan_and_inf_rows_are_counted_and_dropped_only_when_allowed(write_csv, table):
    df = table.copy()
    df.loc[[0, 9], "mbps"] = np.nan
    df.loc[4, "mbps"] = np.inf
    msg = _err(write_csv(df), target="mbps")
    assert "3 of 30 rows cannot be used" in msg
    assert "column 'mbps': 2 missing values (empty, NA or NaN) (rows 1, 10; 1-based data rows)" in msg
    assert "column 'mbps': 1 infinite value (row 5;" in msg
    # the advice fits each entry point: fit/predict/evaluate drop by default, `data inspect` needs --allow-drop
    assert "allow_drop=True; CLI: fit, predict and evaluate drop them unless --no-drop" in msg
    assert "`data inspect` needs --allow-drop" in msg
    gdf = read_measurements(write_csv(df), target="mbps", allow_drop=True)
    assert len(gdf) == 27
    rep = gdf.attrs["report"]
    assert rep.rows_read == 30 and rep.rows_kept == 27
    assert sorted((d.reason, d.count) for d in rep.dropped) == [
        ("column 'mbps': infinite values", 1),
        ("column 'mbps': missing values (empty, NA or NaN)", 2),
    ]
    assert "dropped:" in rep.to_text() and "rows 1, 10" in rep.to_text()
    assert "all 30 values are missing" in _err(table.assign(mbps=np.nan), target="mbps")


def test_non_positive_values_under_log(write_csv, table):
    df = table.copy()
    df.loc[[2, 3], "mbps"] = [0.0, -4.0]
    msg = _err(write_csv(df), target="mbps", transform="log10")
    assert "column 'mbps': 2 zero or negative values (0.0, -4.0) under a log10 transform (rows 3, 4;" in msg
    assert "transform='identity'" in msg
    assert len(read_measurements(write_csv(df), target="mbps", transform="identity")) == 30
    gdf = read_measurements(write_csv(df), target="mbps", transform="log", allow_drop=True)
    assert len(gdf) == 28
    msg = _err(table.assign(mbps=-1.0), target="mbps", transform="log")
    assert "30 values are zero or negative" in msg
    with pytest.raises(ConfigError, match="unknown target transform 'sqrt'; allowed: identity, log10, log"):
        read_measurements(table, target="mbps", transform="sqrt")


def test_weights(write_csv, table):
    df = table.copy()
    df.loc[1, "tests"] = -3
    assert "column 'tests': 1 negative weight (row 2;" in _err(write_csv(df), weight="tests")
    assert "no weight column 'n'" in _err(write_csv(df), weight="n")


def test_too_few_points(write_csv, make_table):
    msg = _err(write_csv(make_table(7)))
    assert "only 7 usable point(s) of 7 read; at least 10 are needed" in msg
    df = make_table(12)
    df.loc[[0, 1, 2], "lat"] = np.nan
    msg = _err(write_csv(df), allow_drop=True)
    assert "only 9 usable point(s) of 12 read (3 dropped" in msg and "missing values" in msg


def test_time_problems(write_csv, table):
    assert "no time column was found" in _err(write_csv(table), quarter="2023")
    df = table.assign(quarter="2022Q4")
    msg = _err(write_csv(df), quarter="2023Q1")
    assert "column 'quarter': no rows in the period '2023Q1'; the file has 2022Q4" in msg
    assert "time period 'last year' is not understood" in _err(write_csv(df), quarter="last year")
    df = table.assign(when="soon")
    assert "no value is a date, quarter or year" in _err(write_csv(df), time="when")
    df = table.assign(when=["2023-01-05"] * 29 + ["later"])
    assert "column 'when': 1 value not readable as a date or quarter (row 30;" in _err(write_csv(df), time="when")


def test_unsupported_source_type():
    assert "cannot read a int" in _err(42)
