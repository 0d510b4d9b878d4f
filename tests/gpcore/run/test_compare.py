"""`python -m gpcore compare` on random AND spatial-block splits: runs, tables ranked per split, the summary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpcore.cli import main
from gpcore.data.splits import block_ids
from gpcore.run.compare import compare_models, rank_within_splits, split_label, split_summary
from gpcore.run.config import RunConfig
from tests.sample_files import write_speeds_csv

FAST = ["--set", "epochs=2", "--set", "dbk-silu.rank=8", "--set", "dbk-silu.hidden=8", "--set", "batch_size=256",
        "--set", "svgp.num_inducing=16"]
MODELS = "dbk-silu,svgp"
BLOCK_KM = 50.0  # the synthetic points spread over ~400 x 430 km: 64 occupied blocks


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    return write_speeds_csv(tmp_path_factory.mktemp("cmp") / "speeds.csv", n=600, seed=3)


def compare_args(csv_file, out, *extra):
    return ["compare", "--data", str(csv_file), "--y", "download_mbps", "--transform", "log10", "--models", MODELS,
            "--strata", "column:county_metro", "--grid", "none", "--block-km", f"{BLOCK_KM:g}", "--out", str(out),
            *FAST, *extra]


@pytest.fixture(scope="module")
def both(csv_file, tmp_path_factory):
    """One default compare: both splits."""
    out = tmp_path_factory.mktemp("cmp") / "both"
    assert main(compare_args(csv_file, out)) == 0
    return out


def strict_json(text: str):
    def no_constant(c):
        raise AssertionError(f"metrics.json holds a bare {c}")

    return json.loads(text, parse_constant=no_constant)


def test_compare_fits_every_model_on_both_splits_by_default(both):
    for split in ("random", "block"):
        for model in MODELS.split(","):
            manifest = json.loads((both / "runs" / split / model / "run.json").read_text())
            assert manifest["config"]["split"] == split and manifest["config"]["model"] == model
            assert manifest["config"]["block_km"] == BLOCK_KM
            assert split in manifest["label"], "the run's title says which split it was tested on"
    table = pd.read_csv(both / "metrics.csv")
    assert set(zip(table["split"], table["model"], strict=True)) == {
        (s, m) for s in ("random", "block") for m in MODELS.split(",")}
    assert table.loc[table.split == "block", "block_km"].eq(BLOCK_KM).all()
    assert table.loc[table.split == "random", "block_km"].isna().all()
    assert list(dict.fromkeys(table["split"])) == ["random", "block"], "rows grouped by split, random first"
    # the runs' own metrics are what the table holds
    for split in ("random", "block"):
        own = pd.read_csv(both / "runs" / split / "svgp" / "metrics.csv").set_index("group")["nll"]
        rows = table[(table.split == split) & (table.model == "svgp")].set_index("group")["nll"]
        pd.testing.assert_series_equal(rows.sort_index(), own.sort_index(), check_names=False)


def test_ranking_is_within_each_split(both):
    table = pd.read_csv(both / "metrics.csv")
    for split in ("random", "block"):
        overall = table[(table.split == split) & (table.group == "all")].sort_values("rank")
        assert list(overall["rank"]) == [1, 2]
        assert overall["nll"].is_monotonic_increasing
        # every row of a model carries its rank within this split
        part = table[table.split == split]
        for model, rank in zip(overall["model"], overall["rank"], strict=True):
            assert part.loc[part.model == model, "rank"].eq(rank).all()


def test_block_test_rows_are_whole_blocks_away_from_training(both, csv_file):
    """No test row of the block split shares its block with a training or validation row (the random split's do)."""
    data = pd.read_csv(csv_file)
    ids = pd.Series(block_ids(data["lon"].to_numpy(), data["lat"].to_numpy(), BLOCK_KM),
                    index=pd.MultiIndex.from_arrays([data["lon"].round(9), data["lat"].round(9)]))
    shared = {}
    for split in ("random", "block"):
        test = pd.read_parquet(both / "runs" / split / "svgp" / "test_predictions.parquet")
        key = pd.MultiIndex.from_arrays([test["lon"].round(9), test["lat"].round(9)])
        assert key.isin(ids.index).all() and len(test) > 40
        test_blocks = set(ids.loc[key])
        other_blocks = set(ids[~ids.index.isin(key)])
        shared[split] = test_blocks & other_blocks
    assert not shared["block"], f"blocks split between test and training: {sorted(shared['block'])[:5]}"
    assert shared["random"], "a random split puts test rows in training blocks (else this check proves nothing)"


def test_outputs_name_each_split_and_summarise_the_change(both):
    table = pd.read_csv(both / "metrics.csv")
    summary = pd.read_csv(both / "split_summary.csv")
    assert sorted(summary["model"]) == sorted(MODELS.split(",")) and set(summary["split"]) == {f"block {BLOCK_KM:g} km"}
    for _, row in summary.iterrows():
        r = table[(table.model == row.model) & (table.group == "all") & (table.split == "random")].iloc[0]
        b = table[(table.model == row.model) & (table.group == "all") & (table.split == "block")].iloc[0]
        assert row.nll_random == pytest.approx(r.nll) and row.nll_block == pytest.approx(b.nll)
        assert row.nll_change == pytest.approx(b.nll - r.nll)
        assert row.coverage_change == pytest.approx(b.coverage - r.coverage)
    doc = strict_json((both / "metrics.json").read_text())
    assert doc["splits"] == ["random", "block"]
    assert {m["split"] for m in doc["metrics"]} == {"random", "block"}
    assert len(doc["split_summary"]) == len(summary)
    md = (both / "metrics.md").read_text()
    assert md.startswith("# Model comparison")
    i_random, i_block, i_summary = (md.index("## Random split"), md.index("## Spatial blocks"),
                                    md.index("## Random vs spatial blocks"))
    assert i_random < i_block < i_summary
    first = summary.iloc[0]
    assert f"| {first.model} | block {BLOCK_KM:g} km | {first.nll_random:.4f} | {first.nll_block:.4f} |" in md


def test_one_split_alone_keeps_the_old_behaviour(csv_file, tmp_path):
    out = tmp_path / "random"
    assert main(compare_args(csv_file, out, "--splits", "random")) == 0
    table = pd.read_csv(out / "metrics.csv")
    assert set(table["split"]) == {"random"} and not (out / "split_summary.csv").exists()
    assert "## Random vs spatial blocks" not in (out / "metrics.md").read_text()
    assert not (out / "runs" / "block").exists()
    # the Python API without splits= evaluates the base config's split only (as benchmarks call it)
    base = RunConfig(data=str(csv_file), y="download_mbps", transform="log10", split="block", block_km=BLOCK_KM,
                     grid_kind="none", settings={"epochs": 2, "num_inducing": 16})
    api = compare_models(base, ["svgp"], tmp_path / "api", log=lambda m: None)
    assert set(api["split"]) == {"block"} and (tmp_path / "api" / "runs" / "block" / "svgp" / "run.json").is_file()


@pytest.mark.parametrize("extra, message", [
    (["--splits", "random,holdout"], "give one or both of 'random' and 'block'"),
    (["--splits", "block,block"], "each once"),
    (["--split", "random", "--splits", "block"], "disagree"),
])
def test_bad_splits_are_an_error_naming_the_fix(csv_file, tmp_path, capsys, extra, message):
    assert main(compare_args(csv_file, tmp_path / "bad", *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bad" / "runs").exists()


def test_too_large_blocks_say_how_to_fix_it(csv_file, tmp_path, capsys):
    args = compare_args(csv_file, tmp_path / "huge", "--splits", "random,block")
    args[args.index("--block-km") + 1] = "5000"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--block-km" in err and "--splits random" in err


def test_summary_and_ranking_of_a_hand_made_table():
    rows = []
    for split, km, nlls, covs in (("random", np.nan, (0.5, 0.4), (0.95, 0.96)), ("block", 10.0, (0.6, 0.9),
                                                                                  (0.9, 0.8))):
        for model, nll, cov in zip(("a", "b"), nlls, covs, strict=True):
            rows.append(dict(model=model, split=split, block_km=km, group="all", nll=nll, coverage=cov))
            rows.append(dict(model=model, split=split, block_km=km, group="rural", nll=nll + 1, coverage=cov))
    table = rank_within_splits(pd.DataFrame(rows), ["random", "block"])
    overall = table[table.group == "all"]
    assert list(zip(overall.split, overall.model, overall["rank"], strict=True)) == [
        ("random", "b", 1), ("random", "a", 2), ("block", "a", 1), ("block", "b", 2)]
    s = split_summary(table).set_index("model")
    assert s.loc["a", "split"] == "block 10 km"
    assert s.loc["a", "nll_change"] == pytest.approx(0.1) and s.loc["b", "nll_change"] == pytest.approx(0.5)
    assert s.loc["b", "coverage_change"] == pytest.approx(-0.16)
    assert split_summary(table[table.split == "random"]).empty
    assert split_label("random", 10) == "random" and split_label("block", 2.5) == "block 2.5 km"


def test_coverage_bands_by_held_out_block_on_a_block_run_and_binomial_on_a_random_one(both):
    """Each group of a run's metrics gets its coverage (equal to the metrics') and a band: by the test rows'
    ``block_km`` blocks on the block split (against the formula, looped by block), binomial on the random split."""
    from gpcore import metrics as M
    from gpcore.run import rundir
    from gpcore.run.compare import coverage_bands
    from gpcore.run.pipeline import NO_RECAL

    for split in ("random", "block"):
        run = both / "runs" / split / "svgp"
        config = json.loads((run / "run.json").read_text())["config"]
        test = rundir.read_test_predictions(run)
        bands = coverage_bands(test, config).set_index("group")
        metrics = rundir.read_metrics(run).set_index("group")
        metrics = metrics[~metrics.index.str.endswith(NO_RECAL)]  # the same rows before recalibration: no band
        assert set(bands.index) == set(metrics.index), "one band per group of the run's metrics"
        for group in bands.index:
            assert bands.loc[group, "coverage"] == pytest.approx(metrics.loc[group, "coverage"], abs=1e-12)
            assert bands.loc[group, "n"] == metrics.loc[group, "n"]
        inside = (np.abs(test["y"] - test["mean"]) <= M.Z95 * np.sqrt(test["var_y"])).to_numpy()
        if split == "random":
            assert (bands["band"] == "binomial").all()
            assert bands.loc["all", "two_se"] == pytest.approx(2 * M.coverage_se(len(test)), rel=1e-12)
            continue
        assert (bands["band"] == "block").all()
        blocks = block_ids(test["lon"].to_numpy(), test["lat"].to_numpy(), BLOCK_KM)
        assert len(np.unique(blocks)) > 3
        r = np.array([np.sum(inside[blocks == b] - 0.95) for b in np.unique(blocks)])
        assert bands.loc["all", "two_se"] == pytest.approx(2 * np.sqrt(np.sum(r**2)) / len(test), rel=1e-12)
        assert bands.loc["all", "two_se"] != pytest.approx(2 * M.coverage_se(len(test)), rel=1e-3)
    # the compare table carries the same band (coverage_2se), and metrics.md writes it beside the coverage
    table = pd.read_csv(both / "metrics.csv")
    for split in ("random", "block"):
        run = both / "runs" / split / "svgp"
        config = json.loads((run / "run.json").read_text())["config"]
        bands = coverage_bands(rundir.read_test_predictions(run), config).set_index("group")["two_se"]
        rows = table[(table.split == split) & (table.model == "svgp")].set_index("group")
        assert rows.loc["all", "coverage_2se"] == pytest.approx(bands["all"], rel=1e-9)
        assert rows.loc[rows.index.str.endswith(NO_RECAL), "coverage_2se"].isna().all()
        c, b = rows.loc["all", "coverage"], bands["all"]
        cell = f"{100 * c:.1f}% ± {100 * b:.1f}{' ✗' if abs(c - 0.95) > b else ''} |"
        assert cell in (both / "metrics.md").read_text()


def test_seed_summary_pairs_models_on_their_shared_seeds():
    """Means, the pooled coverage and the paired difference over the seeds every model has, computed by hand; a model
    with one seed is left out rather than shrinking the comparison to one split."""
    import math

    from gpcore.run.compare import seed_summary

    rows = [  # (model, seed, nll, crps, coverage, n)
        ("a", 0, 0.80, 0.30, 0.96, 100), ("a", 1, 0.70, 0.28, 0.94, 300), ("a", 2, 0.90, 0.33, 0.95, 200),
        ("b", 0, 0.78, 0.31, 0.93, 100), ("b", 1, 0.75, 0.29, 0.97, 300), ("b", 2, 0.95, 0.34, 0.92, 200),
        ("c", 0, 0.10, 0.10, 0.95, 100),  # one seed only: left out
    ]
    table = pd.DataFrame(rows, columns=["model", "seed", "nll", "crps", "coverage", "n"])
    out, left = seed_summary(table)
    assert left == ["c"]
    assert list(out["model"]) == ["a", "b"] and list(out["seeds"]) == [3, 3]
    a, b = out.iloc[0], out.iloc[1]
    assert a["nll"] == pytest.approx((0.80 + 0.70 + 0.90) / 3) and b["nll"] == pytest.approx((0.78 + 0.75 + 0.95) / 3)
    assert b["crps"] == pytest.approx((0.31 + 0.29 + 0.34) / 3)
    assert b["coverage"] == pytest.approx((0.93 * 100 + 0.97 * 300 + 0.92 * 200) / 600)
    assert b["two_se"] == pytest.approx(2 * math.sqrt(0.95 * 0.05 / 600))
    d = np.array([0.78 - 0.80, 0.75 - 0.70, 0.95 - 0.90])  # b - a per seed
    assert b["nll_vs_best"] == pytest.approx(d.mean())
    assert b["nll_vs_best_2se"] == pytest.approx(2 * d.std(ddof=1) / math.sqrt(3))
    assert a["nll_vs_best"] == 0.0 and a["nll_vs_best_2se"] == 0.0
    assert (int(a["best_on"]), int(b["best_on"])) == (2, 1)  # b has the lower NLL on seed 0 only

    one, left = seed_summary(table[table["seed"] == 0])
    assert one.empty and left == ["a", "b", "c"], "one shared seed is no comparison across seeds"


def test_compare_over_seeds_pairs_the_models_on_every_seed(csv_file, tmp_path, capsys):
    """``compare --seeds 0,1``: one comparison per seed (its runs hold that seed) and seed_summary.csv equal to
    seed_summary over the two seeds' own metrics tables."""
    from gpcore.run.compare import seed_summary

    out = tmp_path / "seeds"
    assert main(compare_args(csv_file, out, "--splits", "random", "--seeds", "0,1")) == 0
    assert "# Across split seeds 0, 1" in capsys.readouterr().out
    per_seed = []
    for seed in (0, 1):
        for model in MODELS.split(","):
            cfg = json.loads((out / f"seed{seed}" / "runs" / "random" / model / "run.json").read_text())["config"]
            assert cfg["seed"] == seed
        t = pd.read_csv(out / f"seed{seed}" / "metrics.csv")
        per_seed.append(t[t.group == "all"].assign(seed=seed))
    expected, left_out = seed_summary(pd.concat(per_seed)[["model", "seed", "nll", "crps", "coverage", "n"]])
    got = pd.read_csv(out / "seed_summary.csv")
    assert left_out == [] and list(got["split"]) == ["random"] * 2
    assert list(got["model"]) == list(expected["model"])
    np.testing.assert_allclose(got[["nll", "crps", "coverage", "nll_vs_best"]].to_numpy(),
                               expected[["nll", "crps", "coverage", "nll_vs_best"]].to_numpy(), rtol=1e-9)
    assert per_seed[0]["nll"].tolist() != per_seed[1]["nll"].tolist(), "the seeds hold out other rows"


@pytest.mark.parametrize("seeds", ["0", "0,0", "a,b", "0,-1"])
def test_compare_seeds_needs_two_different_seeds(csv_file, tmp_path, capsys, seeds):
    assert main(compare_args(csv_file, tmp_path / "bad", "--seeds", seeds)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --seeds"), err


def test_coverage_bands_score_each_run_with_its_noise_shape():
    """A run with a skewed predictive (its shape in the test table's columns) is judged on the mixture's intervals,
    not on a Gaussian of the same variance."""
    from gpcore import metrics as M
    from gpcore.models.noise_shape import NoiseShape
    from gpcore.run.compare import coverage_bands

    shape = NoiseShape(latent_scale=0.7, c1=1.3, c2=0.01, pi=0.3, offset=0.9)
    rng = np.random.default_rng(4)
    n = 3000
    var_f, s = rng.uniform(0.01, 0.1, n), rng.uniform(0.05, 0.3, n)
    mean = rng.normal(size=n)
    y = mean + np.where(rng.random(n) < 0.3, 0.9 * np.sqrt(s), np.sqrt(1.3 * s) * rng.standard_normal(n)) \
        + np.sqrt(var_f) * rng.standard_normal(n)
    var_y = var_f + shape.noise_factor() * s
    test = pd.DataFrame({"lon": rng.uniform(0, 1, n), "lat": rng.uniform(0, 1, n), "y": y, "mean": mean,
                         "var_y": var_y, "var_f": var_f, "stratum": np.where(np.arange(n) % 2, "metro", "non-metro")})
    lo, hi = shape.interval(0.95, var_f, s)
    inside = (y - mean >= lo) & (y - mean <= hi)
    shaped = coverage_bands(test.assign(**shape.columns()), {"split": "random"}).set_index("group")
    assert shaped.loc["all", "coverage"] == pytest.approx(inside.mean())
    assert shaped.loc["metro", "coverage"] == pytest.approx(inside[np.arange(n) % 2 == 1].mean())
    gaussian = coverage_bands(test, {"split": "random"}).set_index("group")  # no columns: a Gaussian run
    assert gaussian.loc["all", "coverage"] == pytest.approx(M.coverage(mean, var_y, y))
    assert gaussian.loc["all", "coverage"] != shaped.loc["all", "coverage"]
