"""Runs are never faked or half-written (issue 12, items 6, 7, 8, 13): NaN models are refused, writes are
atomic, ``--out`` is not silently mixed, run ids never collide, malformed run.json files are skipped by name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gpcore.cli import main
from gpcore.errors import RunError, TrainingError
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import execute_run
from gpcore.run.rundir import read_manifest, validate_manifest
from gpcore.run.store import RunStore
from tests.sample_files import write_speeds_csv

TINY = {"epochs": 2, "rank": 8, "hidden": 8, "batch_size": 256}
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def csv_file(tmp_path_factory):
    return write_speeds_csv(tmp_path_factory.mktemp("runs") / "speeds.csv", n=400, seed=3)


def cfg_for(csv_file, **settings) -> RunConfig:
    return RunConfig(data=str(csv_file), y="download_mbps", x=("lon", "lat"), transform="log10", model="dbk",
                     settings={**TINY, **settings}, grid_kind="square", grid_cell_km=25.0)


@pytest.fixture(scope="module")
def good_run(csv_file, tmp_path_factory):
    return execute_run(cfg_for(csv_file), tmp_path_factory.mktemp("good") / "run")


# ----------------------------------------------------------------------------- NaN models (item 6)


@pytest.mark.parametrize("lr", [1e6, float("inf")])
def test_a_diverged_fit_writes_no_run(csv_file, tmp_path, lr):
    out = tmp_path / "nan-run"
    if lr == float("inf"):
        from gpcore.errors import ConfigError

        with pytest.raises(ConfigError, match="finite"):
            execute_run(cfg_for(csv_file, lr=lr), out)
    else:
        with pytest.raises(TrainingError, match="no run was written|lower the learning rate"):
            execute_run(cfg_for(csv_file, lr=lr), out)
    assert not out.exists(), "nothing is written for a model that never was finite"
    assert not list(tmp_path.glob(".tmp-*")), "no temporary leftovers"


def test_the_cli_refuses_nan_models_with_exit_2(csv_file, tmp_path, capsys):
    for lr in ("1e6", "inf", "nan"):
        out = tmp_path / f"cli-{lr}"
        rc = main(["fit", "--data", str(csv_file), "--x", "lon,lat", "--y", "download_mbps", "--model", "dbk",
                   "--grid", "none", "--out", str(out), *sum((["--set", f"{k}={v}"] for k, v in TINY.items()), []),
                   "--set", f"lr={lr}"])
        err = capsys.readouterr().err
        assert rc == 2, (lr, err)
        assert err.strip().splitlines()[-1].startswith("error: "), err
        assert "Traceback" not in err
        assert not out.exists()


def test_a_model_with_nan_parameters_is_never_saved(csv_file, tmp_path, monkeypatch):
    """The last line of defence: whatever training reported, NaN parameters or predictions write no run."""
    import torch

    from gpcore.models import GPModel

    real_fit = GPModel.fit

    def fit_then_break(self, *a, **k):
        real_fit(self, *a, **k)
        with torch.no_grad():
            next(self.module_.parameters()).fill_(float("nan"))
        return self

    monkeypatch.setattr(GPModel, "fit", fit_then_break)
    out = tmp_path / "poisoned"
    with pytest.raises(TrainingError, match="finite model"):
        execute_run(cfg_for(csv_file), out)
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


def test_history_and_manifest_are_strict_json(good_run):
    for name in ("history.json", "run.json"):
        text = (good_run / name).read_text()
        json.loads(text, parse_constant=lambda c, name=name: pytest.fail(f"{name} holds bare {c}"))


def test_nan_validation_never_counts_as_improved(monkeypatch):
    """The first epoch's NaN validation NLL used to count as 'improved' (best_state None) and be restored."""
    from gpcore import make_model
    from gpcore.models import training as T

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (120, 2))
    y = np.sin(3 * X[:, 0])
    monkeypatch.setattr(T, "validation_metrics", lambda *a, **k: (float("nan"), float("nan")))
    model = make_model("dbk", rank=8, hidden=8, epochs=3, batch_size=64, seed=0)
    with pytest.raises(TrainingError, match="no finite model"):
        model.fit(X[:80], y[:80], X[80:], y[80:])
    calls = iter([(float("nan"), 1.0), (1.0, 1.0), (2.0, 1.0)])  # NaN first, then finite: epoch 2 is the best
    monkeypatch.setattr(T, "validation_metrics", lambda *a, **k: next(calls))
    model = make_model("dbk", rank=8, hidden=8, epochs=3, batch_size=64, seed=0, patience=5)
    model.fit(X[:80], y[:80], X[80:], y[80:])
    assert model.train_info_["best_epoch"] == 2
    assert [h["improved"] for h in model.history_] == [False, True, False]


# ----------------------------------------------------------------------------- atomic writes (item 6)


def test_a_crash_while_writing_leaves_no_half_run(csv_file, tmp_path, monkeypatch):
    from gpcore.models import GPModel

    def boom(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(GPModel, "save", boom)
    out = tmp_path / "half"
    with pytest.raises(OSError):
        execute_run(cfg_for(csv_file), out)
    assert not out.exists()
    assert not list(tmp_path.glob(".tmp-*"))


def test_leftovers_of_killed_writers_are_cleaned(tmp_path):
    store = RunStore(tmp_path, include_bundled=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".tmp-20240101-000000-000-dbk-{dead.pid}-0123abcd"
    live = tmp_path / f".tmp-20240101-000000-000-dbk-{os.getpid()}-0123abcd"
    for p in (stale, live):
        (p / "model").mkdir(parents=True)
        (p / "grid.parquet").write_bytes(b"half")
    empty_old = tmp_path / "20200101-000000-000-dbk"
    empty_old.mkdir()
    os.utime(empty_old, (time.time() - 7200, time.time() - 7200))
    empty_new = store.new_run_dir("20990101-000000-000-dbk")
    removed = store.clean_leftovers()
    assert stale.name in removed and not stale.exists()
    assert live.exists(), "a run another live process is writing is kept"
    assert empty_old.name in removed and empty_new.exists(), "only old empty reservations go"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_kill_9_during_training_loses_only_that_run(csv_file, tmp_path, good_run):
    store = tmp_path / "store"
    store.mkdir()
    shutil.copytree(good_run, store / "kept-run")
    out = store / "killed-run"
    code = (f"from gpcore.cli import main; main(['fit', '--data', {str(csv_file)!r}, '--x', 'lon,lat', '--y', "
            f"'download_mbps', '--model', 'dbk', '--grid', 'none', '--set', 'epochs=100000', '--set', 'rank=8', "
            f"'--set', 'hidden=8', '--set', 'patience=100000', '--out', {str(out)!r}])")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    seen = ""
    while time.time() < deadline and "epoch 2/" not in seen:
        seen += proc.stderr.readline()
    assert "epoch 2/" in seen, seen
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert not out.exists()
    runs = RunStore(store, include_bundled=False).list()
    assert [r.run_id for r in runs] == ["kept-run"], "the store is consistent and the other run intact"


# ----------------------------------------------------------------------------- --out (item 8)


def test_refit_into_a_run_needs_overwrite_which_replaces_the_whole_folder(csv_file, tmp_path, good_run, capsys):
    out = tmp_path / "again"
    shutil.copytree(good_run, out)
    (out / "stale.txt").write_text("from the old run")
    args = ["fit", "--data", str(csv_file), "--x", "lon,lat", "--y", "download_mbps", "--model", "dbk",
            "--grid", "none", "--out", str(out), *sum((["--set", f"{k}={v}"] for k, v in TINY.items()), [])]
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "grid.parquet").is_file(), "refused: nothing changed"
    assert main([*args, "--overwrite"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "grid.parquet" not in names and "stale.txt" not in names, "the old grid is gone with the old run"
    assert read_manifest(out)["config"]["grid_kind"] == "none"


def test_overwrite_never_replaces_a_folder_that_is_not_a_run(csv_file, tmp_path, capsys):
    out = tmp_path / "home"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    rc = main(["fit", "--data", str(csv_file), "--x", "lon,lat", "--y", "download_mbps", "--model", "dbk",
               "--grid", "none", "--out", str(out), "--overwrite", "--set", "epochs=1"])
    assert rc == 2 and "not a run folder" in capsys.readouterr().err
    assert (out / "thesis.tex").read_text() == "precious"


# ----------------------------------------------------------------------------- run ids (item 13)


def test_concurrent_run_ids_are_distinct(tmp_path):
    from gpcore.run.pipeline import new_run_id

    store = RunStore(tmp_path, include_bundled=False)
    cfg = RunConfig(data="sample:puerto_rico", y="download_mbps", model="dbk")
    barrier = threading.Barrier(8)
    got: list[Path] = []

    def click():
        barrier.wait()
        got.append(store.new_run_dir(new_run_id(cfg)))

    threads = [threading.Thread(target=click) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({p.name for p in got}) == 8 and all(p.is_dir() for p in got)


# ----------------------------------------------------------------------------- schema (item 7)

BAD_MANIFESTS = {
    "list": [],
    "null": None,
    "created-number": {"created": 5},
    "metrics-text": {"metrics": "oops"},
    "metric-text-value": {"metrics": [{"group": "all", "nll": "low"}]},
    "config-list": {"config": []},
    "config-unknown-model": {"config": {"model": "no-such-model"}},
    "config-unknown-key": {"config": {"evil": 1}},
    "data-text": {"data": "x"},
    "grid-list": {"grid": [1]},
    "noise-text": {"noise_variance": "big"},
    "format": {"format": "other"},
}


def _mutate(manifest: dict, change) -> object:
    if not isinstance(change, dict):
        return change
    out = json.loads(json.dumps(manifest))
    for k, v in change.items():
        if k == "config" and isinstance(v, dict):
            out["config"] = {**out["config"], **v}
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_malformed_manifests_are_rejected_by_name(good_run, case):
    manifest = read_manifest(good_run)
    with pytest.raises(RunError):
        validate_manifest(_mutate(manifest, BAD_MANIFESTS[case]), "run.json")


def test_the_store_skips_malformed_runs_and_symlinks_and_names_them(good_run, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    shutil.copytree(good_run, store / "fine")
    manifest = read_manifest(good_run)
    for case, change in BAD_MANIFESTS.items():
        shutil.copytree(good_run, store / case)
        (store / case / "run.json").write_text(json.dumps(_mutate(manifest, change)))
    (store / "not-json").mkdir()
    (store / "not-json" / "run.json").write_text("{")
    outside = tmp_path / "outside-run"
    shutil.copytree(good_run, outside)
    (store / "linked").symlink_to(outside, target_is_directory=True)
    (store / "json-link").mkdir()
    (store / "json-link" / "run.json").symlink_to(outside / "run.json")
    rs = RunStore(store, include_bundled=False)
    assert [r.run_id for r in rs.list()] == ["fine"]
    skipped = dict(rs.invalid())
    assert set(skipped) == set(BAD_MANIFESTS) | {"not-json"}
    assert all(name in reason or "run.json" in reason for name, reason in skipped.items())
