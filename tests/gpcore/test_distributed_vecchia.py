"""``vecchia`` and ``dbk-nn`` train distributed and equal single-process training (2 CPU processes, gloo, float64).

Every rank holds all the ordered points and neighbour sets and computes a contiguous share of the likelihood's
chunks; loss and gradients are summed over ranks at every step and every L-BFGS closure evaluation
(docs/scaling.md, "Vecchia and dbk-nn"). One ``torch.multiprocessing.spawn`` of two ranks fits every case; the
parent fits the same cases in one process. Hyperparameters, predictions and the loss / validation history must
agree to 1e-6 (they differ only by the order of the chunk sums), the gradient of one step to 1e-10, and the two
ranks must hold the same model. The split is checked to be real: each rank computes a strict part of the chunks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpcore import make_model
from tests.net import free_port

WORLD = 2
TOL = 1e-6
_DBK = dict(dbk_epochs=2, dbk_rank=8, dbk_hidden=8, dbk_batch_size=32)
# name -> (registry name, settings, weighted); 101 training points in chunks of 16: 7 chunks, 4 + 3 per rank
CASES: dict[str, tuple[str, dict, bool]] = {
    "vecchia-lbfgs": ("vecchia", dict(neighbors=6, chunk_size=16, epochs=6), False),
    "vecchia-adam-weighted": ("vecchia", dict(neighbors=6, chunk_size=24, epochs=5, optimizer="adam"), True),
    "vecchia-one-chunk": ("vecchia", dict(neighbors=5, epochs=4), False),  # one chunk: rank 1 computes nothing
    "dbk-nn-stagewise": ("dbk-nn", dict(neighbors=6, chunk_size=16, epochs=4, **_DBK), False),  # + feature check
    "dbk-nn-joint-weighted": ("dbk-nn", dict(neighbors=6, chunk_size=16, epochs=3, train_mode="joint",
                                             joint_epochs=2, **_DBK), True),
    # hyperparameters from a seeded subset of 50 of the 101 terms (gpcore.models.terms): every rank draws the same
    "vecchia-subset": ("vecchia", dict(neighbors=6, chunk_size=16, epochs=5, likelihood_points=50), False),
    "dbk-nn-subset": ("dbk-nn", dict(neighbors=6, chunk_size=16, epochs=3, likelihood_points=50, **_DBK), True),
}
# one step's gradient at the parameters of a short single-process fit (no validation: features kept)
GRAD_CASES: dict[str, tuple[str, dict, bool]] = {
    "vecchia": ("vecchia", dict(neighbors=6, chunk_size=16, epochs=2), False),
    "vecchia-weighted": ("vecchia", dict(neighbors=6, chunk_size=16, epochs=2), True),
    "dbk-nn": ("dbk-nn", dict(neighbors=6, chunk_size=16, epochs=2, **_DBK), False),
    "dbk-nn-joint": ("dbk-nn", dict(neighbors=6, chunk_size=16, epochs=2, **_DBK), True),
}


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, size=(151, 2))
    y = np.sin(2.0 * X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rng.normal(size=X.shape[0])
    w = rng.integers(1, 30, size=X.shape[0]).astype(float)
    return (X[:101], y[:101], w[:101]), (X[101:131], y[101:131], w[101:131]), X[131:]


def _model(name: str, kw: dict):
    return make_model(name, dtype="float64", device="cpu", patience=50, **kw)


def _fit(name: str, kw: dict, weighted: bool):
    (X, y, w), (Xv, yv, wv), _ = _data()
    extra = dict(weights=w, val_weights=wv) if weighted else {}
    return _model(name, kw).fit(X, y, Xv, yv, **extra)


def _result(model) -> dict[str, np.ndarray]:
    out = {f"p:{k}": v.detach().cpu().double().numpy().copy() for k, v in model.module_.state_dict().items()}
    _, _, Xt = _data()
    weights = np.ones(len(Xt)) if model.weighted else None
    pred = model.predict(Xt, weights=weights) if weights is not None else model.predict(Xt)
    out["pred_mean"], out["pred_var"] = pred.mean, pred.var_y
    out["loss"] = np.array([h["loss"] for h in model.history_])
    out["val_nll"] = np.array([h["val_nll"] for h in model.history_], dtype=float)
    out["features_used"] = np.array([float(getattr(model, "features_used", True))])
    return out


def _grad_model(case: str):
    """A short single-process fit (the same on every rank), its scaled data and, for ``dbk-nn-joint``, the joint
    stage switched on (the feature map's parameters train too)."""
    name, kw, weighted = GRAD_CASES[case]
    (X, y, w), _, _ = _data()
    model = _model(name, kw).fit(X, y, **(dict(weights=w) if weighted else {}))
    if case == "dbk-nn-joint":
        model._set_joint(True)
    ws = model._to_tensor(w) if weighted else None
    return model, model.scale_x(X), model.scale_y(y), ws


def _flat_grad(model) -> np.ndarray:
    ps = [p for p in model.module_.parameters() if p.requires_grad]
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps]).numpy().copy()


def _grad_distributed(case: str, ctx) -> dict[str, np.ndarray]:
    from gpcore import comm
    from gpcore import distributed as D

    model, Xs, ys, ws = _grad_model(case)
    n = Xs.shape[0]
    with D.session(ctx):
        steps = D.DistributedSteps(model, ctx, n, model.config.batch_size, True, model.config.seed)
        ((idx, b_local, b_global),) = steps.epoch_batches(Xs.device)
        model.module_.zero_grad(set_to_none=True)
        loss = steps.step(Xs, ys, idx, b_local, b_global, n, ws, global_loss=True)
        grad = _flat_grad(model)
        with comm.step_scope(ctx):  # what this rank computes on its own: its chunks and its loss share
            chunks = list(comm.own_chunks(model.module_.X_train.shape[0], model.config.chunk_size))
            model.module_.zero_grad(set_to_none=True)
            share = model._step(Xs, ys, n, ws)
    return {"grad": grad, "loss": np.array([float(loss)]), "share": np.array([float(share)]),
            "chunks": np.array(chunks, dtype=float)}


def _grad_single(case: str) -> dict[str, np.ndarray]:
    model, Xs, ys, ws = _grad_model(case)
    model.module_.zero_grad(set_to_none=True)
    loss = model._step(Xs, ys, Xs.shape[0], ws)
    return {"grad": _flat_grad(model), "loss": np.array([float(loss)])}


def _worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    from gpcore import distributed as D

    ctx = D.init_distributed(timeout_s=60, device="cpu")  # ranks out of step fail the test instead of hanging it
    for case, (name, kw, weighted) in CASES.items():
        with D.session(ctx):
            model = _fit(name, kw, weighted)
        np.savez(os.path.join(outdir, f"{case}-rank{rank}.npz"), **_result(model))
    for case in GRAD_CASES:
        np.savez(os.path.join(outdir, f"grad-{case}-rank{rank}.npz"), **_grad_distributed(case, ctx))
    D.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{case: (single, rank0, rank1)}`` result dicts (``grad:<case>`` for the gradient cases)."""
    import torch.multiprocessing as mp

    outdir = tmp_path_factory.mktemp("ddp-vecchia")
    mp.spawn(_worker, args=(free_port(), str(outdir)), nprocs=WORLD, join=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny problems: one thread is fastest and matches the workers
    try:
        res = {}
        for case, (name, kw, weighted) in CASES.items():
            ranks = [dict(np.load(outdir / f"{case}-rank{r}.npz")) for r in range(WORLD)]
            res[case] = (_result(_fit(name, kw, weighted)), *ranks)
        for case in GRAD_CASES:
            ranks = [dict(np.load(outdir / f"grad-{case}-rank{r}.npz")) for r in range(WORLD)]
            res[f"grad:{case}"] = (_grad_single(case), *ranks)
        return res
    finally:
        torch.set_num_threads(threads)


def _max_diff(a: dict, b: dict) -> tuple[float, str]:
    worst, key = 0.0, ""
    for k in a:
        if a[k].size == 0:
            continue
        d = float(np.max(np.abs(a[k] - b[k]))) / max(1.0, float(np.max(np.abs(a[k]))))
        if not d <= worst:  # NaN counts as the worst
            worst, key = d, k
    return worst, key


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_match_single_process(runs, case):
    single, r0, r1 = runs[case]
    assert set(single) == set(r0)
    d01, k01 = _max_diff(r0, r1)
    assert d01 < 1e-12, f"ranks disagree on {k01}: {d01}"
    d, k = _max_diff(single, r0)
    assert d < TOL, f"{case}: distributed differs from single-process on {k} by {d:.3g}"
    assert len(single["loss"]) >= 2


def test_dbknn_feature_check_ran_on_every_rank(runs):
    single, r0, r1 = runs["dbk-nn-stagewise"]
    assert r0["features_used"][0] == r1["features_used"][0] == single["features_used"][0]


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_step_gradient_matches_single_process(runs, case):
    single, r0, r1 = runs[f"grad:{case}"]
    assert np.array_equal(r0["grad"], r1["grad"]), "ranks hold different gradients"
    g, g0 = single["grad"], r0["grad"]
    assert np.abs(g - g0).max() / max(1.0, np.abs(g).max()) < 1e-10, f"{case}: gradient differs: {g} vs {g0}"
    assert r0["loss"][0] == r1["loss"][0] and r0["loss"][0] == pytest.approx(single["loss"][0], rel=1e-12)
    # the work is split: each rank computes a strict, disjoint part of the single-process chunks
    c0, c1 = r0["chunks"], r1["chunks"]
    assert len(c0) and len(c1) and not set(c0) & set(c1)
    assert sorted([*c0, *c1]) == list(range(0, 101, 16))
    if case.startswith("vecchia"):  # the loss shares are the partial sums of the per-point terms
        assert r0["share"][0] + r1["share"][0] == pytest.approx(single["loss"][0], rel=1e-12)
        assert 0 < r1["share"][0] / single["loss"][0] < 1


def test_own_share_models_refuse_per_rank_shards():
    from gpcore import distributed as D
    from gpcore.errors import ConfigError

    ctx = D.DistContext(rank=0, world_size=2, sharded=True)
    Xs = torch.zeros(4, 2, dtype=torch.float64)
    with pytest.raises(ConfigError, match="every training row"):
        ctx.training_steps(make_model("vecchia"), Xs, Xs[:, 0])


def test_own_chunks_and_count_once_are_plain_outside_a_step():
    from gpcore import comm

    assert comm.own_chunks(101, 16) == range(0, 101, 16) and not comm.splits_terms()
    t = torch.tensor(2.5)
    assert comm.count_once(t) is t


def test_torchrun_fit_vecchia_distributed_cli(tmp_path):
    """``torchrun --nproc_per_node=2 -m gpcore fit --model vecchia ... --distributed`` writes one run (rank 0) whose
    hyperparameters and metrics match ``python -m gpcore fit ...`` on the same data."""
    import pandas as pd

    from gpcore.cli import main
    from gpcore.models import load_model

    rng = np.random.default_rng(3)
    lon, lat = rng.uniform(-90.0, -89.0, 150), rng.uniform(38.0, 39.0, 150)
    val = np.sin(4 * lon) + np.cos(3 * lat) + 0.1 * rng.normal(size=150)
    pd.DataFrame({"lon": lon, "lat": lat, "val": val}).to_csv(tmp_path / "d.csv", index=False)
    repo = Path(__file__).resolve().parents[2]
    args = ["fit", "--data", str(tmp_path / "d.csv"), "--x", "lon,lat", "--y", "val", "--model", "vecchia",
            "--grid", "none", "--set", "dtype=float64", "--set", "epochs=5", "--set", "neighbors=6",
            "--set", "chunk_size=16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "gpcore",
           *args, "--out", str(tmp_path / "dist"), "--distributed"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=repo)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("run written to") == 1  # rank 0 only
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*args, "--out", str(tmp_path / "single")]) == 0
    finally:
        torch.set_num_threads(threads)
    a = json.loads((tmp_path / "dist" / "run.json").read_text())
    b = json.loads((tmp_path / "single" / "run.json").read_text())
    assert a["train_info"]["world_size"] == 2 and "world_size" not in b["train_info"]
    assert a["metrics"][0]["nll"] == pytest.approx(b["metrics"][0]["nll"], rel=1e-6, abs=1e-9)
    ma, mb = load_model(tmp_path / "dist" / "model"), load_model(tmp_path / "single" / "model")
    sa, sb = ma.module_.state_dict(), mb.module_.state_dict()
    assert set(sa) == set(sb)
    for k in sa:
        assert torch.allclose(sa[k].double(), sb[k].double(), atol=1e-6, rtol=1e-6), k
