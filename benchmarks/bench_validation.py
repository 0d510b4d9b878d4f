"""Issue 25 part 0 for the weight-space models: do the validation rows help inside the posterior?

For each data set (``--data``, as in ``bench_race.py``: the project's seeded 8:1:1 split, ``tests`` weights) and each
``--models`` model (default ``dbk,svgp,ppgp``), three variants scored on the same test rows:

* ``as fitted``: trained on the training rows, stopped on the validation rows (the default path);
* ``+ validation (Bayes)``: then the validation rows update ``q(w)`` by Bayes' rule
  (:func:`gpcore.models.validation.update_weights`, the ``condition_on_validation`` setting);
* ``refit``: a second fit on training + validation rows for the number of epochs the first fit's validation chose
  (no early stopping, no validation rows left; DBK without its joint calibration, which needs them).

Reported: test NLL, CRPS, 95 % coverage ± two binomial SEs overall and per stratum, fit seconds (the refit's own).

    python benchmarks/bench_validation.py --data pr,mo
    python benchmarks/bench_validation.py --smoke           # tiny synthetic data, seconds (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _harness import add_race_args, report, smoke_settings, start, stderr
from bench_race import race_configs, score

from gpcore.models import make_model
from gpcore.models.validation import update_weights
from gpcore.run.config import RunConfig
from gpcore.run.pipeline import prepare


def variants(key: str, cfg: RunConfig, name: str, settings: dict) -> list[dict]:
    prep = prepare(cfg)
    tr, va, te = prep.train_idx, prep.val_idx, prep.test_idx
    X, y, w, g = prep.X, prep.y, prep.weights, prep.strata
    g_te = None if g is None else g[te]
    wk = {} if w is None else {"weights": w[tr], "val_weights": w[va]}
    w_te = None if w is None else w[te]
    base = {"seed": cfg.seed, **settings, "condition_on_validation": False}

    def scored(label, model, fit_s, n):
        p = model.predict(X[te], weights=w_te)
        return score(key, f"{name} {label}", cfg.weight or "-", p.mean, p.var_y, y[te], g_te, fit_s, n)

    t = time.perf_counter()
    m = make_model(name, **base).fit(X[tr], y[tr], X[va], y[va], **wk)
    rows = [scored("as fitted", m, time.perf_counter() - t, len(tr))]
    update_weights(m, X[va], y[va], None if w is None else w[va])
    rows.append(scored("+ validation (Bayes)", m, rows[0]["fit_s"], len(tr)))
    epochs = max(1, int(m.train_info_["best_epoch"]))
    extra = {"joint_calibration": False} if "joint_calibration" in type(m.config).__dataclass_fields__ else {}
    both = np.r_[tr, va]
    t = time.perf_counter()
    m2 = make_model(name, **{**base, "epochs": epochs}, **extra).fit(X[both], y[both],
                                                              weights=None if w is None else w[both])
    rows.append(scored(f"refit ({epochs} epochs)", m2, time.perf_counter() - t, len(both)))
    for r in rows:
        stderr(f"  {r['model']}: test NLL {r['nll']:.4f}, coverage {r['coverage_cell']}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="pr,mo", help="comma-separated, from pr, mo, california, turkey")
    ap.add_argument("--models", default="dbk,svgp,ppgp", help="comma-separated weight-space models")
    ap.add_argument("--seed", type=int, default=0)
    add_race_args(ap, "dbk.epochs=50")
    args = ap.parse_args(argv)
    models, sets = start(args.models, args.set)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, cfg in race_configs(args.data, args.smoke, Path(tmp)):
            cfg = dataclasses.replace(cfg, seed=args.seed)
            for name in models:
                settings = {**(smoke_settings(name) if args.smoke else {}), **sets.get(name, {})}
                rows += variants(key, cfg, name, settings)
    if not rows:
        print("nothing to run")
        return 0
    df = pd.DataFrame(rows)
    head = ["| data | model | test NLL | CRPS | 95 % coverage | per stratum | fit s |", "|---|---|---|---|---|---|---|"]
    md = "\n".join(head + [f"| {r.data} | {r.model} | {r.nll:.4f} | {r.crps:.4f} | {r.coverage_cell} | "
                           f"{r.strata_coverage} | {r.fit_s:.0f} |" for r in df.itertuples()])
    report(f"random split, seed {args.seed}; 'refit' trains on training + validation rows", md, df, args.out)
    return 0 if np.isfinite(df["nll"]).all() else 1


if __name__ == "__main__":
    sys.exit(main())
