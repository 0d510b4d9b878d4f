"""Readers and exports on inputs that used to pass silently wrong (issue 12, items 9, 10, 13)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpcore.data import DataError, export_predictions, read_measurements
from gpcore.data.export import spreadsheet_safe
from tests.gpcore.data.conftest import pr_table


def test_decimal_commas_that_would_shift_the_columns_are_an_error(tmp_path):
    t = pr_table(30)
    lines = ["lon,lat,mbps"] + [f"{a},{b},{str(c).replace('.', ',')}" for a, b, c in zip(t.lon, t.lat, t.mbps,
                                                                                       strict=True)]
    assert all(len(ln.split(",")) == 4 for ln in lines[1:] if "," in str(ln))
    path = tmp_path / "comma.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        read_measurements(path, target="mbps", allow_drop=True)
    msg = str(e.value)
    assert "comma.csv" in msg and "data row 1 has 4 fields but the header has 3" in msg
    assert "decimal comma" in msg


def test_trailing_delimiters_are_dropped_not_shifted(tmp_path):
    t = pr_table(30)
    path = tmp_path / "trailing.csv"
    path.write_text("lon,lat,mbps\n" + "".join(f"{a},{b},{c},\n" for a, b, c in zip(t.lon, t.lat, t.mbps,
                                                                                    strict=True)))
    gdf = read_measurements(path, target="mbps")
    np.testing.assert_allclose(gdf["lon"], t["lon"])
    np.testing.assert_allclose(gdf["mbps"], t["mbps"])


def test_projected_crs_holding_degrees_is_flagged(tmp_path):
    t = pr_table(30)
    feats = [{"type": "Feature", "properties": {"mbps": float(m)}, "geometry": {"type": "Point",
              "coordinates": [float(a), float(b)]}} for a, b, m in zip(t.lon, t.lat, t.mbps, strict=True)]
    gj = {"type": "FeatureCollection", "crs": {"type": "name", "properties": {"name": "urn:ogc:def:crs:EPSG::3857"}},
          "features": feats}
    path = tmp_path / "mercator.geojson"
    path.write_text(json.dumps(gj))
    with pytest.raises(DataError) as e:
        read_measurements(path, target="mbps")
    msg = str(e.value)
    assert "mercator.geojson" in msg and "3857" in msg and "crs='EPSG:4326'" in msg
    gdf = read_measurements(path, target="mbps", crs="EPSG:4326")  # the fix the message names
    np.testing.assert_allclose(gdf["lon"], t["lon"], atol=1e-9)


def test_utf16_csv_gets_the_save_as_utf8_hint(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(pr_table(30).to_csv(index=False).encode("utf-16"))
    with pytest.raises(DataError, match="UTF-16.*UTF-8"):
        read_measurements(path, target="mbps")
    path.write_bytes(pr_table(30).to_csv(index=False).encode("utf-16-le"))  # no byte-order mark
    with pytest.raises(DataError, match="UTF-16"):
        read_measurements(path, target="mbps")


def test_formula_cells_are_prefixed_in_csv_exports(tmp_path):
    import geopandas as gpd
    from shapely.geometry import box

    df = pd.DataFrame({"cell_id": ["=cmd|' /C calc'!A0", "+1+1", "@SUM(A1)", "-2", "ok", None],
                       "mean": [1.0, -2.0, 3.0, 4.0, 5.0, 6.0]})
    safe = spreadsheet_safe(df)
    assert list(safe["cell_id"][:5]) == ["'=cmd|' /C calc'!A0", "'+1+1", "'@SUM(A1)", "'-2", "ok"]
    assert safe["mean"].tolist() == df["mean"].tolist(), "numbers are never touched"
    grid = gpd.GeoDataFrame(df, geometry=[box(i, 0, i + 1, 1) for i in range(len(df))], crs="EPSG:4326")
    out = export_predictions(grid, tmp_path / "p.csv", columns=["mean"])
    text = out.read_text()
    assert "\n=cmd" not in text and "'=cmd" in text and "\n'+1+1" in text
