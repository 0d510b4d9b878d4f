"""DBK-dPPGP on the DBK paper's 1-D heteroscedastic toy (docs/methods/dbk.md §2.11, erratum D1).

The exact RBF GP has one noise level for the whole line, so it over-covers where the true noise
is small and under-covers where it is large; dPPGP learns input-dependent variance. The test
holds DBK to a lower test NLL than the exact GP and to 95 % coverage within 3 points.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpcore import make_model
from gpcore import metrics as M
from gpcore.data.synthetic import hetero_1d


@pytest.mark.slow
def test_dbk_dppgp_beats_exact_rbf_gp_on_heteroscedastic_toy():
    x, y, _, sd = hetero_1d(1000, seed=0)
    xv, yv, _, _ = hetero_1d(300, seed=1)
    xt, yt, _, sdt = hetero_1d(1500, seed=2)
    dbk = make_model("dbk-silu", hidden=32, rank=64, alpha=0.01, beta=0.01, batch_size=100, epochs=150,
                     patience=30, lr=2e-3, seed=0)
    dbk.fit(x[:, None], y, xv[:, None], yv)
    exact = make_model("exact", kernel="rbf", epochs=80, seed=0).fit(x[:, None], y, xv[:, None], yv)
    pd_, pe = dbk.predict(xt[:, None]), exact.predict(xt[:, None])
    nll_dbk, nll_exact = M.nll(pd_.mean, pd_.var_y, yt), M.nll(pe.mean, pe.var_y, yt)
    cov_dbk = M.coverage(pd_.mean, pd_.var_y, yt)
    assert nll_dbk < nll_exact, (nll_dbk, nll_exact)
    assert abs(cov_dbk - 0.95) <= 0.03, cov_dbk
    # input-dependent variance (9.2.13): DBK's predictive sd tracks the true noise sd, the exact GP's barely varies
    assert np.corrcoef(np.sqrt(pd_.var_y), sdt)[0, 1] > 0.3
    assert np.std(np.sqrt(pe.var_y)) < np.std(np.sqrt(pd_.var_y))
