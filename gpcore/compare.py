"""Fit several models on one seeded split and rank them (``python -m gpcore compare``).

Every model sees the same data, transform, split and strata; each run is written under
``OUT/runs/<model>`` and the combined table to ``OUT/metrics.{csv,md,json}``, ranked by the
overall test NLL. Metrics are in the transformed units the models train in (e.g. log10 Mbps).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from gpcore.runs import RunConfig, execute_run, prepare

COLUMNS = [
    "model",
    "group",
    "n",
    "mae",
    "rmse",
    "nll",
    "crps",
    "coverage",
    "pi_width_mean",
    "pi_width_median",
    "fit_seconds",
    "predict_seconds",
]


def compare_models(base: RunConfig, models: list[str], out_dir, overrides: dict[str, dict] | None = None,
                   log=print, callback_factory=None) -> pd.DataFrame:
    """Run each model in ``models`` with ``base``'s data settings; return the ranked tidy table.

    ``overrides`` maps a model name to extra settings for it (``--set dbk-rbf.rank=256``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prep = prepare(base)
    log(prep.report_text or f"{len(prep.y)} rows")
    tables = []
    for name in models:
        settings = {**base.settings, **(overrides or {}).get(name, {})}
        cfg = dataclasses.replace(base, model=name, settings=settings, label=name)
        log(f"--- fitting {name} ({len(prep.train_idx)} training points)")
        cb = callback_factory(name) if callback_factory else None
        run_dir = execute_run(cfg, out / "runs" / name, callback=cb, prepared=prep, log=log)
        t = pd.read_csv(run_dir / "metrics.csv")
        t.insert(0, "model", name)
        tables.append(t)
        log(t[["group", "n", "mae", "nll", "coverage", "pi_width_mean", "fit_seconds"]].to_string(index=False))
    table = pd.concat(tables, ignore_index=True)[COLUMNS]
    order = table[table.group == "all"].sort_values("nll")["model"].tolist()
    table["rank"] = table["model"].map({m: i + 1 for i, m in enumerate(order)})
    table = table.sort_values(["rank", "group"], key=lambda s: s if s.name == "rank" else s.ne("all")).reset_index(
        drop=True
    )
    write_tables(table, out, base)
    return table


def write_tables(table: pd.DataFrame, out: Path, base: RunConfig) -> None:
    table.to_csv(out / "metrics.csv", index=False)
    (out / "metrics.json").write_text(
        json.dumps({"config": base.to_dict(), "metrics": table.to_dict(orient="records")}, indent=2)
    )
    fmt = table.copy()
    for col in ("mae", "rmse", "nll", "crps", "pi_width_mean", "pi_width_median"):
        fmt[col] = fmt[col].map(lambda v: f"{v:.4f}")
    fmt["coverage"] = fmt["coverage"].map(lambda v: f"{100 * v:.1f}%")
    for col in ("fit_seconds", "predict_seconds"):
        fmt[col] = fmt[col].map(lambda v: f"{v:.2f}")
    header = (
        f"# Model comparison\n\nData: `{base.data}` (quarter {base.quarter or 'default'}), target `{base.y}` "
        f"({base.transform}), split {base.split} 8:1:1 seed {base.seed}, strata {base.strata or 'none'}. "
        "Metrics on the test split in transformed units; ranked by overall NLL.\n\n"
    )
    (out / "metrics.md").write_text(header + _markdown(fmt) + "\n")


def _markdown(df: pd.DataFrame) -> str:
    cols = ["rank", *[c for c in df.columns if c != "rank"]]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df[cols].iterrows():
        lines.append("| " + " | ".join(str(row[c]) for c in cols) + " |")
    return "\n".join(lines)
