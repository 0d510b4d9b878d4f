"""Streamed prediction (``python -m gpcore predict RUN --grid/--grid-region ...``): bounded memory,
right row counts and values, GeoTIFF windows, Parquet row-group input, sharding under torchrun."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpcore import make_model
from gpcore.cli import TextProgress
from gpcore.data.grid import ParquetGrid, RegularGrid, region_grid
from gpcore.data.parquet_stream import ParquetSource, RowGroupDataset, shard_row_groups, write_parquet_in_row_groups
from gpcore.run.predict import stream_predict

REPO = Path(__file__).resolve().parents[3]
BBOX = (-95.0, -90.0, 36.5, 40.5)  # (W, E, S, N), Missouri-ish


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A minimal run directory (model/ + run.json) of a small float32 DBK on log10 targets."""
    from gpcore.run.config import RunConfig

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(BBOX[0], BBOX[1], 2000), rng.uniform(BBOX[2], BBOX[3], 2000)])
    y = 1.5 + 0.3 * np.sin(X[:, 0]) + 0.1 * rng.normal(size=2000)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = make_model("dbk", rank=16, hidden=8, epochs=2, batch_size=500, seed=0, device="cpu").fit(X, y)
    finally:
        torch.set_num_threads(threads)
    d = tmp_path_factory.mktemp("run")
    model.save(d / "model")
    cfg = RunConfig(data="synthetic.csv", y="download_mbps", model="dbk", transform="log10")
    (d / "run.json").write_text(json.dumps({"format": "gpcore-run", "config": cfg.to_dict()}))
    return d


def _predict_main(run_dir, *args) -> int:
    """``python -m gpcore predict RUN_DIR ARGS`` in this process (exit status)."""
    from gpcore.cli import main

    return main(["predict", str(run_dir), *args])


def _predict_cli(run_dir, *args, torchrun: int = 0, timeout: int = 300):
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}",
               "-m", "gpcore", "predict", str(run_dir), *args]
    else:
        cmd = [sys.executable, "-m", "gpcore", "predict", str(run_dir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, cwd=REPO)


def test_million_cells_stay_under_2gb(run_dir, tmp_path):
    """1.2 million generated cells in a child process: peak RSS < 2 GB, every cell written once."""
    out = tmp_path / "pred.parquet"
    cells = 1_200_000
    cmd = [sys.executable, "-m", "gpcore", "predict", str(run_dir), "--grid-region", "bbox:" + ",".join(map(str, BBOX)),
           "--cells", str(cells), "--batch-size", "65536", "--out", str(out)]
    wrapper = (
        "import resource, subprocess, sys\n"
        f"r = subprocess.run({cmd!r}, capture_output=True, text=True)\n"
        "sys.stderr.write(r.stderr[-3000:]); sys.stdout.write(r.stdout)\n"
        "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(r.returncode)\n"
    )
    res = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stderr
    rss_mb = int(res.stdout.split("MAXRSS_KB")[1].split()[0]) / 1024  # Linux: kilobytes
    assert rss_mb < 2048, f"peak RSS {rss_mb:.0f} MB"
    assert "%" in res.stderr and "cells" in res.stderr  # the progress bar
    f = pq.ParquetFile(out)
    grid = region_grid("bbox:" + ",".join(map(str, BBOX)), cells=cells)
    assert f.metadata.num_rows == grid.n_cells
    assert abs(grid.n_cells - cells) / cells < 0.01
    assert f.metadata.num_row_groups == grid.n_chunks(65536) > 1
    ids = f.read(columns=["cell_id"]).column("cell_id").to_numpy()
    assert np.array_equal(ids, np.arange(grid.n_cells))


def test_streamed_values_match_model_predict(run_dir, tmp_path):
    from gpcore.run.store import load_run

    _, model = load_run(run_dir)
    grid = RegularGrid.from_bounds(BBOX, cells=5000)
    out = tmp_path / "p.parquet"
    res = stream_predict(model, grid, out, "log10", batch_size=700, progress=False)
    t = pq.read_table(out).to_pandas()
    assert res.rows_written == len(t) == grid.n_cells
    X = t[["lon", "lat"]].to_numpy()
    pred = model.predict(X)
    np.testing.assert_allclose(t["mean_t"], pred.mean, rtol=1e-6)
    np.testing.assert_allclose(t["sd_t"], pred.sd, rtol=1e-6)
    np.testing.assert_allclose(t["mean"], 10 ** pred.mean, rtol=1e-6)
    assert (t["lower"] < t["mean"]).all() and (t["mean"] < t["upper"]).all()
    # cell centres: row-major from the north-west corner
    assert t["lon"].iloc[0] == pytest.approx(BBOX[0] + 0.5 * grid.dx)
    assert t["lat"].iloc[0] == pytest.approx(BBOX[3] - 0.5 * grid.dy)


def test_geotiff_windows(run_dir, tmp_path):
    import rasterio

    out = tmp_path / "p.tif"
    region = "bbox:" + ",".join(map(str, BBOX))
    assert _predict_main(run_dir, "--grid-region", region, "--cell-km", "20", "--batch-size", "500",
                         "--out", str(out), "--no-progress") == 0
    pq_out = tmp_path / "p.parquet"
    assert _predict_main(run_dir, "--grid-region", region, "--cell-km", "20", "--out", str(pq_out),
                         "--no-progress") == 0
    t = pq.read_table(pq_out).to_pandas()
    with rasterio.open(out) as src:
        assert src.count == 5 and src.crs.to_epsg() == 4326
        assert src.descriptions == ("mean", "sd", "lower", "upper", "width")
        mean = src.read(1)
        assert mean.shape[0] * mean.shape[1] == len(t)
        np.testing.assert_allclose(mean.ravel(), t["mean"].to_numpy(), rtol=1e-5)
        # the centre of a pixel maps back to the cell's coordinates
        row, col = src.index(t["lon"].iloc[17], t["lat"].iloc[17])
        assert row * src.width + col == 17


def test_parquet_grid_input_by_row_groups(run_dir, tmp_path):
    rng = np.random.default_rng(1)
    n = 30_000
    cells = {"cell_id": np.arange(n, dtype=np.int64) * 7, "lon": rng.uniform(-95, -90, n),
             "lat": rng.uniform(36.5, 40.5, n)}
    grid_file = write_parquet_in_row_groups(tmp_path / "grid.parquet", cells, row_group_size=4000)
    src = ParquetSource(grid_file, ["lon", "lat"])
    assert src.num_row_groups == 8 and src.num_rows == n
    out = tmp_path / "p.csv"
    assert _predict_main(run_dir, "--grid", str(grid_file), "--batch-size", "5000", "--out", str(out),
                         "--no-progress") == 0
    import pandas as pd

    t = pd.read_csv(out)
    assert len(t) == n and np.array_equal(t["cell_id"], cells["cell_id"])
    np.testing.assert_allclose(t["lon"], cells["lon"])


def test_state_mask_drops_cells_outside(run_dir, tmp_path):
    pytest.importorskip("gpcore.data.regions")
    from gpcore.run.store import load_run

    _, model = load_run(run_dir)
    grid = region_grid("state:MO", cell_km=25)
    out = tmp_path / "mo.parquet"
    res = stream_predict(model, grid, out, "log10", batch_size=2000, progress=False)
    assert 0 < res.rows_written < grid.n_cells
    import shapely

    from gpcore.data.regions import state_boundary

    t = pq.read_table(out).to_pandas()
    assert shapely.contains_xy(state_boundary("MO"), t["lon"], t["lat"]).all()


@pytest.mark.skipif(shutil.which("torchrun") is None and not sys.executable, reason="torchrun missing")
def test_torchrun_sharded_prediction_equals_single(run_dir, tmp_path):
    region = "bbox:" + ",".join(map(str, BBOX))
    single, dist = tmp_path / "single.parquet", tmp_path / "dist.parquet"
    r = _predict_cli(run_dir, "--grid-region", region, "--cells", "40000", "--batch-size", "3000",
                     "--out", str(single), "--no-progress")
    assert r.returncode == 0, r.stderr
    r = _predict_cli(run_dir, "--grid-region", region, "--cells", "40000", "--batch-size", "3000",
                     "--out", str(dist), "--no-progress", torchrun=2)
    assert r.returncode == 0, r.stderr
    a, b = pq.read_table(single).to_pandas(), pq.read_table(dist).to_pandas()
    assert len(a) == len(b)
    np.testing.assert_array_equal(a["cell_id"], b["cell_id"])
    np.testing.assert_allclose(a["mean"], b["mean"], rtol=1e-6)
    assert not (tmp_path / "dist.parquet.parts").exists()


def test_region_and_output_errors(run_dir, tmp_path, capsys):
    from gpcore.errors import ConfigError

    with pytest.raises(ConfigError, match="bbox"):
        region_grid("box:1,2,3,4", cells=10)
    with pytest.raises(ConfigError, match="exactly one"):
        RegularGrid.from_bounds(BBOX)
    assert _predict_main(run_dir, "--grid-region", "bbox:-95,-90,36.5,40.5", "--cells", "100",
                         "--out", str(tmp_path / "x.xyz")) == 2
    assert "output format" in capsys.readouterr().err
    grid_file = write_parquet_in_row_groups(tmp_path / "g.parquet", {"lon": np.zeros(3), "lat": np.zeros(3)})
    assert _predict_main(run_dir, "--grid", str(grid_file), "--out", str(tmp_path / "x.tif")) == 2
    assert "GeoTIFF" in capsys.readouterr().err
    assert _predict_main(run_dir, "--out", str(tmp_path / "x.parquet")) == 2
    assert "--grid" in capsys.readouterr().err


def test_shard_row_groups_cover_every_row_once():
    sizes = [5, 5, 5, 100, 3, 3, 50, 1]
    for world in (1, 2, 3, 5):
        got = [shard_row_groups(sizes, r, world) for r in range(world)]
        flat = sorted(i for g in got for i in g)
        assert flat == list(range(len(sizes)))
        for g in got:
            assert g == sorted(g) and (not g or g == list(range(g[0], g[-1] + 1)))  # contiguous


def test_row_group_dataset_with_distributed_sampler(tmp_path):
    from torch.utils.data import DistributedSampler

    path = write_parquet_in_row_groups(tmp_path / "d.parquet", {"v": np.arange(100.0)}, row_group_size=10)
    ds = RowGroupDataset(path, ["v"])
    assert len(ds) == 10
    seen = []
    for r in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0)
        seen += [int(ds[i]["v"][0]) for i in sampler]
    assert sorted(seen) == list(range(0, 100, 10))
    src = ParquetSource(path)
    assert src.row_group_sizes == [10] * 10
    mine = shard_row_groups(src.row_group_sizes, 1, 2)
    assert mine == [5, 6, 7, 8, 9]
    got = np.concatenate([b["v"] for b in src.iter_batches(7, row_groups=mine)])
    assert np.array_equal(got, np.arange(50.0, 100.0))


def test_text_progress_when_not_a_terminal():
    buf = io.StringIO()
    bar = TextProgress(1000, stream=buf)
    for _ in range(100):
        bar.update(10)
    bar.close()
    lines = buf.getvalue().strip().splitlines()
    assert 2 <= len(lines) <= 11 and "100.0%" in lines[-1]


def test_parquet_grid_detects_columns(run_dir, tmp_path, capsys):
    from gpcore.errors import DataError

    p = write_parquet_in_row_groups(tmp_path / "g.parquet", {"longitude": np.ones(4), "latitude": np.ones(4)})
    g = ParquetGrid(p)
    assert g.x_cols == ("longitude", "latitude") and g.n_cells == 4
    p2 = write_parquet_in_row_groups(tmp_path / "h.parquet", {"a": np.ones(4), "b": np.ones(4)})
    with pytest.raises(DataError, match="x_cols"):  # the library names its keyword, never a CLI flag
        ParquetGrid(p2)
    assert _predict_main(run_dir, "--grid", str(p2), "--out", str(tmp_path / "o.parquet"), "--no-progress") == 2
    assert "--x" in capsys.readouterr().err  # the CLI names its flag


def test_rank_cells_counts_what_each_rank_streams():
    """The progress bar's total on rank 0 is the cells rank 0 really predicts (it was ceil(total / world), so a
    bar could pass 100 %): checked against the chunks a grid hands each rank."""
    from gpcore.data.grid import region_grid
    from gpcore.run.predict import rank_cells

    grid = region_grid("bbox:-67.3,-65.6,17.9,18.5", cells=1000)
    for batch, world in ((64, 2), (100, 3), (5000, 2), (7, 4)):
        counts = [sum(len(c.cell_id) for c in grid.chunks(batch, r, world)) for r in range(world)]
        assert counts == [grid.rank_cells(batch, r, world) for r in range(world)]
        assert sum(counts) == grid.n_cells
    # a source of fixed-size batches (Parquet row batches)
    assert [rank_cells(10, 3, r, 2) for r in range(2)] == [6, 4] and rank_cells(10, 3, 0, 1) == 10
