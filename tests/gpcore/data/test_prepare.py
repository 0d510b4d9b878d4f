"""Target transforms, model inputs, splits, time parsing and quadkey maths."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcore.data import (
    DataError,
    block_ids,
    block_split,
    get_transform,
    model_inputs,
    quadkey,
    random_split,
    sample_path,
    temporal,
)
from gpcore.errors import ConfigError

# ---------------------------------------------------------------- transforms


@pytest.mark.parametrize("name", ["identity", "log10", "log"])
def test_transforms_round_trip(name):
    t = get_transform(name)
    y = np.array([[0.5, 1.0], [37.2, 1e4]])
    np.testing.assert_allclose(t.inverse(t.forward(y)), y, rtol=1e-14)
    assert t.name == name and t.forward(y).shape == (2, 2)


def test_transform_values_labels_and_lognormal_mean():
    t = get_transform("log10")
    assert float(t.forward(1000.0)) == pytest.approx(3.0)
    assert t.units_label("Mbps") == "log10(Mbps)"
    assert get_transform("identity").units_label("Mbps") == "Mbps"
    assert get_transform("log").units_label() == "log(y)"
    assert get_transform(None).name == "identity" and get_transform("LN").name == "log"
    assert get_transform(t) is t
    # mean of 10**V, V ~ N(mu, var), by Monte Carlo
    rng = np.random.default_rng(0)
    v = rng.normal(1.2, 0.3, 400_000)
    assert float(t.mean(1.2, 0.09)) == pytest.approx(np.mean(10**v), rel=5e-3)
    assert float(get_transform("log").mean(0.5, 0.04)) == pytest.approx(np.exp(0.52))
    assert float(get_transform("identity").mean(3.0, 5.0)) == 3.0
    assert t.invalid([1.0, 0.0, -1.0, np.nan]).tolist() == [False, True, True, False]
    assert not get_transform("identity").invalid([-1.0]).any()
    with pytest.raises(ConfigError, match="allowed: identity, log10, log"):
        get_transform("box-cox")


def test_model_inputs_from_attrs_and_errors():
    df = pd.DataFrame({"lon": [-66.0, -66.1], "lat": [18.0, 18.1], "y": [10.0, 0.0], "w": [1.0, 2.0]})
    m = model_inputs(df, target="y", weight="w")
    assert m.X.shape == (2, 2) and m.y.tolist() == [10.0, 0.0] and m.w.tolist() == [1.0, 2.0]
    assert model_inputs(df).y is None
    with pytest.raises(DataError, match="invalid under log10"):
        model_inputs(df, target="y", transform="log10")
    with pytest.raises(DataError, match="time_year"):
        model_inputs(df, use_time=True)


# ---------------------------------------------------------------- splits


@pytest.mark.parametrize("n", [0, 1, 7, 10, 101, 1000])
def test_random_split_partitions(n):
    tr, va, te = random_split(n, seed=3)
    allidx = np.concatenate([tr, va, te])
    assert sorted(allidx.tolist()) == list(range(n))
    assert len(va) == round(0.1 * n) and len(te) == round(0.1 * n)
    for part in (tr, va, te):
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)


def test_random_split_is_seeded():
    a = random_split(500, seed=1)
    b = random_split(500, seed=1)
    c = random_split(500, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[2], c[2])
    tr, va, te = random_split(100, fractions=(0.7, 0.1, 0.2))
    assert (len(tr), len(va), len(te)) == (70, 10, 20)
    with pytest.raises(ConfigError, match="sum to 1"):
        random_split(10, fractions=(0.8, 0.1, 0.2))


def test_block_split_keeps_blocks_whole():
    df = pd.read_parquet(sample_path("missouri_2020Q4"), columns=["lon", "lat"])
    lon, lat = df["lon"].to_numpy(), df["lat"].to_numpy()
    parts = block_split(lon, lat, block_km=20, seed=0)
    n = len(lon)
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))
    ids = block_ids(lon, lat, 20)
    owners = [set(ids[p]) for p in parts]
    assert not (owners[0] & owners[1]) and not (owners[0] & owners[2]) and not (owners[1] & owners[2])
    fracs = np.array([len(p) for p in parts]) / n
    np.testing.assert_allclose(fracs, [0.8, 0.1, 0.1], atol=0.02)
    again = block_split(lon, lat, block_km=20, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = block_split(lon, lat, block_km=20, seed=1)
    assert not np.array_equal(parts[2], other[2])


def test_block_sizes_are_in_km():
    # points 1 km apart along a parallel at 38N: 5 km blocks hold about 5 points each
    lat = np.full(200, 38.0)
    lon = -92.0 + np.arange(200) * (1.0 / (111.32 * np.cos(np.radians(38.0))))
    counts = np.bincount(block_ids(lon, lat, 5.0))
    assert 4 <= np.median(counts) <= 6


def test_block_split_errors():
    with pytest.raises(DataError, match="use a smaller block_km"):
        block_split([-66.0, -66.001, -66.002], [18.0, 18.0, 18.0], block_km=50)
    with pytest.raises(DataError, match="NaN"):
        block_split([np.nan, 1.0], [1.0, 2.0])
    with pytest.raises(ConfigError, match="block_km"):
        block_split([1.0, 2.0], [1.0, 2.0], block_km=0)


# ---------------------------------------------------------------- time


def test_parse_time_formats():
    vals = ["2023Q1", "2023-q2", "Q3 2023", "2023 Q4", "2023", "2023-02-15", None, "soon"]
    p = temporal.parse_time(vals)
    assert p["year"].tolist()[:6] == [2023] * 6
    assert p["quarter"].tolist()[:4] == [1, 2, 3, 4] and pd.isna(p["quarter"][4]) and p["quarter"][5] == 1
    np.testing.assert_allclose(p["decimal"][:5], [2023.125, 2023.375, 2023.625, 2023.875, 2023.5])
    assert 2023.12 < p["decimal"][5] < 2023.13
    assert np.isnan(p["decimal"][6]) and np.isnan(p["decimal"][7])
    assert temporal.quarter_labels(["2021-q3", "2021-08-01", "x"]).tolist() == ["2021Q3", "2021Q3", None]
    np.testing.assert_allclose(temporal.decimal_year(pd.Series([2020, 2021.25])), [2020.5, 2021.25])
    dt = pd.Series(pd.to_datetime(["2020-07-01", "2021-01-01"]))
    np.testing.assert_allclose(temporal.decimal_year(dt), [2020 + 182 / 366, 2021.0])


def test_select_time_specs():
    q = ["2021Q4", "2022Q1", "2022Q2", "2022Q3", "2023Q1", "2022-05-30"]
    assert temporal.select_time(q, "2022").tolist() == [False, True, True, True, False, True]
    assert temporal.select_time(q, "2022Q2").tolist() == [False, False, True, False, False, True]
    assert temporal.select_time(q, "2021Q4:2022Q1").tolist() == [True, True, False, False, False, False]
    assert temporal.select_time(q, ["2021", "2023"]).tolist() == [True, False, False, False, True, False]
    assert temporal.select_time(q, "2021Q4, 2023Q1").sum() == 2
    assert temporal.select_time(q, "all").all() and temporal.select_time(q, None).all()
    with pytest.raises(DataError, match="not understood"):
        temporal.select_time(q, "yesterday")
    assert temporal.find_time_column(["lon", "Quarter", "date"]) == "Quarter"


def test_a_period_selects_the_same_rows_however_it_is_written():
    """The parts of a period merge before rows are matched, so a bare year is kept when its four quarters are named in
    two halves, as when the year is named; the canonical spelling selects what the spec selects."""
    values = [2022, 2023, "2023Q2", "2023-11-02", "2024Q1", 2024]
    specs = ["2023", "2023Q1:2023Q2, 2023Q3:2023Q4", ["2023Q3", "2023Q1:2023Q2", "2023Q4"], "2023Q1:2023Q4"]
    for spec in specs:
        assert temporal.select_time(values, spec).tolist() == [False, True, True, True, False, False], spec
        assert temporal.canonical_period(spec) == "2023Q1:2023Q4"
    for spec in ["2022Q4:2023Q1, 2023Q3", "2024Q1, 2022", "2023Q2:2023Q3,2023Q3:2024Q1"]:
        canon = temporal.canonical_period(spec)
        assert temporal.select_time(values, canon).tolist() == temporal.select_time(values, spec).tolist(), spec
    assert temporal.canonical_period("2022Q4:2023Q1, 2023Q3") == "2022Q4:2023Q1,2023Q3"
    assert temporal.canonical_period(None) == temporal.canonical_period(" ALL ") == "all"
    assert temporal.canonical_period("2023Q2", known=["2023Q1", "2023Q2"]) == "2023Q2"
    assert temporal.canonical_period("2019:2030", known=["2023Q1", "2023Q2"]) == "all"
    assert temporal.find_time_column(["lon", "lat"]) is None


# ---------------------------------------------------------------- quadkeys


def test_quadkeys_match_the_ookla_tile_centres():
    df = pd.read_parquet(sample_path("puerto_rico"), columns=["quadkey", "lon", "lat"]).head(500)
    lon, lat, ok = quadkey.quadkey_centres(df["quadkey"])
    assert ok.all()
    np.testing.assert_allclose(lon, df["lon"], atol=1e-9)
    np.testing.assert_allclose(lat, df["lat"], atol=1e-9)
    tx, ty = quadkey.lonlat_to_tile(df["lon"], df["lat"], 16)
    assert quadkey.tile_to_quadkey(tx, ty, 16).tolist() == df["quadkey"].tolist()


@settings(max_examples=100, deadline=None)
@given(zoom=st.integers(1, 24), fx=st.floats(0, 1, exclude_max=True), fy=st.floats(0, 1, exclude_max=True))
def test_quadkey_round_trip(zoom, fx, fy):
    tx, ty = np.array([int(fx * 2**zoom)]), np.array([int(fy * 2**zoom)])
    key = quadkey.tile_to_quadkey(tx, ty, zoom)
    assert len(key[0]) == zoom
    px, py, z, ok = quadkey.parse_quadkeys(key)
    assert ok[0] and z[0] == zoom and px[0] == tx[0] and py[0] == ty[0]
    w, s, e, n = quadkey.tile_bounds(tx, ty, zoom)
    clon, clat = quadkey.tile_centre(tx, ty, zoom)
    assert w[0] < clon[0] < e[0] and s[0] < clat[0] < n[0]
    assert tuple(quadkey.lonlat_to_tile(clon, clat, zoom)) == (tx, ty)


def test_invalid_quadkeys():
    _, _, _, ok = quadkey.parse_quadkeys(["0123", "0124", "", None, np.nan, "31"])
    assert ok.tolist() == [True, False, False, False, False, True]
    lon, _, ok = quadkey.quadkey_centres(["x"])
    assert np.isnan(lon[0]) and not ok[0]
