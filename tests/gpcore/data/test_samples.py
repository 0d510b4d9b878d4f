"""Bundled samples and the synthetic generators with known truth."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from gpcore.data import SAMPLES, DataError, load_sample, model_inputs, sample_path, synthetic
from gpcore.data._bundled import sample_data_dir

SHA256 = {  # file -> sha256, as in sample_data/README.md
    name: digest
    for digest, name in (
        (
            "4343493ce8584554467625417459caea4dd450539967f7a70fb272ee6ce90ca5",
            "ookla_mobile_missouri_region_2020Q4.parquet",
        ),
        (
            "b005944de59e506335b0b22737c599dbcec8e604a1fc425937dcf2a9637db2c1",
            "ookla_mobile_puerto_rico_2019Q1-2023Q4.parquet",
        ),
        (
            "ed7183e0466f7b46980a29982c221208fc63e8f8b97df1a127c7890f721d1857",
            "us_counties_tiger2009_rucc2023_GA_NM_MO_PR_HI.geojson",
        ),
        (
            "925954750a2866dcade6dc060e3111343d0726a6e1d10b62de44e8a06178786c",
            "us_states_cb2022_500k_GA_NM_MO_PR_HI.geojson",
        ),
        ("6ad790651cbcca47984b357e46ff37c56a3cc34f11137012652953bf68951e1f", "usda_rucc2023_GA_NM_MO_PR_HI.csv"),
    )
}


def test_bundled_files_are_the_documented_ones():
    folder = sample_data_dir()
    for name, digest in SHA256.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    readme = (folder / "README.md").read_text()
    for name in SHA256:
        assert name in readme
    notice = (folder / "NOTICE").read_text() + (folder / "LICENSE-ookla.md").read_text()
    assert "CC BY-NC-SA 4.0" in notice and "2026-11" in notice and "Uncertainty Atlas" in notice
    assert "2019Q1–2023Q4" in notice and "2020Q4" in notice
    assert not any(p in notice for p in ("[DATE]", "[LICENSEE", "[DATA TIME PERIOD]"))


def test_samples_table():
    assert set(SAMPLES) == {"puerto_rico", "missouri_2020Q4", "synthetic"}
    pr = SAMPLES["puerto_rico"]
    assert pr.default_quarter == "2023" and pr.state == "PR" and len(pr.quarters) == 20
    assert pr.target == "download_mbps" and pr.transform == "log10"
    assert "2019Q1-2023Q4" in pr.attribution and "Uncertainty Atlas" in pr.attribution
    for key in SAMPLES:
        assert sample_path(key).is_file()
    with pytest.raises(DataError, match="no sample data set 'texas'; available: puerto_rico"):
        sample_path("texas")


def test_load_sample_quarters():
    pr = load_sample("puerto_rico")
    assert len(pr) == 26397 and set(pr["quarter"]) == {"2023Q1", "2023Q2", "2023Q3", "2023Q4"}
    assert pr.attrs["sample"].key == "puerto_rico" and pr.attrs["target"] == "download_mbps"
    assert len(load_sample("puerto_rico", quarter="2020Q2")) == 1277
    assert len(load_sample("puerto_rico", quarter="all")) == 142803
    assert len(load_sample("missouri_2020Q4")) == 22559
    up = load_sample("missouri_2020Q4", target="upload_mbps")
    assert up.attrs["target"] == "upload_mbps"


def test_hetero_1d_matches_the_paper_generator():
    x, y, mu, sd = synthetic.hetero_1d(20_000, seed=1)
    assert x.shape == y.shape == mu.shape == sd.shape == (20_000,)
    assert x.min() >= -1 and x.max() <= 1
    # plateaus of the step function and the noise envelope
    assert synthetic.mu_1d(np.array([-0.9, -0.3, 0.2, 0.7])) == pytest.approx([0.3, 0.9, -0.6, 0.0], abs=1e-6)
    np.testing.assert_allclose(sd, 0.2 * np.abs(np.sin(10 * x)))
    z = (y - mu) / np.where(sd > 0.02, sd, np.nan)
    assert np.nanmean(z) == pytest.approx(0, abs=0.03) and np.nanstd(z) == pytest.approx(1, abs=0.03)
    x2, y2, _, _ = synthetic.hetero_1d(20_000, seed=1)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    _, _, _, sd_big = synthetic.hetero_1d(10, seed=1, amplitude=2.0)
    np.testing.assert_allclose(sd_big, 10 * sd[:10])


def test_hetero_2d():
    X, y, mu, sd = synthetic.hetero_2d(5000, seed=0)
    assert X.shape == (5000, 2) and np.abs(X).max() <= 1
    np.testing.assert_allclose(mu, synthetic.mu_1d(X[:, 0]) + synthetic.mu_1d(X[:, 1]))
    assert sd.max() <= 0.2 + 1e-12 and sd.min() >= 0
    Xb, yb, _, _ = synthetic.hetero_2d(5000, seed=0, bbox=(-67.0, -65.0, 17.8, 18.6))
    assert np.array_equal(yb, y)
    assert Xb[:, 0].min() >= -67.0 and Xb[:, 1].max() <= 18.6
    np.testing.assert_allclose(np.column_stack(synthetic.to_unit(Xb[:, 0], Xb[:, 1], (-67.0, -65.0, 17.8, 18.6))), X)


def test_synthetic_ookla_schema_and_truth():
    df = synthetic.synthetic_ookla(3000, seed=4)
    real = pd.read_parquet(sample_path("missouri_2020Q4")).head(1)
    shared = [
        "quarter",
        "quadkey",
        "lon",
        "lat",
        "avg_d_kbps",
        "avg_u_kbps",
        "avg_lat_ms",
        "tests",
        "devices",
        "county_metro",
    ]
    assert set(shared) <= set(real.columns) and list(df.columns[: len(shared)]) == shared
    assert len(df) == 3000 and not df.duplicated(["quarter", "quadkey"]).any()
    assert (df["tests"] >= df["devices"]).all() and (df["devices"] >= 1).all()
    w, e, s, n = synthetic.SYNTH_BBOX
    assert df["lon"].between(w - 0.01, e + 0.01).all() and df["lat"].between(s - 0.01, n + 0.01).all()
    q = df["quarter"].map({q: i for i, q in enumerate(synthetic.DEFAULT_QUARTERS)}).to_numpy()
    mu, sd = synthetic.ookla_truth(df["lon"], df["lat"], q)
    np.testing.assert_allclose(df["true_mean_log10_mbps"], mu)
    z = (np.log10(df["avg_d_kbps"] / 1000) - mu) / sd
    assert abs(z.mean()) < 0.06 and abs(z.std() - 1) < 0.05
    urban = df["county_metro"].to_numpy()
    assert df.loc[urban, "true_sd_log10_mbps"].mean() < df.loc[~urban, "true_sd_log10_mbps"].mean()
    assert np.array_equal(df, synthetic.synthetic_ookla(3000, seed=4))


def test_bundled_synthetic_file_is_reproducible(tmp_path):
    synthetic.write_synthetic_sample(tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_bytes() == sample_path("synthetic").read_bytes()
    gdf = load_sample("synthetic")
    assert len(gdf) == 4000
    m = model_inputs(gdf)
    z = (m.y - gdf["true_mean_log10_mbps"]) / gdf["true_sd_log10_mbps"]
    assert abs(z.mean()) < 0.06
