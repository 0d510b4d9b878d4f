"""Every failure a user can cause ends in one ``error:`` line and exit status 2, never a traceback
(issue 12, items 11 and 12): bad settings, bad data, crafted or damaged run directories."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from gpcore.cli import main
from gpcore.data import synthetic

TINY = ["--model", "dbk", "--set", "epochs=2", "--set", "rank=8", "--set", "hidden=8", "--set", "batch_size=256"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-errors")
    df = synthetic.synthetic_ookla(n=300, seed=5)
    df["download_mbps"] = df["avg_d_kbps"] / 1000
    df = df.drop(columns=["quadkey"])
    df.to_csv(d / "speeds.csv", index=False)
    huge = df[["lon", "lat"]].copy()
    huge["download_mbps"] = np.where(np.arange(len(df)) % 2 == 0, 1.7e308, -1.7e308)
    huge.to_csv(d / "huge_y.csv", index=False)
    lines = ["lon,lat,download_mbps"] + [f"{a},{b},{str(round(c, 2)).replace('.', ',')}" for a, b, c in
                                         zip(df.lon, df.lat, df.download_mbps + 0.5, strict=True)]
    (d / "comma.csv").write_text("\n".join(lines) + "\n")
    feats = [{"type": "Feature", "properties": {"download_mbps": float(m)},
              "geometry": {"type": "Point", "coordinates": [float(a), float(b)]}}
             for a, b, m in zip(df.lon, df.lat, df.download_mbps, strict=True)]
    (d / "mercator.geojson").write_text(json.dumps({
        "type": "FeatureCollection", "crs": {"type": "name", "properties": {"name": "urn:ogc:def:crs:EPSG::3857"}},
        "features": feats}))
    run = d / "run"
    assert main(["fit", "--data", str(d / "speeds.csv"), "--x", "lon,lat", "--y", "download_mbps", "--grid", "none",
                 "--out", str(run), *TINY]) == 0
    return d


def _expect_user_error(capsys, argv, needle: str | None = None) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: "), err
    if needle:
        assert needle in last, last
    return last


FIT_CASES = {
    "lr-nan": (["--set", "lr=nan"], "finite"),
    "lr-inf": (["--set", "lr=inf"], "finite"),
    "lr-1e6": (["--set", "lr=1e6"], "learning rate"),
    "seed-negative": (["--seed", "-1"], "seed=-1"),
    "dtype": (["--set", "dtype=float16"], "dtype"),
    "epochs-zero": (["--set", "epochs=0"], "epochs"),
    "block-km": (["--split", "block", "--block-km", "-1"], "block_km"),
    "cell-km-nan": (["--cell-km", "nan"], "grid_cell_km"),
    "unknown-model": (["--model", "no-such"], "unknown model"),
}


@pytest.mark.parametrize("case", sorted(FIT_CASES))
def test_fit_settings_errors(files, tmp_path, capsys, case):
    extra, needle = FIT_CASES[case]
    out = tmp_path / "out"
    _expect_user_error(capsys, ["fit", "--data", str(files / "speeds.csv"), "--x", "lon,lat", "--y", "download_mbps",
                                "--grid", "none", "--out", str(out), *TINY, *extra], needle)
    assert not out.exists()


def test_cuda_without_a_gpu(files, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    _expect_user_error(capsys, ["fit", "--data", str(files / "speeds.csv"), "--x", "lon,lat", "--y", "download_mbps",
                                "--grid", "none", "--out", str(tmp_path / "o"), *TINY, "--set", "device=cuda"],
                       "no CUDA GPU")


def test_an_unknown_neighbour_search_in_the_environment(files, tmp_path, capsys, monkeypatch):
    from gpcore.models import neighbors

    monkeypatch.setattr(neighbors, "SEARCH", "gpu")  # as UA_NEIGHBOR_SEARCH=gpu sets it at import
    _expect_user_error(capsys, ["fit", "--data", str(files / "speeds.csv"), "--x", "lon,lat", "--y", "download_mbps",
                                "--grid", "none", "--out", str(tmp_path / "o"), "--model", "vecchia", "--set",
                                "epochs=2"], "UA_NEIGHBOR_SEARCH='gpu'")


@pytest.mark.parametrize("name,needle", [("huge_y.csv", "not finite"), ("comma.csv", "decimal comma"),
                                         ("mercator.geojson", "EPSG:4326"), ("missing.csv", "not found")])
def test_fit_data_errors(files, tmp_path, capsys, name, needle):
    x = ["--x", "lon,lat"] if name.endswith(".csv") else []
    _expect_user_error(capsys, ["fit", "--data", str(files / name), *x, "--y", "download_mbps", "--grid", "none",
                                "--out", str(tmp_path / "o"), *TINY], needle)


def _crafted(files, tmp_path, change) -> str:
    run = tmp_path / "crafted"
    shutil.copytree(files / "run", run)
    change(run)
    return str(run)


def _edit_json(path, fn):
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def _nan_tensors(run):
    f = run / "model" / "model.safetensors"
    t = load_file(str(f))
    save_file({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in t.items()}, str(f))


RUN_CASES = {
    "run-json-broken": lambda r: (r / "run.json").write_text("{"),
    "run-json-list": lambda r: (r / "run.json").write_text("[]"),
    "run-json-null": lambda r: (r / "run.json").write_text("null"),
    "run-json-created-5": lambda r: _edit_json(r / "run.json", lambda m: {**m, "created": 5}),
    "run-json-metrics-oops": lambda r: _edit_json(r / "run.json", lambda m: {**m, "metrics": "oops"}),
    "run-json-model-unknown": lambda r: _edit_json(r / "run.json", lambda m: {**m, "config": {**m["config"],
                                                                                              "model": "x"}}),
    "no-run-json": lambda r: (r / "run.json").unlink(),
    "model-json-broken": lambda r: (r / "model" / "model.json").write_text("{"),
    "model-json-d-huge": lambda r: _edit_json(r / "model" / "model.json", lambda m: {**m, "d": 100000000}),
    "model-json-x-lo-short": lambda r: _edit_json(r / "model" / "model.json", lambda m: {**m, "x_lo": [0.0]}),
    "model-json-y-std-inf": lambda r: (r / "model" / "model.json").write_text(
        (r / "model" / "model.json").read_text().replace('"y_std": ', '"y_std": 1e999, "_old": ')),
    "model-json-rank-huge": lambda r: _edit_json(r / "model" / "model.json", lambda m: {
        **m, "config": {**m["config"], "rank": 8192, "hidden": 4096}}),
    "safetensors-garbage": lambda r: (r / "model" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00garbage!"),
    "safetensors-missing": lambda r: (r / "model" / "model.safetensors").unlink(),
    "safetensors-nan": _nan_tensors,
    "model-dir-missing": lambda r: shutil.rmtree(r / "model"),
}


@pytest.mark.parametrize("case", sorted(RUN_CASES))
@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_crafted_runs(files, tmp_path, capsys, case, command):
    run = _crafted(files, tmp_path, RUN_CASES[case])
    argv = [command, run, "--data", str(files / "speeds.csv")]
    if command == "predict":
        argv += ["--out", str(tmp_path / "p.parquet")]
    _expect_user_error(capsys, argv)
    assert not (tmp_path / "p.parquet").exists()


def test_a_bug_exits_3_and_debug_shows_its_traceback(files, tmp_path, capsys, monkeypatch):
    import gpcore.cli as cli

    def bug(args):
        raise KeyError("a programming error")

    monkeypatch.setattr(cli, "cmd_models", bug)  # build_parser reads it when main() runs
    assert cli.main(["models"]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "Traceback" not in err
    assert cli.main(["--debug", "models"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_the_crafted_model_json_is_refused_before_allocating(files, tmp_path):
    """d = 1e8 used to allocate tens of GB; now it is refused while reading model.json."""
    import tracemalloc

    from gpcore.errors import InputError
    from gpcore.models import load_model

    run = _crafted(files, tmp_path, RUN_CASES["model-json-d-huge"])
    tracemalloc.start()
    with pytest.raises(InputError, match="'d'"):
        load_model(f"{run}/model")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 1024**2
    run2 = _crafted(files, tmp_path / "b", RUN_CASES["model-json-rank-huge"])
    with pytest.raises(InputError, match="implies"):
        load_model(f"{run2}/model")
