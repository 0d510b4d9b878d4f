"""GPU benchmark: seconds per epoch of DBK-dPPGP and GPyTorch SVGP, and prediction throughput.

The paper's Georgia setting (DBK main paper, 2.11): n = 517,139 synthetic 2-D points, backbone width
h = 256, r = 1024 basis functions, batch 1024; GPyTorch SVGP with m = 1024 inducing points in the same
run. Target on one H100: one DBK epoch <= 1 s.

    python benchmarks/bench_gpu.py                  # paper setting on a GPU (reduced setting on CPU)
    python benchmarks/bench_gpu.py --smoke          # seconds, tiny, any machine (CI)
    python benchmarks/bench_gpu.py --profile        # also count host-device syncs per training step (CUDA)
    python benchmarks/bench_gpu.py --backbone-precision bf16 --compile --json out.json
    python benchmarks/bench_gpu.py --vecchia 100000,1000000 --vecchia-only   # vecchia and dbk-nn fit / predict
    python benchmarks/bench_gpu.py --neighbors 100000,1000000 --vecchia-only  # ordering, KD-tree vs grid search

Without a CUDA GPU the script says so in its first line and in the JSON (``"gpu": false``); its
numbers are then CPU numbers of a reduced setting and must not be read as GPU numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _peers import GPyTorchSVGPEpochs  # noqa: E402

from gpcore import make_model  # noqa: E402
from gpcore.device import describe_device  # noqa: E402

GA_BOX = (-85.61, -80.84, 30.36, 35.00)  # (W, E, S, N) of Georgia, degrees

SETTINGS = {
    "paper": dict(n=517_139, hidden=256, rank=1024, batch=1024, inducing=1024, epochs=3, predict=2_000_000),
    "cpu": dict(n=20_000, hidden=64, rank=128, batch=1024, inducing=128, epochs=2, predict=200_000),
    "smoke": dict(n=2_000, hidden=16, rank=32, batch=256, inducing=32, epochs=2, predict=5_000),
}


def synthetic_georgia(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points in Georgia's box with a smooth mean and input-dependent noise (log10-Mbps-like)."""
    rng = np.random.default_rng(seed)
    w, e, s, nn = GA_BOX
    # clustered like population: half uniform, half around a few "cities"
    k = n // 2
    centres = np.array([[-84.39, 33.75], [-81.09, 32.08], [-83.63, 32.84], [-84.99, 32.46], [-82.0, 33.47]])
    c = centres[rng.integers(0, len(centres), n - k)]
    uniform = np.column_stack([rng.uniform(w, e, k), rng.uniform(s, nn, k)])
    pts = np.vstack([uniform, c + 0.25 * rng.normal(size=c.shape)])
    pts[:, 0] = np.clip(pts[:, 0], w, e)
    pts[:, 1] = np.clip(pts[:, 1], s, nn)
    mean = 1.6 + 0.3 * np.sin(2.0 * pts[:, 0]) * np.cos(1.5 * pts[:, 1])
    sd = 0.1 + 0.2 * (np.abs(np.sin(pts[:, 0] + pts[:, 1])))
    return pts, mean + sd * rng.normal(size=n)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_dbk(X, y, cfg: dict, device: torch.device) -> tuple[dict, object]:
    """Seconds per epoch of DBK-dPPGP (gpcore trainer, no validation set)."""
    times: list[float] = []
    last = [time.perf_counter()]

    def cb(p):
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    model = make_model(
        "dbk", basis="silu", objective="dppgp", hidden=cfg["hidden"], rank=cfg["rank"],
        batch_size=cfg["batch"], epochs=cfg["epochs"], lr=1e-3, patience=10**6, device=device.type,
    )
    last[0] = time.perf_counter()
    model.fit(X, y, callback=cb)
    steady = times[1:] if len(times) > 1 else times
    return {
        "model": "DBK-dPPGP (gpcore)",
        "epochs": len(times),
        "steps_per_epoch": math.ceil(len(y) / cfg["batch"]),
        "first_epoch_s": times[0],
        "epoch_s": statistics.median(steady),
        "epoch_times_s": times,
        "final_loss": model.history_[-1]["loss"],
    }, model


def bench_gpytorch_svgp(X, y, cfg: dict, device: torch.device) -> tuple[dict | None, object]:
    """Seconds per epoch of a standard GPyTorch SVGP (m inducing points, ARD RBF, Cholesky q(u))."""
    try:
        import gpytorch  # noqa: F401 (the peer is optional)
    except ImportError:
        return None, None

    Xt = torch.as_tensor((X - X.min(0)) / (X.max(0) - X.min(0)) * 2 - 1, dtype=torch.float32, device=device)
    yt = torch.as_tensor((y - y.mean()) / y.std(), dtype=torch.float32, device=device)
    n, m = Xt.shape[0], cfg["inducing"]
    g = torch.Generator().manual_seed(0)
    Z = Xt[torch.randperm(n, generator=g)[:m].to(device)].clone()

    peer = GPyTorchSVGPEpochs(Xt, yt, Z, cfg["batch"], lr=0.01, generator=g)
    times = [peer.epoch() for _ in range(cfg["epochs"])]
    model, lik = peer.model, peer.lik
    steady = times[1:] if len(times) > 1 else times
    model.eval()
    lik.eval()
    return {
        "model": f"GPyTorch SVGP (m = {m})",
        "epochs": len(times),
        "first_epoch_s": times[0],
        "epoch_s": statistics.median(steady),
        "epoch_times_s": times,
    }, (model, lik)


def bench_predict_dbk(model, cells: int, device: torch.device, batch: int = 65536) -> dict:
    """Cells per second of DBK predictive mean + variance (scaled inputs already on the device)."""
    Xs = torch.rand(cells, 2, device=device, dtype=model.dtype) * 2 - 1
    model.predict_scaled(Xs[:batch], batch)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    for i in range(0, cells, batch):
        m, v = model.predict_scaled(Xs[i : i + batch], batch)
    _sync(device)
    dt = time.perf_counter() - t0
    # end to end through numpy (what `gpcore predict` streams), on a slice
    k = min(cells, 4 * batch)
    Xn = np.random.default_rng(1).uniform(-84, -82, size=(k, 2))
    t1 = time.perf_counter()
    model.predict(Xn, batch_size=batch)
    dt_np = time.perf_counter() - t1
    return {"cells": cells, "device_cells_per_s": cells / dt, "numpy_cells_per_s": k / dt_np}


def bench_predict_gpytorch(svgp, cells: int, device: torch.device, batch: int = 65536) -> dict | None:
    if svgp is None:
        return None
    import gpytorch

    model, lik = svgp
    Xs = torch.rand(cells, 2, device=device) * 2 - 1
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        lik(model(Xs[:batch]))  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        for i in range(0, cells, batch):
            out = lik(model(Xs[i : i + batch]))
            out.mean, out.variance  # noqa: B018
        _sync(device)
    return {"cells": cells, "device_cells_per_s": cells / (time.perf_counter() - t0)}


def profile_syncs(X, y, cfg: dict, device: torch.device) -> dict:
    """Host-device synchronisations per DBK training step (torch.profiler; CUDA only)."""
    if device.type != "cuda":
        return {"note": "not measured: host-device syncs only exist with a GPU"}
    from torch.profiler import ProfilerActivity, profile

    n = min(len(y), 64 * cfg["batch"])
    model = make_model("dbk", hidden=cfg["hidden"], rank=cfg["rank"], batch_size=cfg["batch"], epochs=1,
                       patience=10**6, device="cuda")
    model.fit(X[:n], y[:n])  # warm-up (kernels, allocator)
    model = make_model("dbk", hidden=cfg["hidden"], rank=cfg["rank"], batch_size=cfg["batch"], epochs=1,
                       patience=10**6, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.fit(X[:n], y[:n])
    names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
    counts = {k: 0 for k in names}
    memcpy_dtoh = 0
    for ev in prof.events():
        if ev.name in counts:
            counts[ev.name] += 1
        if "Memcpy DtoH" in ev.name:
            memcpy_dtoh += 1
    steps = math.ceil(n / cfg["batch"])
    return {"steps": steps, "sync_calls": counts, "memcpy_dtoh": memcpy_dtoh,
            "note": "a fit also syncs once per epoch (loss read-back) and in set-up/finalize; compare with steps"}


def bench_vecchia_family(n: int, device: torch.device, epochs: int, cells: int, chunk: int,
                         models=("vecchia", "dbk-nn")) -> list[dict]:
    """Fit and prediction seconds of ``vecchia`` and ``dbk-nn`` at ``n`` points (90 % training, 10 % validation,
    condition_on_validation as by default), each with ``epochs`` residual epochs (dbk-nn: 3 DBK epochs at batch
    4096, no feature check), and prediction of ``cells`` new places end to end (neighbour searches and the batched
    Choleskys on ``device``, the ordering on the CPU). ``setup_s`` = fit time beyond the median epoch times the epochs
    run (ordering, neighbour search, posterior, conditioning on the validation rows)."""
    X, y = synthetic_georgia(n, seed=1)
    k = int(0.9 * n)
    Xp = np.random.default_rng(2).uniform([GA_BOX[0], GA_BOX[2]], [GA_BOX[1], GA_BOX[3]], size=(cells, 2))
    out = []
    family = (("vecchia", {}), ("dbk-nn", {"dbk_epochs": 3, "dbk_batch_size": 4096, "feature_check": False}))
    for name, settings in [f for f in family if f[0] in models]:
        times: list[float] = []
        last = [0.0]

        def cb(p, times=times, last=last):
            now = time.perf_counter()
            times.append(now - last[0])
            last[0] = now

        model = make_model(name, epochs=epochs, chunk_size=chunk, device=device.type, seed=0, **settings)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _sync(device)
        t0 = last[0] = time.perf_counter()
        model.fit(X[:k], y[:k], X[k:], y[k:], callback=cb)
        _sync(device)
        fit_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        pred = model.predict(Xp)
        _sync(device)
        pred_s = time.perf_counter() - t1
        row = {"model": name, "n": n, "epochs": len(times), "fit_s": fit_s,
               "epoch_s": statistics.median(times[1:] or times),
               "predict_cells": cells, "predict_s": pred_s, "predict_cells_per_s": cells / pred_s,
               "finite": bool(np.isfinite(pred.mean).all() and np.isfinite(pred.var_y).all()),
               "peak_gpu_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
        # ordering, neighbour search, posterior, conditioning (dbk-nn's stages have epochs of unequal cost: none)
        row["setup_s"] = fit_s - row["epoch_s"] * len(times) if name == "vecchia" else None
        print(f"{name} n={n:,}: fit {fit_s:.1f} s ({row['epochs']} epochs, median {row['epoch_s']:.2f} s/epoch, "
              f"setup {row['setup_s'] or 0:.1f} s); predict {cells:,} cells {pred_s:.1f} s"
              + (f"; peak GPU memory {row['peak_gpu_gib']:.1f} GiB" if row["peak_gpu_gib"] is not None else ""))
        out.append(row)
    return out


def bench_neighbor_search(n: int, device: torch.device, m: int = 30, cells: int = 0) -> dict:
    """Seconds of the fit's set-up searches at ``n`` synthetic points: the max-min ordering (numpy, CPU), the ``m``
    ordered neighbours by the KD-tree (CPU cores) and by the grid search on ``device``, and the ``1.5 m`` nearest
    training points of ``cells`` new places both ways; with the share of rows whose sets agree (docs/methods/vecchia.md,
    "Neighbour search on a GPU")."""
    from gpcore.models import neighbors as nb

    X, _ = synthetic_georgia(n, seed=1)
    X = (X - X.min(0)) / (X.max(0) - X.min(0)).max()
    row: dict = {"n": n, "m": m, "device": device.type}
    t0 = time.perf_counter()
    Xo = X[nb.maxmin_order(X)]
    row["maxmin_order_s"] = time.perf_counter() - t0
    saved = nb.SEARCH
    try:
        nb.SEARCH = "kdtree"
        t0 = time.perf_counter()
        tree = nb.ordered_neighbors(Xo, m)
        row["ordered_kdtree_s"] = time.perf_counter() - t0
        nb.SEARCH = "grid"
        _sync(device)
        t0 = time.perf_counter()
        grid = nb.ordered_neighbors(Xo, m, device=device)
        _sync(device)
        row["ordered_grid_s"] = time.perf_counter() - t0
        row["ordered_rows_equal"] = float((grid.cpu().numpy() == tree).all(1).mean())
        if cells:
            Q = np.random.default_rng(5).random((cells, 2))
            k = m * 3 // 2
            out = {}
            for search in ("kdtree", "grid"):
                nb.SEARCH = search
                _sync(device)
                t0 = time.perf_counter()
                out[search] = nb.NearestIndex(Xo, device if search == "grid" else None).query(Q, k).cpu().numpy()
                _sync(device)
                row[f"predict_{search}_s"] = time.perf_counter() - t0
            row["predict_cells"] = cells
            row["predict_rows_equal"] = float((out["grid"] == out["kdtree"]).all(1).mean())
    finally:
        nb.SEARCH = saved
    print(f"neighbour search n={n:,} m={m}: max-min ordering {row['maxmin_order_s']:.1f} s (CPU); ordered sets "
          f"KD-tree {row['ordered_kdtree_s']:.2f} s, grid on {device.type} {row['ordered_grid_s']:.2f} s "
          f"({row['ordered_rows_equal']:.4%} of rows equal)"
          + (f"; {cells:,} new places KD-tree {row['predict_kdtree_s']:.2f} s, grid {row['predict_grid_s']:.2f} s"
             if cells else ""))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny setting that runs in seconds on any machine")
    ap.add_argument("--setting", choices=tuple(SETTINGS), help="override the automatic choice")
    ap.add_argument("--n", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--inducing", type=int)
    ap.add_argument("--predict", type=int, help="cells for the prediction-throughput measurement")
    ap.add_argument("--skip-gpytorch", action="store_true")
    ap.add_argument("--profile", action="store_true", help="count host-device syncs per training step (CUDA)")
    ap.add_argument("--backbone-precision", choices=("fp32", "tf32", "bf16"),
                    help="backbone matmul precision on CUDA (default tf32)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the backbone (CUDA)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--vecchia", metavar="N,N", help="also fit vecchia and dbk-nn at these sizes (e.g. 100000,1000000)")
    ap.add_argument("--vecchia-epochs", type=int, default=10, help="residual epochs of --vecchia fits")
    ap.add_argument("--vecchia-chunk", type=int, default=512, help="points per batched Cholesky of --vecchia fits")
    ap.add_argument("--vecchia-only", action="store_true", help="skip the DBK / GPyTorch part")
    ap.add_argument("--vecchia-models", default="vecchia,dbk-nn", help="which of vecchia, dbk-nn --vecchia fits")
    ap.add_argument("--neighbors", metavar="N,N", help="time the set-up searches (ordering, KD-tree, grid search on "
                    "the device) at these sizes; with --vecchia-only nothing else but the --vecchia fits")
    args = ap.parse_args(argv)

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    setting = args.setting or ("smoke" if args.smoke else ("paper" if gpu else "cpu"))
    cfg = dict(SETTINGS[setting])
    for k in ("n", "epochs", "hidden", "rank", "batch", "inducing", "predict"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if setting == "smoke" and not gpu:
        torch.set_num_threads(1)  # tiny matrices: threads only add overhead (and stall on a busy machine)
    if args.backbone_precision:
        os.environ["GPCORE_BACKBONE_PRECISION"] = args.backbone_precision
    if args.compile:
        os.environ["GPCORE_COMPILE"] = "1"

    if gpu:
        banner = f"GPU run on {describe_device('cuda')} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    else:
        banner = (f"NO GPU PRESENT: CPU run on {describe_device('cpu')}, {setting} setting -- "
                  "these are CPU numbers, not GPU numbers")
    print(banner)
    print(f"setting {setting}: n={cfg['n']:,} h={cfg['hidden']} r={cfg['rank']} batch={cfg['batch']} "
          f"m={cfg['inducing']} epochs={cfg['epochs']} predict={cfg['predict']:,} cells")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    res: dict = {"gpu": gpu, "device": describe_device(device.type), "setting": setting, "config": cfg,
                 "torch": torch.__version__, "backbone_precision": os.environ.get("GPCORE_BACKBONE_PRECISION"),
                 "compile": bool(args.compile)}
    if args.smoke and not args.vecchia:
        args.vecchia, args.vecchia_epochs = "2000", 2
    if args.smoke and not args.neighbors:
        args.neighbors = "5000"
    if args.neighbors:
        res["neighbors"] = [bench_neighbor_search(int(v), device, cells=min(cfg["predict"], int(v)))
                            for v in args.neighbors.split(",") if v.strip()]
    if args.vecchia:
        sizes = [int(v) for v in args.vecchia.split(",") if v.strip()]
        res["vecchia"] = [r for n in sizes for r in bench_vecchia_family(
            n, device, args.vecchia_epochs, min(cfg["predict"], max(sizes)), args.vecchia_chunk,
            tuple(args.vecchia_models.split(",")))]
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
    if args.vecchia_only:
        res["total_s"] = time.perf_counter() - t0
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
        return 0
    X, y = synthetic_georgia(cfg["n"])
    dbk, model = bench_dbk(X, y, cfg, device)
    res["dbk"] = dbk
    print(f"DBK-dPPGP: {dbk['epoch_s']:.3f} s/epoch ({dbk['steps_per_epoch']} steps; first epoch "
          f"{dbk['first_epoch_s']:.3f} s)")
    svgp = None
    if not args.skip_gpytorch:
        sv, svgp = bench_gpytorch_svgp(X, y, cfg, device)
        res["gpytorch_svgp"] = sv
        if sv is None:
            print("GPyTorch SVGP: skipped (gpytorch not installed; pip install -e '.[bench]')")
        else:
            print(f"{sv['model']}: {sv['epoch_s']:.3f} s/epoch (first epoch {sv['first_epoch_s']:.3f} s)")
    pdbk = bench_predict_dbk(model, cfg["predict"], device)
    res["predict_dbk"] = pdbk
    print(f"DBK prediction: {pdbk['device_cells_per_s']:,.0f} cells/s on the device, "
          f"{pdbk['numpy_cells_per_s']:,.0f} cells/s through NumPy (mean + variance)")
    psv = bench_predict_gpytorch(svgp, cfg["predict"], device)
    res["predict_gpytorch_svgp"] = psv
    if psv is not None:
        print(f"GPyTorch SVGP prediction: {psv['device_cells_per_s']:,.0f} cells/s on the device")
    if args.profile:
        res["syncs"] = profile_syncs(X, y, cfg, device)
        print(f"host-device syncs: {res['syncs']}")
    if gpu and setting == "paper":
        ok = dbk["epoch_s"] <= 1.0
        print(f"target (one DBK epoch <= 1 s on one H100): {'met' if ok else 'NOT met'} on {res['device']}")
    res["total_s"] = time.perf_counter() - t0
    print(f"total {res['total_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
