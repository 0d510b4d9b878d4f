"""`python -m gpcore fit / predict / evaluate / compare / models`: end to end on small files."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from gpcore.cli import main
from tests.sample_files import write_speeds_csv

FAST = ["--set", "epochs=2", "--set", "rank=8", "--set", "hidden=8", "--set", "batch_size=256"]


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    return write_speeds_csv(tmp_path_factory.mktemp("cli") / "speeds.csv", n=600, seed=3)


@pytest.fixture(scope="module")
def run_dir(csv_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    rc = main(["fit", "--data", str(csv_file), "--x", "lon,lat", "--y", "download_mbps", "--transform", "log10",
               "--model", "dbk", "--strata", "column:county_metro", "--grid", "square", "--cell-km", "20",
               "--out", str(out), *FAST])
    assert rc == 0
    return out


def test_fit_writes_a_complete_run(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    assert {"run.json", "model", "metrics.csv", "test_predictions.parquet", "grid.parquet", "grid_cells.parquet",
            "history.json"} <= names
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["config"]["model"] == "dbk" and manifest["config"]["transform"] == "log10"
    assert manifest["data"]["n_train"] + manifest["data"]["n_val"] + manifest["data"]["n_test"] == 600
    assert len(manifest["data"]["hash"]) == 16 and "torch" in manifest["versions"]
    groups = {m["group"] for m in manifest["metrics"]}
    assert "all" in groups and len(groups) >= 3
    assert manifest["model_config"]["epochs"] == 2 and manifest["model_config"]["rank"] == 8
    grid = pd.read_parquet(run_dir / "grid.parquet")
    assert {"cell_id", "lon", "lat", "mean", "lower", "upper", "width", "mean_t", "sd_t"} <= set(grid.columns)
    assert (grid["lower"] <= grid["mean"]).all() and (grid["mean"] <= grid["upper"]).all()
    assert (grid["mean"] > 0).all()  # back-transformed from log10 to Mbps


def test_predict_and_evaluate(run_dir, csv_file, tmp_path, capsys):
    out = tmp_path / "pred.parquet"
    assert main(["predict", str(run_dir), "--data", str(csv_file), "--out", str(out)]) == 0
    pred = pd.read_parquet(out)
    assert len(pred) == 600 and pred["sd_t"].gt(0).all()
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--data", str(csv_file)]) == 0
    text = capsys.readouterr().out
    assert "coverage" in text and "all" in text


def test_compare_writes_ranked_tables(csv_file, tmp_path):
    out = tmp_path / "cmp"
    rc = main(["compare", "--data", str(csv_file), "--y", "download_mbps", "--transform", "log10",
               "--models", "dbk-silu,dbk-rbf", "--strata", "column:county_metro", "--grid", "none",
               "--out", str(out), *FAST])
    assert rc == 0
    table = pd.read_csv(out / "metrics.csv")
    assert set(table["model"]) == {"dbk-silu", "dbk-rbf"}
    assert set(table["split"]) == {"random", "block"}, "compare evaluates both splits by default"
    for split in ("random", "block"):  # ranked within each split (tests/gpcore/test_compare.py has the rest)
        overall = table[(table.group == "all") & (table.split == split)].sort_values("rank")
        assert overall["nll"].is_monotonic_increasing and list(overall["rank"]) == [1, 2]
    assert {"mae", "rmse", "nll", "crps", "coverage", "pi_width_mean", "pi_width_median", "fit_seconds",
            "predict_seconds"} <= set(table.columns)
    assert (out / "metrics.md").read_text().startswith("# Model comparison")
    assert json.loads((out / "metrics.json").read_text())["metrics"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["fit", "--data", "nope.csv", "--y", "v", "--out", "x"], "nope.csv"),
        (["fit", "--data", "{csv}", "--y", "no_such_column", "--out", "{tmp}/r"], "no_such_column"),
        (["fit", "--data", "{csv}", "--y", "download_mbps", "--model", "nope", "--out", "{tmp}/r"], "unknown model"),
        (["fit", "--data", "{csv}", "--y", "download_mbps", "--set", "rank=-3", "--out", "{tmp}/r"], "rank"),
        (["fit", "--data", "{csv}", "--y", "download_mbps", "--set", "colour=red", "--out", "{tmp}/r"],
         "unknown setting"),
        (["predict", "{tmp}", "--data", "{csv}", "--out", "{tmp}/p.parquet"], "not a run directory"),
    ],
)
def test_errors_exit_nonzero_with_a_message(args, message, csv_file, tmp_path, capsys):
    args = [a.format(csv=csv_file, tmp=tmp_path) for a in args]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_module_entry_point_exit_code(tmp_path):
    bad = tmp_path / "empty.csv"
    bad.write_text("")
    proc = subprocess.run([sys.executable, "-m", "gpcore", "fit", "--data", str(bad), "--y", "v", "--out",
                           str(tmp_path / "r")], capture_output=True, text=True)
    assert proc.returncode == 2 and "empty.csv" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "gpcore", "models"], capture_output=True, text=True)
    assert proc.returncode == 0 and "dbk-rbf" in proc.stdout


def test_fit_without_a_model_trains_the_default_one(csv_file, tmp_path, capsys):
    """``fit`` with no ``--model`` trains DEFAULT_MODEL (the race's winner), the one ``models`` marks."""
    from gpcore.models import DEFAULT_MODEL

    assert main(["models"]) == 0
    marked = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.endswith("(default)")]
    assert marked == [DEFAULT_MODEL]
    out = tmp_path / "run"
    tiny = ["dbk_epochs=2", "epochs=2", "dbk_rank=8", "dbk_hidden=8", "neighbors=8"]
    assert main(["fit", "--data", str(csv_file), "--x", "lon,lat", "--y", "download_mbps", "--grid", "none",
                 "--out", str(out), *[a for kv in tiny for a in ("--set", kv)]]) == 0
    assert json.loads((out / "run.json").read_text())["config"]["model"] == DEFAULT_MODEL


def test_predict_and_evaluate_take_bundled_samples(run_dir, tmp_path, capsys):
    """`--data sample:<key>` works for predict and evaluate as it does for fit (it used to be read as a path)."""
    out = tmp_path / "pred.parquet"
    assert main(["predict", str(run_dir), "--data", "sample:synthetic", "--out", str(out)]) == 0
    assert len(pd.read_parquet(out)) > 0
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--data", "sample:synthetic"]) == 0
    assert "coverage" in capsys.readouterr().out
    assert main(["predict", str(run_dir), "--data", "sample:nope", "--out", str(out)]) == 2
    assert "no sample data set 'nope'" in capsys.readouterr().err
