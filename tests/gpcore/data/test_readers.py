"""read_measurements on every supported format and location source (the happy paths)."""

from __future__ import annotations

import io
import zipfile

import geopandas as gpd
import numpy as np
import pandas as pd
import pyproj
import pytest
import shapely

from gpcore.data import DataError, ReadReport, model_inputs, quadkey, read_measurements, sample_path


def _check_points(gdf, ref: pd.DataFrame, atol=1e-6):
    assert gdf.crs.to_epsg() == 4326
    assert (gdf.geometry.geom_type == "Point").all()
    assert gdf["lon"].dtype == float and gdf["lat"].dtype == float
    np.testing.assert_allclose(gdf["lon"], ref["lon"], atol=atol)
    np.testing.assert_allclose(gdf["lat"], ref["lat"], atol=atol)
    np.testing.assert_allclose(gdf.geometry.x, gdf["lon"])


@pytest.mark.parametrize(
    ("name", "sep"), [("a.csv", ","), ("b.csv", ";"), ("c.tsv", "\t"), ("d.txt", "|"), ("e.dat", "\t")]
)
def test_csv_delimiters_are_sniffed(write_csv, table, name, sep):
    gdf = read_measurements(write_csv(table, name, sep=sep), target="mbps")
    _check_points(gdf, table)
    rep = gdf.attrs["report"]
    assert isinstance(rep, ReadReport)
    assert rep.rows_read == rep.rows_kept == len(table)
    assert rep.columns["lon"] == "lon" and rep.columns["target"] == "mbps"
    assert rep.format.startswith("csv")
    assert list(gdf.columns[:4]) == ["lon", "lat", "mbps", "tests"]


@pytest.mark.parametrize(
    ("lon", "lat"), [("Longitude", "Latitude"), ("LNG", "LAT"), ("long", "lat"), ("X", "Y"), ("lon_deg", "lat_deg")]
)
def test_coordinate_names_are_found_case_insensitively(write_csv, table, lon, lat):
    df = table.rename(columns={"lon": lon, "lat": lat})
    gdf = read_measurements(write_csv(df))
    _check_points(gdf, table)
    assert gdf.attrs["report"].columns["lon"] == lon
    assert lon in gdf.columns  # original columns are kept


def test_explicit_columns_and_wkt_geometry(write_csv, table):
    df = table.rename(columns={"lon": "east", "lat": "north"})
    gdf = read_measurements(write_csv(df), lon="east", lat="north")
    _check_points(gdf, table)
    wkt = pd.DataFrame(
        {"where": [f"POINT ({a} {b})" for a, b in zip(table.lon, table.lat, strict=True)], "mbps": table.mbps}
    )
    gdf = read_measurements(write_csv(wkt, "w.csv"), geometry="where", target="mbps")
    _check_points(gdf, table)
    auto = wkt.rename(columns={"where": "WKT"})
    gdf = read_measurements(write_csv(auto, "w2.csv"))
    _check_points(gdf, table)
    assert gdf.attrs["report"].columns["geometry"] == "WKT"


def test_plain_csv_is_assumed_wgs84_and_crs_reprojects(write_csv, table):
    gdf = read_measurements(write_csv(table))
    assert gdf.attrs["report"].crs_in.startswith("EPSG:4326")
    assert any("EPSG:4326" in n and "assumed" in n for n in gdf.attrs["report"].notes)
    utm = pyproj.Transformer.from_crs(4326, 32619, always_xy=True)
    x, y = utm.transform(table.lon.to_numpy(), table.lat.to_numpy())
    proj = pd.DataFrame({"easting": x, "northing": y, "mbps": table.mbps})
    gdf = read_measurements(write_csv(proj, "utm.csv"), crs="EPSG:32619")
    _check_points(gdf, table, atol=1e-7)
    assert gdf.attrs["report"].crs_in.startswith("EPSG:32619")


def test_parquet_and_geoparquet(tmp_path, table):
    table.to_parquet(tmp_path / "t.parquet")
    _check_points(read_measurements(tmp_path / "t.parquet"), table)
    utm = gpd.GeoDataFrame(table, geometry=gpd.points_from_xy(table.lon, table.lat), crs=4326).to_crs(32619)
    utm.drop(columns=["lon", "lat"]).to_parquet(tmp_path / "g.parquet")
    gdf = read_measurements(tmp_path / "g.parquet", target="mbps")
    assert gdf.attrs["report"].format == "geoparquet"
    assert gdf.attrs["report"].crs_in.startswith("EPSG:32619")
    _check_points(gdf, table, atol=1e-7)


def test_geojson_geopackage_layers_and_zipped_shapefile(tmp_path, table):
    pts = gpd.GeoDataFrame(table, geometry=gpd.points_from_xy(table.lon, table.lat), crs=4326)
    pts.to_file(tmp_path / "p.geojson", driver="GeoJSON")
    _check_points(read_measurements(tmp_path / "p.geojson", target="mbps"), table)

    pts.to_file(tmp_path / "p.gpkg", layer="first", driver="GPKG")
    pts.iloc[:12].to_crs(3857).to_file(tmp_path / "p.gpkg", layer="second", driver="GPKG")
    gdf = read_measurements(tmp_path / "p.gpkg")
    assert len(gdf) == len(table) and any("layer=" in n for n in gdf.attrs["report"].notes)
    gdf2 = read_measurements(tmp_path / "p.gpkg", layer="second")
    _check_points(gdf2, table.iloc[:12], atol=1e-7)
    assert gdf2.attrs["report"].layer == "second"
    with pytest.raises(DataError, match=r"no layer 'third'; layers: first, second"):
        read_measurements(tmp_path / "p.gpkg", layer="third")

    shp_dir = tmp_path / "shp"
    shp_dir.mkdir()
    pts.to_crs(32619).to_file(shp_dir / "pts.shp")
    zpath = tmp_path / "pts.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in shp_dir.iterdir():
            zf.write(f, f"folder/{f.name}")
    gdf = read_measurements(zpath, target="mbps")
    assert gdf.attrs["report"].format == "shapefile"
    _check_points(gdf, table, atol=1e-7)
    # the same zip as an upload (bytes + name)
    gdf = read_measurements(zpath.read_bytes(), name="upload.zip")
    _check_points(gdf, table, atol=1e-7)


def test_polygons_become_projected_centroids(tmp_path):
    # triangles at 60N: the planar centroid in degrees differs from the true (projected) one
    lons = np.arange(10) * 0.5
    polys = [shapely.Polygon([(x, 60), (x + 2, 60), (x, 62)]) for x in lons]
    gdf_in = gpd.GeoDataFrame({"v": np.arange(10.0) + 1}, geometry=polys, crs=4326)
    gdf_in.to_file(tmp_path / "poly.geojson", driver="GeoJSON")
    gdf = read_measurements(tmp_path / "poly.geojson", target="v")
    laea = pyproj.CRS.from_proj4("+proj=laea +lat_0=61 +lon_0=3 +datum=WGS84")
    truth = gdf_in.to_crs(laea).centroid.to_crs(4326)
    np.testing.assert_allclose(gdf["lon"], truth.x, atol=5e-4)
    np.testing.assert_allclose(gdf["lat"], truth.y, atol=5e-4)
    naive = shapely.centroid(np.asarray(polys))  # planar in degrees: visibly different
    assert np.max(np.abs(shapely.get_x(naive) - truth.x)) > 5e-3
    assert "centroid" in gdf.attrs["report"].coordinates


def test_ookla_shapes_quadkey_tile_wkt_and_tile_xy(write_csv, tmp_path):
    src = pd.read_parquet(sample_path("missouri_2020Q4")).head(40)
    qk_only = src[["quadkey", "avg_d_kbps", "avg_u_kbps", "tests"]]
    gdf = read_measurements(write_csv(qk_only, "qk.csv"), target="download_mbps", transform="log10", weight="tests")
    np.testing.assert_allclose(gdf["lon"], src["lon"], atol=1e-6)
    np.testing.assert_allclose(gdf["lat"], src["lat"], atol=1e-6)
    np.testing.assert_allclose(gdf["download_mbps"], src["avg_d_kbps"] / 1000)
    np.testing.assert_allclose(gdf["upload_mbps"], src["avg_u_kbps"] / 1000)
    assert gdf["quadkey"].tolist() == src["quadkey"].tolist()  # leading zeros kept
    assert "quadkey" in gdf.attrs["report"].coordinates

    tx, ty, z, _ = quadkey.parse_quadkeys(src["quadkey"])
    w, s, e, n = quadkey.tile_bounds(tx, ty, z)
    tile = pd.DataFrame({"tile": shapely.to_wkt(shapely.box(w, s, e, n)), "avg_d_kbps": src["avg_d_kbps"]})
    gdf = read_measurements(write_csv(tile, "tile.csv"), target="download_mbps")
    np.testing.assert_allclose(gdf["lon"], src["lon"], atol=1e-6)
    np.testing.assert_allclose(gdf["lat"], src["lat"], atol=2e-5)  # area centroid vs mercator centre

    txy = pd.DataFrame({"tile_x": src["lon"], "tile_y": src["lat"], "avg_d_kbps": src["avg_d_kbps"]})
    gdf = read_measurements(write_csv(txy, "txy.csv"), target="download_mbps")
    np.testing.assert_allclose(gdf["lat"], src["lat"])

    # Ookla GeoJSON where some features have no geometry but all have a quadkey
    geo = gpd.GeoDataFrame(src[["quadkey", "avg_d_kbps"]], geometry=shapely.box(w, s, e, n), crs=4326)
    geo.loc[geo.index[:5], "geometry"] = None
    geo.to_file(tmp_path / "ookla.geojson", driver="GeoJSON")
    gdf = read_measurements(tmp_path / "ookla.geojson", target="download_mbps")
    assert len(gdf) == 40
    np.testing.assert_allclose(gdf["lon"], src["lon"], atol=1e-6)
    assert any("quadkey tile centre" in n for n in gdf.attrs["report"].notes)


def test_numeric_quadkeys_get_leading_zeros_back(write_csv):
    src = pd.read_parquet(sample_path("missouri_2020Q4")).head(20)
    df = pd.DataFrame({"quadkey": src["quadkey"].astype("int64"), "v": 1.0})
    path = write_csv(df)
    gdf = read_measurements(pd.read_csv(path), name="numbers.csv")
    np.testing.assert_allclose(gdf["lon"], src["lon"], atol=1e-6)
    assert any("leading zeros" in n for n in gdf.attrs["report"].notes)


def test_uploads_bytes_filelike_and_dataframes(table):
    text = table.to_csv(index=False).encode()
    for src in (text, io.BytesIO(text), bytearray(text)):
        gdf = read_measurements(src, name="upload.csv", target="mbps")
        _check_points(gdf, table)
        assert gdf.attrs["report"].file == "upload.csv"
    gdf = read_measurements(table, target="mbps")
    assert gdf.attrs["report"].format == "table"
    _check_points(gdf, table)


def test_time_column_filter_and_input(write_csv, make_table):
    df = make_table(40)
    df["quarter"] = ["2022Q4", "2023Q1", "2023Q2", "2023Q3"] * 10
    gdf = read_measurements(write_csv(df), target="mbps", quarter="2023")
    assert len(gdf) == 30
    assert sorted(gdf["quarter"].unique()) == ["2023Q1", "2023Q2", "2023Q3"]
    rep = gdf.attrs["report"]
    assert rep.columns["time"] == "quarter"
    assert rep.dropped[0].reason.startswith("outside the requested period '2023'") and rep.dropped[0].count == 10
    np.testing.assert_allclose(sorted(gdf["time_year"].unique()), [2023.125, 2023.375, 2023.625])
    m = model_inputs(gdf, use_time=True)
    assert m.X.shape == (30, 3) and m.columns == ("lon", "lat", "time_year")
    df["when"] = pd.date_range("2023-01-01", periods=40, freq="7D").strftime("%Y-%m-%d")
    gdf = read_measurements(write_csv(df.drop(columns="quarter"), "d.csv"), time="when", quarter="2023Q1")
    assert len(gdf) == 13


def test_ookla_samples_read_with_defaults():
    gdf = read_measurements(sample_path("missouri_2020Q4"), target="download_mbps", transform="log10", weight="tests")
    assert len(gdf) == 22559
    assert {"download_mbps", "upload_mbps", "time_year"} <= set(gdf.columns)
    m = model_inputs(gdf)
    assert m.X.shape == (22559, 2) and m.y.shape == (22559,) and m.w.shape == (22559,)
    np.testing.assert_allclose(m.y, np.log10(gdf["avg_d_kbps"] / 1000))
    assert m.transform.name == "log10"


def test_zipped_csv_and_latin1(tmp_path, table):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("inner/data.csv", table.to_csv(index=False))
    gdf = read_measurements(buf.getvalue(), name="data.zip")
    _check_points(gdf, table)
    df = table.assign(place="San Germán")
    path = tmp_path / "latin.csv"
    path.write_bytes(df.to_csv(index=False).encode("cp1252"))
    gdf = read_measurements(path)
    assert gdf["place"].iloc[0] == "San Germán"
    assert any("Latin-1" in n for n in gdf.attrs["report"].notes)


def test_longitudes_in_0_360_are_converted(write_csv, table):
    df = table.assign(lon=table.lon + 360)
    gdf = read_measurements(write_csv(df))
    _check_points(gdf, table, atol=1e-9)
    assert any("0-360" in n for n in gdf.attrs["report"].notes)


def test_semicolon_file_with_decimal_commas(write_text, table):
    lines = ["lon;lat;mbps"] + [
        f"{a};{b};{str(c).replace('.', ',')}" for a, b, c in zip(table.lon, table.lat, table.mbps, strict=True)
    ]
    gdf = read_measurements(write_text("eu.csv", "\n".join(lines)), target="mbps")
    assert gdf["mbps"].dtype == float
    np.testing.assert_allclose(gdf["mbps"], table.mbps)
    assert any("decimal commas" in n for n in gdf.attrs["report"].notes)
    lines = ["lon;lat;mbps"] + [
        f"{str(a).replace('.', ',')};{str(b).replace('.', ',')};{str(c).replace('.', ',')}"
        for a, b, c in zip(table.lon, table.lat, table.mbps, strict=True)
    ]
    gdf = read_measurements(write_text("eu2.csv", "\n".join(lines)), decimal=",", target="mbps")
    _check_points(gdf, table)
