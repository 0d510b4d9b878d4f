"""Exports of grid predictions, each read back."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyogrio
import pytest
import rasterio

from gpcore.data import DataError, export_predictions, make_grid, read_measurements


def _with_predictions(g):
    rng = np.random.default_rng(0)
    mean = 1.0 + g["lon"].to_numpy() / 100
    sd = rng.uniform(0.1, 0.3, len(g))
    out = g.copy()
    out["mean"], out["sd"] = mean, sd
    out["lower"], out["upper"] = mean - 1.96 * sd, mean + 1.96 * sd
    out["width"] = out["upper"] - out["lower"]
    return out


@pytest.fixture(scope="module")
def square():
    return _with_predictions(make_grid((-66.4, -65.9, 18.15, 18.45), cell_km=1.0))


@pytest.fixture(scope="module")
def tiles():
    return _with_predictions(make_grid((-66.2, -66.0, 18.3, 18.45), kind="quadkey", zoom=14))


def test_geotiff_square_grid(square, tmp_path):
    path = export_predictions(square, tmp_path / "out" / "pred.tif", tags={"units": "log10(Mbps)"})
    spec = square.attrs["grid"]
    with rasterio.open(path) as src:
        assert src.count == 5 and src.descriptions == ("mean", "sd", "lower", "upper", "width")
        assert src.crs.to_epsg() == 32619
        assert tuple(src.transform)[:6] == pytest.approx(spec.transform)
        assert (src.width, src.height) == (spec.width, spec.height)
        assert src.tags()["units"] == "log10(Mbps)" and src.tags()["cell_km"] == "1"
        data = src.read()
        # every cell lands on its pixel, and the pixel centre is the cell centre
        vals = data[0, square["row"], square["col"]]
        np.testing.assert_allclose(vals, square["mean"], rtol=1e-6)
        np.testing.assert_allclose(data[4, square["row"], square["col"]], square["width"], rtol=1e-6)
        xs, ys = rasterio.transform.xy(src.transform, square["row"], square["col"])
        from gpcore.data._crs import project

        lon, lat = project(np.asarray(xs), np.asarray(ys), "EPSG:32619", "EPSG:4326")
        np.testing.assert_allclose(lon, square["lon"], atol=1e-9)
        np.testing.assert_allclose(lat, square["lat"], atol=1e-9)
        assert np.isnan(data).sum() == 5 * (spec.width * spec.height - len(square))


def test_geotiff_quadkey_grid_in_web_mercator(tiles, tmp_path):
    path = export_predictions(tiles, tmp_path / "tiles.tiff", columns=["mean", "sd"])
    with rasterio.open(path) as src:
        assert src.crs.to_epsg() == 3857 and src.count == 2
        assert src.res[0] == pytest.approx(tiles.attrs["grid"].cell_size)
        data = src.read(1)
        np.testing.assert_allclose(data[tiles["row"], tiles["col"]], tiles["mean"], rtol=1e-6)
    # a frame that lost its attrs (e.g. through pd.concat) still exports: the quadkeys place the cells
    lost = pd.concat([tiles.iloc[:10], tiles.iloc[10:]])
    lost.attrs = {}
    path = export_predictions(lost, tmp_path / "lost.tif")
    with rasterio.open(path) as src:
        assert src.read(1)[~np.isnan(src.read(1))].size == len(tiles)


@pytest.mark.parametrize("suffix", [".geojson", ".gpkg", ".parquet"])
def test_vector_exports_round_trip(square, tmp_path, suffix):
    path = export_predictions(square, tmp_path / f"pred{suffix}")
    back = pyogrio.read_dataframe(path) if suffix != ".parquet" else pd.read_parquet(path)
    assert len(back) == len(square)
    np.testing.assert_allclose(back["mean"], square["mean"])
    np.testing.assert_array_equal(back["cell_id"], square["cell_id"])
    if suffix != ".parquet":
        assert back.crs.to_epsg() == 4326 and (back.geometry.geom_type == "Polygon").all()
    # and the generic reader takes it back as points (polygon centroids)
    gdf = read_measurements(path, target="mean")
    np.testing.assert_allclose(gdf["lon"], square["lon"], atol=1e-4)
    if suffix == ".gpkg":
        assert pyogrio.list_layers(path)[0][0] == "predictions"


def test_csv_export_and_predictions_argument(tmp_path):
    g = make_grid((-66.4, -65.9, 18.15, 18.45), cell_km=2.0)
    preds = {"mean": np.arange(len(g), dtype=float), "sd": np.ones(len(g))}
    path = export_predictions(g, tmp_path / "p.csv", predictions=preds, columns=["mean", "sd"])
    back = pd.read_csv(path)
    assert list(back.columns) == ["cell_id", "row", "col", "lon", "lat", "mean", "sd"]
    np.testing.assert_allclose(back["mean"], preds["mean"])
    gdf = read_measurements(path, target="mean")
    np.testing.assert_allclose(gdf["lat"], g["lat"])


def test_frames_with_attrs_survive_parquet(square, tmp_path):
    square.to_parquet(tmp_path / "grid.parquet")
    back = pd.read_parquet(tmp_path / "grid.parquet")
    assert back.attrs["grid"]["width"] == square.attrs["grid"].width
    import geopandas as gpd

    back = gpd.read_parquet(tmp_path / "grid.parquet")
    path = export_predictions(back, tmp_path / "again.tif")
    with rasterio.open(path) as src:
        np.testing.assert_allclose(src.read(1)[square["row"], square["col"]], square["mean"], rtol=1e-6)
    read = read_measurements(square[["lon", "lat", "mean"]])
    read.to_parquet(tmp_path / "read.parquet")  # attrs["report"] is stored as JSON
    assert pd.read_parquet(tmp_path / "read.parquet").attrs["report"]["rows_kept"] == len(square)


def test_export_errors(square, tmp_path):
    with pytest.raises(DataError, match="cannot tell the export format of 'x.xlsx'"):
        export_predictions(square, tmp_path / "x.xlsx")
    with pytest.raises(DataError, match="no column"):
        export_predictions(square.drop(columns="sd"), tmp_path / "x.csv")
    with pytest.raises(DataError, match="has 3 values but the grid has"):
        export_predictions(square, tmp_path / "x.csv", predictions={"mean": [1, 2, 3]})
    lost = square.copy()
    lost.attrs = {}
    with pytest.raises(DataError, match="needs a grid from make_grid"):
        export_predictions(lost, tmp_path / "x.tif")


def test_parquet_stream_batches_and_shards(tmp_path):
    from gpcore.data.parquet_stream import ParquetSource

    df = pd.DataFrame({"cell_id": np.arange(1000), "lon": np.linspace(-66, -65, 1000), "name": ["a"] * 1000})
    df.to_parquet(tmp_path / "cells.parquet", row_group_size=128)
    src = ParquetSource(tmp_path / "cells.parquet", ["lon", "cell_id"])
    assert src.num_rows == 1000 and src.schema_names == ["cell_id", "lon", "name"]
    batches = list(src.iter_batches(300))
    assert [len(b["lon"]) for b in batches] == [300, 300, 300, 100]
    np.testing.assert_array_equal(np.concatenate([b["cell_id"] for b in batches]), df["cell_id"])
    shards = [src.read_shard(r, 3) for r in range(3)]
    assert [len(s["lon"]) for s in shards] == [334, 333, 333]
    np.testing.assert_array_equal(np.concatenate([s["cell_id"] for s in shards]), df["cell_id"])
    with pytest.raises(DataError, match="no column"):
        ParquetSource(tmp_path / "cells.parquet", ["x"])
    (tmp_path / "bad.parquet").write_text("nope")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        ParquetSource(tmp_path / "bad.parquet")
