"""Strata from a column, a polygon layer, or the bundled county metro / non-metro split."""

from __future__ import annotations

import zipfile

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely

from gpcore.data import (
    COUNTY_METRO_LABEL,
    DataError,
    assign_strata,
    load_sample,
    read_measurements,
    sample_path,
    strata_counts,
)


@pytest.fixture(scope="module")
def pr2023():
    return load_sample("puerto_rico")


def test_county_metro_matches_the_files_join(pr2023):
    out = assign_strata(pr2023, "county_metro")
    expected = pr2023["county_metro"].map({True: "metro", False: "non-metro"}).fillna("unknown")
    assert (out["stratum"].astype(str).to_numpy() == expected.astype(str).to_numpy()).all()
    assert out.attrs["strata_label"] == COUNTY_METRO_LABEL == "metro / non-metro (county)"
    counts = out.attrs["strata_counts"]
    assert list(counts) == ["metro", "non-metro", "unknown"]
    assert sum(counts.values()) == len(pr2023) == 26397
    rep = out.attrs["report"]
    assert rep.strata == counts and rep.strata_label == COUNTY_METRO_LABEL
    assert any("labelled 'unknown'" in n for n in rep.notes)
    assert "strata [metro / non-metro (county)]" in rep.to_text() and "unknown:" in rep.to_text()
    assert "stratum" not in pr2023.columns  # input untouched
    assert pr2023.attrs["report"].strata is None


def test_county_metro_whole_files_counts():
    mo = read_measurements(sample_path("missouri_2020Q4"))
    counts = assign_strata(mo, "county_metro").attrs["strata_counts"]
    assert counts == {"metro": 12669, "unknown": 5478, "non-metro": 4412}
    only_mo = assign_strata(mo, "county_metro", state="mo").attrs["strata_counts"]
    assert only_mo["unknown"] == 5478
    with pytest.raises(DataError, match="no bundled counties for state 'TX'"):
        assign_strata(mo, "county_metro", state="TX")


def test_offshore_points_are_unknown_not_dropped(make_table):
    df = make_table(12)
    df.loc[0, ["lon", "lat"]] = [-64.0, 17.0]  # Caribbean sea
    out = assign_strata(read_measurements(df), "county_metro")
    assert len(out) == 12 and out["stratum"].iloc[0] == "unknown"


def test_column_source(pr2023, make_table):
    out = assign_strata(pr2023, "column", column="county_metro")
    assert out.attrs["strata_label"] == COUNTY_METRO_LABEL
    assert set(out["stratum"].unique()) == {"metro", "non-metro", "unknown"}
    df = make_table(20).assign(kind=["city", "farm", None, "city"] * 5)
    out = assign_strata(read_measurements(df), "column", column="kind")
    assert strata_counts(out) == {"city": 10, "farm": 5, "unknown": 5}
    assert out.attrs["strata_label"] == "column 'kind'"
    out = assign_strata(
        read_measurements(df.assign(b=[True, False] * 10)), "column", column="b", labels={True: "urban", False: "rural"}
    )
    assert strata_counts(out) == {"urban": 10, "rural": 10}
    with pytest.raises(DataError, match="no column 'nope' for strata"):
        assign_strata(out, "column", column="nope")
    with pytest.raises(DataError, match="distinct values"):
        assign_strata(pr2023, "column", column="lon")
    with pytest.raises(DataError, match="strata source 'census'"):
        assign_strata(out, "census")


def test_polygon_layers_in_any_format(tmp_path, make_table):
    pts = read_measurements(make_table(40))
    west = shapely.box(-67.0, 18.0, -66.3, 18.5)
    layer = gpd.GeoDataFrame({"name": ["west"]}, geometry=[west], crs=4326)
    expected = np.where(pts["lon"] <= -66.3, "urban", "rural")
    layer.to_file(tmp_path / "u.geojson", driver="GeoJSON")
    layer.to_crs(32619).to_file(tmp_path / "u.gpkg", driver="GPKG")
    (tmp_path / "shp").mkdir()
    layer.to_crs(3857).to_file(tmp_path / "shp" / "u.shp")
    with zipfile.ZipFile(tmp_path / "u.zip", "w") as zf:
        for f in (tmp_path / "shp").iterdir():
            zf.write(f, f.name)
    for src in (tmp_path / "u.geojson", tmp_path / "u.gpkg", tmp_path / "u.zip", layer.to_crs(32619), west):
        out = assign_strata(pts, "polygons", polygons=src)
        assert out["stratum"].tolist() == expected.tolist(), src
    out = assign_strata(pts, "polygons", polygons=(tmp_path / "u.zip").read_bytes(), inside="in", outside="out")
    assert set(out["stratum"]) <= {"in", "out"} and "in / out" in out.attrs["strata_label"]


def test_polygon_layer_errors(tmp_path, make_table):
    pts = read_measurements(make_table(12))
    gpd.GeoDataFrame({"a": [1]}, geometry=[shapely.Point(0, 0)], crs=4326).to_file(tmp_path / "p.geojson")
    with pytest.raises(DataError, match="not polygons"):
        assign_strata(pts, "polygons", polygons=tmp_path / "p.geojson")
    pd.DataFrame({"a": [1]}).to_csv(tmp_path / "t.csv")
    with pytest.raises(DataError, match="polygon layer must be GeoJSON"):
        assign_strata(pts, "polygons", polygons=tmp_path / "t.csv")
    with pytest.raises(DataError, match="needs polygons="):
        assign_strata(pts, "polygons")
