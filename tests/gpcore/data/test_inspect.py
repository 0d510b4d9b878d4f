"""`gpcore data inspect FILE`: the report for good files, the error and exit status 2 for bad ones."""

from __future__ import annotations

import argparse
import runpy
import sys

import geopandas as gpd
import numpy as np
import pytest
import shapely

from gpcore.data import SAMPLES, DataError, sample_path
from gpcore.data.inspect import add_inspect_arguments, inspect, parse_strata, run_inspect


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = add_inspect_arguments(argparse.ArgumentParser())
    code = run_inspect(parser.parse_args(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_every_sample_file_is_described(key, capsys):
    code, out, err = _run([str(sample_path(key)), "--y", "download_mbps", "--transform", "log10"], capsys)
    assert code == 0 and err == ""
    assert f"file:        {sample_path(key).name}" in out
    assert "coordinates: columns 'lon'/'lat'" in out
    assert "CRS:         EPSG:4326" in out
    assert "target='download_mbps'" in out and "transform:   log10" in out
    assert "dropped:     none" in out
    assert "strata [metro / non-metro (county)]:" in out and "  - metro: " in out


def test_quarter_strata_options_and_dropped_rows(capsys, tmp_path, make_table):
    code, out, _ = _run([str(sample_path("puerto_rico")), "--quarter", "2023Q4", "--strata", "county_metro"], capsys)
    assert code == 0
    assert "rows:        142803 read, 6427 kept" in out
    assert "outside the requested period '2023Q4'" in out and "unknown:" in out
    df = make_table(20)
    df.loc[[1, 2], "mbps"] = np.nan
    df.to_csv(tmp_path / "d.csv", index=False)
    code, out, _ = _run([str(tmp_path / "d.csv"), "--y", "mbps", "--allow-drop", "--strata", "none"], capsys)
    assert code == 0 and "rows:        20 read, 18 kept" in out
    assert "2 rows: column 'mbps': missing values (empty, NA or NaN) (rows 2, 3)" in out
    assert "strata:      none" in out
    poly = gpd.GeoDataFrame(geometry=[shapely.box(-67, 18, -66.3, 18.5)], crs=4326)
    poly.to_file(tmp_path / "urban.geojson", driver="GeoJSON")
    code, out, _ = _run(
        [str(tmp_path / "d.csv"), "--allow-drop", "--strata", f"polygons:{tmp_path / 'urban.geojson'}"], capsys
    )
    assert code == 0 and "strata [urban / rural (inside / outside urban.geojson)]" in out
    code, out, _ = _run([str(sample_path("missouri_2020Q4")), "--strata", "column:county_metro"], capsys)
    assert code == 0 and "non-metro: 4412" in out


@pytest.mark.parametrize(
    ("content", "name", "args", "expected"),
    [
        (b"", "empty.csv", [], "is empty (0 bytes)"),
        (b"lon,lat,y\n", "header.csv", [], "has a header (lon, lat, y) but no data rows"),
        (bytes(range(256)) * 8, "garbage.csv", [], "is not a text file"),
        (b"a,b\n1,2\n", "nocoords.csv", [], "no coordinate columns found; columns are: a, b"),
        (b"lon,lat\n-66,18\n", "few.csv", [], "only 1 usable point(s)"),
        (b"lon,lat\n" + b"-66,95\n" * 12, "lat.csv", [], "values outside [-90, 90]"),
        (b"lon,lat,y\n" + b"-66,18,-1\n" * 12, "neg.csv", ["--y", "y", "--transform", "log10"], "zero or negative"),
        (b"lon,lat\n" + b"-66,18\n" * 12, "x.csv", ["--y", "z"], "no target column 'z'"),
        (b"lon,lat\n" + b"-66,18\n" * 12, "x.csv", ["--max-mb", "0.00001"], "above the limit"),
        (b"lon,lat\n" + b"-66,18\n" * 12, "x.csv", ["--strata", "magic"], "--strata 'magic' is not understood"),
    ],
)
def test_bad_inputs_exit_2_with_the_error(tmp_path, capsys, content, name, args, expected):
    path = tmp_path / name
    path.write_bytes(content)
    code, out, err = _run([str(path), *args], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and expected in err


def test_inspect_function_and_strata_parser(make_table):
    text = inspect(make_table(15), y="mbps", transform="log", strata="none")
    assert "rows:        15 read, 15 kept" in text and "target='mbps'" in text and "extent:" in text
    assert parse_strata("column:kind") == ("column", {"column": "kind"})
    assert parse_strata("county_metro:MO") == ("county_metro", {"state": "MO"})
    assert parse_strata(None) == (None, {})
    with pytest.raises(DataError):
        inspect(b"lon\n1\n", name="bad.csv")


def test_module_entry_point(tmp_path, capsys, monkeypatch):
    """``python -m gpcore.data inspect FILE`` (run in-process: a fresh interpreter would re-import torch)."""

    def run(*argv) -> int:
        monkeypatch.setattr(sys, "argv", ["gpcore.data", "inspect", *argv])
        with pytest.raises(SystemExit) as info:
            runpy.run_module("gpcore.data", run_name="__main__", alter_sys=True)
        return info.value.code

    assert run(str(sample_path("missouri_2020Q4"))) == 0
    out = capsys.readouterr()
    assert "rows:        22559 read, 22559 kept" in out.out
    (tmp_path / "bad.xlsx").write_bytes(b"PK\x03\x04")
    assert run(str(tmp_path / "bad.xlsx")) == 2
    out = capsys.readouterr()
    assert "save the sheet as CSV" in out.err and out.out == ""
