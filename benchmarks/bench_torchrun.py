"""Issue 22's torchrun bar: ``vecchia`` fitted by ``torchrun --nproc_per_node=2 -m gpcore fit ... --distributed``
against the same fit in one process, on ``--n`` synthetic Ookla-like points (default 100,000).

The points are :func:`gpcore.data.synthetic.ookla_points` (dense cities, sparse countryside; y = log10 download
Mbps with its noise), written to a CSV; both fits run the CLI on it with the same seed, split (random 8:1:1), no
grid and ``dtype=float64``, each in its own process(es) with one torch thread per process. Reported: wall seconds of
each (the two processes share this machine's cores), the largest absolute and relative difference over every
entry of the two fitted modules' state (hyperparameters, ordering, neighbour sets, conditioning data), and the two
test NLLs. The bar: every hyperparameter within 1e-6. How the distributed fit splits the likelihood:
docs/scaling.md ("Vecchia and dbk-nn").

    python benchmarks/bench_torchrun.py                 # n = 100,000 (minutes)
    python benchmarks/bench_torchrun.py --smoke         # n = 2,000, a few iterations (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from _harness import REPO, stamp

from gpcore.data.synthetic import ookla_points
from gpcore.models import load_model

#: module entries that are hyperparameters (the rest is data, ordering and neighbour sets: equal or not at all)
HYPER = ("raw_", "mu0")


def fit_cli(csv: Path, out: Path, settings: list[str], nproc: int, seed: int) -> float:
    args = ["fit", "--data", str(csv), "--x", "lon,lat", "--y", "y", "--model", "vecchia", "--grid", "none",
            "--seed", str(seed), "--set", "dtype=float64", *[a for s in settings for a in ("--set", s)],
            "--out", str(out)]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "gpcore", *args, "--distributed"]
    else:
        cmd = [sys.executable, "-m", "gpcore", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


def compare(a: Path, b: Path) -> dict:
    sa, sb = load_model(a / "model").module_.state_dict(), load_model(b / "model").module_.state_dict()
    if set(sa) != set(sb):
        raise SystemExit(f"the two runs' modules differ: {sorted(set(sa) ^ set(sb))}")
    worst = {"hyper_abs": 0.0, "hyper_rel": 0.0, "hyper_key": "", "other_abs": 0.0}
    for k in sa:
        x, y = sa[k].double(), sb[k].double()
        d = float((x - y).abs().max()) if x.numel() else 0.0
        if k.startswith(HYPER):
            rel = d / max(float(y.abs().max()), 1e-300)
            if d >= worst["hyper_abs"]:
                worst.update(hyper_abs=d, hyper_rel=rel, hyper_key=k)
        else:
            worst["other_abs"] = max(worst["other_abs"], d)
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="synthetic points (train + validation + test)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="vecchia setting KEY=VALUE, e.g. neighbors=15")
    ap.add_argument("--out", help="also write the markdown here")
    ap.add_argument("--smoke", action="store_true", help="2,000 points, 3 iterations (seconds, CI)")
    args = ap.parse_args(argv)
    n, settings = args.n, list(args.set)
    if args.smoke:
        n, settings = 2000, ["epochs=3", "neighbors=8", *settings]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        X, y, _, _ = ookla_points(n, seed=args.seed)
        pd.DataFrame({"lon": X[:, 0], "lat": X[:, 1], "y": y}).to_csv(tmp / "d.csv", index=False)
        t_dist = fit_cli(tmp / "d.csv", tmp / "dist", settings, args.nproc, args.seed)
        t_one = fit_cli(tmp / "d.csv", tmp / "single", settings, 1, args.seed)
        diff = compare(tmp / "dist", tmp / "single")
        ma, mb = (json.loads((tmp / r / "run.json").read_text()) for r in ("dist", "single"))
        nll_d, nll_1 = ma["metrics"][0]["nll"], mb["metrics"][0]["nll"]
        world = ma["train_info"].get("world_size")
    ok = diff["hyper_abs"] <= 1e-6
    lines = [
        stamp(time.perf_counter() - t0),
        "",
        "| n | processes | wall s (torchrun) | wall s (one process) | max hyperparameter diff (abs / rel, entry) "
        "| max diff of the rest | test NLL torchrun / one | bar (≤ 1e-6) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {n:,} | {world} | {t_dist:.1f} | {t_one:.1f} | {diff['hyper_abs']:.2e} / {diff['hyper_rel']:.2e} "
        f"({diff['hyper_key']}) | {diff['other_abs']:.1e} | {nll_d:.6f} / {nll_1:.6f} | {'met' if ok else 'missed'} |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
