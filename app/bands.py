"""The band of a run's 95 % coverage in the app: two standard errors, by held-out block on a block split and
binomial otherwise (:func:`gpcore.run.compare.coverage_bands`; docs/metrics.md, "Coverage and its band"), for the
Compare page's tables and chart and the Train page's result; and a run's test-split kind (:func:`split_key`), which
the band depends on and the Compare page groups runs by."""

from __future__ import annotations

import numpy as np
import pandas as pd

from app import cache
from gpcore.errors import GPCoreError


def split_key(info) -> str:
    """A run's test-split kind: ``"random"``, ``"block:<km>"`` for spatial blocks of that size, or
    ``"forecast:<test period>"`` for a run tested on later quarters."""
    cfg = info.manifest.get("config", {})
    if cfg.get("split") == "forecast":
        return f"forecast:{cfg.get('test_period') or '?'}"
    if cfg.get("split") != "block":
        return "random"
    return f"block:{float(cfg.get('block_km', 10.0)):g}"


def with_band(m: pd.DataFrame, key, config: dict) -> pd.DataFrame:
    """``m`` (a run's metrics) with ``two_se``: two SEs of each group's coverage, by held-out block on a block split,
    else binomial (:func:`gpcore.run.compare.coverage_bands`); NaN where the run's test predictions cannot give it
    (a group before recalibration, a run without its test table)."""
    from gpcore.run.compare import coverage_bands

    try:
        bands = coverage_bands(cache.st_test_predictions(*key), config)
    except (GPCoreError, KeyError, ValueError):  # the metrics are still compared, without their band
        return m.assign(two_se=np.nan)
    return m.merge(bands[["group", "two_se"]], on="group", how="left")


def band_caption(kind: str) -> str:
    if kind.startswith("block:"):
        return ("**± 2 SE**: two standard errors of the coverage *by held-out block* — the tiles of one block share "
                "their errors, so a block split's coverage scatters more than independent rows would (✗: further "
                "than that from 95%). Estimated from the split's own blocks, so rough for a stratum with few of "
                "them.")
    return "**± 2 SE**: two binomial standard errors of the coverage (✗: further than that from 95%)."


def overall(run, coverage: float) -> tuple[str, str]:
    """The Train page's ``"95.3% ± 0.9"`` for ``run``'s overall ``coverage`` and the help text naming its band (the
    coverage alone where the run's test predictions cannot give one)."""
    from gpcore.run.compare import band_text

    m = with_band(pd.DataFrame({"group": ["all"], "coverage": [coverage]}), cache.run_key(run),
                  run.manifest.get("config", {}))
    band = band_text(coverage, float(m["two_se"].iloc[0]))
    return f"{100 * coverage:.1f}%" + (f" {band}" if band else ""), band_caption(split_key(run))
