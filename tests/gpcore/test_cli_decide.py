"""`python -m gpcore exceed / areas / sample / suggest` on a small run: outputs and bad input (exit 2)."""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest

from gpcore.cli import main
from gpcore.data import synthetic
from gpcore.decide import exceedance, haversine_km
from gpcore.run.store import load_run

FAST = ["--set", "epochs=3", "--set", "rank=8", "--set", "hidden=8"]


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "speeds.csv"
    df = synthetic.synthetic_ookla(n=500, seed=4)
    df["download_mbps"] = df["avg_d_kbps"] / 1000
    df["tests_w"] = np.arange(len(df)) % 5 + 1.0
    df.drop(columns=["quadkey"]).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def run_dir(csv_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    rc = main(["fit", "--data", str(csv_file), "--x", "lon,lat", "--y", "download_mbps", "--transform", "log10",
               "--model", "dbk-mml", "--strata", "county_metro", "--grid", "square", "--cell-km", "25",
               "--out", str(out), *FAST])
    assert rc == 0
    return out


def test_exceed(run_dir, tmp_path, capsys):
    out = tmp_path / "p.parquet"
    assert main(["exceed", str(run_dir), "--threshold", "35", "--units", "original", "--out", str(out)]) == 0
    df = pd.read_parquet(out)
    _, model = load_run(run_dir)
    ref = exceedance(model, df[["lon", "lat"]].to_numpy(), np.log10(35.0))
    np.testing.assert_allclose(df["p_below"], ref.p_f, rtol=1e-6)
    np.testing.assert_allclose(df["p_below_y"], ref.p_y, rtol=1e-6)
    assert "undecided" in capsys.readouterr().out
    tif = tmp_path / "p.tif"
    assert main(["exceed", str(run_dir), "--threshold", "35", "--direction", "above", "--out", str(tif)]) == 0
    import rasterio

    with rasterio.open(tif) as src:
        assert src.count == 2 and src.descriptions == ("p_above", "p_above_y")


def test_areas_counties_and_strata(run_dir, csv_file, tmp_path, capsys):
    out = tmp_path / "areas.geojson"
    assert main(["areas", str(run_dir), "--areas", "counties", "--threshold", "25", "--weights", "area",
                 "--samples", "50", "--measurements", str(csv_file), "--out", str(out)]) == 0
    gdf = gpd.read_file(out)
    assert len(gdf) > 3 and {"area", "cells", "measurements", "mean", "p_below", "mean_arith", "samples"} <= set(gdf)
    assert (gdf["samples"] == 50).all() and gdf["p_below"].between(0, 1).all()
    assert gdf["p_below"].is_monotonic_decreasing  # ranked by P(area below)
    assert gdf["measurements"].sum() <= 500 and gdf["measurements"].sum() > 0
    csv = tmp_path / "strata.csv"
    assert main(["areas", str(run_dir), "--areas", "strata", "--threshold", "35", "--out", str(csv)]) == 0
    tab = pd.read_csv(csv)
    assert set(tab["area"]) <= {"metro", "non-metro", "unknown"} and tab["cells"].sum() > 0
    pts = tmp_path / "pts.parquet"
    assert main(["areas", str(run_dir), "--areas", "column:county_metro", "--points", str(csv_file),
                 "--weights", "tests_w", "--out", str(pts)]) == 0
    assert pd.read_parquet(pts)["cells"].sum() == 500


def test_sample_reproducible(run_dir, tmp_path):
    import rasterio

    a, b = tmp_path / "a.tif", tmp_path / "b.tif"
    for p in (a, b):
        assert main(["sample", str(run_dir), "--n", "3", "--seed", "4", "--out", str(p)]) == 0
    with rasterio.open(a) as sa, rasterio.open(b) as sb:
        assert sa.count == 3
        np.testing.assert_array_equal(sa.read(), sb.read())
        assert np.nanmin(sa.read()) > 0  # original units (Mbps)


def test_suggest(run_dir, tmp_path, capsys):
    out = tmp_path / "picks.geojson"
    assert main(["suggest", str(run_dir), "--k", "4", "--min-km", "60", "--out", str(out)]) == 0
    picks = gpd.read_file(out)
    assert list(picks["rank"]) == [1, 2, 3, 4] and (np.diff(picks["reduction"]) <= 1e-12).all()
    lon, lat = picks["lon"].to_numpy(), picks["lat"].to_numpy()
    d = haversine_km(lon[:, None], lat[:, None], lon[None], lat[None])
    assert (d[~np.eye(4, dtype=bool)] >= 60).all()
    csv = tmp_path / "picks.csv"
    assert main(["suggest", str(run_dir), "--k", "2", "--target", "stratum:metro", "--out", str(csv)]) == 0
    assert len(pd.read_csv(csv)) == 2


def test_suggest_among_uploaded_candidates(run_dir, csv_file, tmp_path):
    """Candidates from a file: the picks are rows of that file, the first one the brute-force argmax."""
    from gpcore.posterior import JointPosterior

    out = tmp_path / "picks.csv"
    assert main(["suggest", str(run_dir), "--k", "1", "--candidates", str(csv_file), "--engine", "dense",
                 "--out", str(out)]) == 0
    picks = pd.read_csv(out)
    cand = pd.read_csv(csv_file)[["lon", "lat"]].to_numpy()
    grid = pd.read_parquet(run_dir / "grid.parquet")[["lon", "lat"]].to_numpy()
    _, model = load_run(run_dir)
    jp = JointPosterior(model)
    C = jp.cov(grid, cand)
    red = (C**2).mean(0) / (np.diag(jp.cov(cand)) + model.noise_variance)
    best = cand[int(np.argmax(red))]
    np.testing.assert_allclose([picks.lon[0], picks.lat[0]], best, rtol=1e-9)


@pytest.mark.parametrize("argv,message", [
    (["exceed", "{run}", "--threshold", "0"], "must be > 0"),
    (["exceed", "{run}", "--threshold", "35", "--out", "x.txt"], "use a file ending in"),
    (["exceed", "{tmp}", "--threshold", "35"], "not a run directory"),
    (["areas", "{run}", "--weights", "population"], "no such column"),
    (["areas", "{run}", "--areas", "column:nope"], "has no column 'nope'"),
    (["suggest", "{run}", "--target", "undecided"], "needs --threshold"),
    (["suggest", "{run}", "--target", "stratum:urban"], "no cell in stratum 'urban'"),
    (["suggest", "{run}", "--k", "0"], "k=0"),
    (["sample", "{run}", "--n", "0", "--out", "s.tif"], "at least one sample"),
])
def test_bad_input_exits_2(argv, message, run_dir, tmp_path, capsys):
    argv = [a.replace("{run}", str(run_dir)).replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
