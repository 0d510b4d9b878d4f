"""Pieces the accuracy benchmarks share (``bench_models.py --data heaton``, ``bench_race.py``): model settings
from the command line, one gpcore fit + prediction timed, and where the shared data files live."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gpcore import make_model
from gpcore.models import available_models

REPO = Path(__file__).resolve().parents[1]
#: settings that make any model tiny for ``--smoke`` (each model keeps the ones it has; ``dbk_*``: dbk-nn's DBK stage)
SMOKE_SETTINGS = {"epochs": 2, "rank": 8, "hidden": 8, "num_inducing": 8, "neighbors": 5, "dbk_epochs": 2,
                  "dbk_rank": 8, "dbk_hidden": 8, "dbk_blocks": 1, "dbk_batch_size": 64}


def shared_data(name: str) -> Path:
    """``$UA_SHARED_DATA/<name>`` when that variable is set, else ``../shared/data/<name>`` beside the repository."""
    root = os.environ.get("UA_SHARED_DATA")
    return Path(root) / name if root else REPO.parent / "shared" / "data" / name


def parse_sets(items) -> dict[str, dict]:
    """``["vecchia.epochs=50", "dbk-rbf.lr=0.01"]`` -> ``{"vecchia": {"epochs": 50}, "dbk-rbf": {"lr": 0.01}}``."""
    out: dict[str, dict] = {}
    for item in items:
        key, sep, value = item.partition("=")
        name, dot, k = key.partition(".")
        if not (sep and dot and name and k):
            raise SystemExit(f"--set {item!r}: write MODEL.SETTING=VALUE, e.g. --set vecchia.epochs=50")
        try:
            v: object = int(value)
        except ValueError:
            try:
                v = float(value)
            except ValueError:
                v = value
        out.setdefault(name, {})[k] = v
    return out


def known_models(names, log=print) -> list[str]:
    """The names in ``names`` that the registry has, saying which ones are skipped."""
    have = set(available_models())
    keep = [n for n in names if n in have]
    for n in names:
        if n not in have:
            log(f"skipping model {n!r}: not registered in gpcore (available: {', '.join(sorted(have))})")
    return keep


def smoke_settings(name: str) -> dict:
    fields = make_model(name).config.field_names()
    return {k: v for k, v in SMOKE_SETTINGS.items() if k in fields}


def run_defaults(name: str, cfg, recalibrate: str = "none") -> dict:
    """The settings a dashboard or CLI run of ``cfg`` gives model ``name`` beside its own defaults: the
    cross-validated latent scale with folds like the run's split, unless ``recalibrate`` rescales the intervals on
    the validation rows (:func:`gpcore.run.pipeline.cv_settings`)."""
    from gpcore.models import model_spec
    from gpcore.run.pipeline import cv_settings

    return cv_settings(cfg, model_spec(name).cls, recalibrate)


def fit_predict(name: str, settings: dict, X, y, X_val, y_val, X_test, *, weights=None, val_weights=None,
                test_weights=None, seed: int = 0, val_groups=None, test_groups=None) -> dict:
    """Fit gpcore model ``name`` (early stopping on the validation rows) and predict the test rows.

    With ``weights`` a model that supports them (``GPModel.supports_weights``) is fitted weighted and each
    test row is predicted for its own ``test_weights`` count; a model that does not is fitted unweighted.
    Returns ``{"mean", "var_f", "var_y", "fit_seconds", "predict_seconds", "weighted", "epochs", "model"}``.
    """
    model = make_model(name, **{"seed": seed, **settings})
    weighted = weights is not None and model.supports_weights
    kw = {"weights": weights, "val_weights": val_weights} if weighted else {}
    if val_groups is not None:  # strata for recalibrate="group"
        kw["val_groups"] = val_groups
    t0 = time.perf_counter()
    model.fit(X, y, X_val, y_val, **kw)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pred = model.predict(X_test, weights=test_weights if weighted else None, groups=test_groups)
    return {"mean": np.asarray(pred.mean), "var_f": np.asarray(pred.var_f), "var_y": np.asarray(pred.var_y),
            "fit_seconds": fit_s,
            "predict_seconds": time.perf_counter() - t0, "weighted": weighted,
            "epochs": getattr(model, "train_info_", {}).get("epochs_run"), "model": model}


def feature_check_text(model) -> str:
    """``"; feature check: ..."`` for a dbk-nn model whose fit ran its feature check, else ``""``."""
    check = getattr(model, "train_info_", {}).get("feature_check")
    if not check:
        return ""
    return (f"; feature check: validation NLL {check['with_features']:.4f} with the features, "
            f"{check['residual_only']:.4f} without, features {'kept' if check['kept'] else 'dropped'}")


def cv_text(model) -> str:
    """``"; latent scale 0.70 ..."`` for a model calibrated by cross-validation (``cv_calibration``), else ``""``."""
    from gpcore.models.vecchia_cv import applied

    cv = applied(getattr(model, "train_info_", None))
    if cv is None:
        return ""
    return (f"; latent scale {cv['scale']:.3f} from {cv['folds']} folds (cross-validated coverage "
            f"{100 * cv['coverage_before']:.1f} -> {100 * cv['coverage_after']:.1f} %)")


def warm_up_torch() -> None:
    """torch imports torch._dynamo (seconds) the first time an optimizer is built: pay it outside the timings."""
    import torch

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_race_args(ap, example: str = "vecchia.epochs=50", smoke: str = "tiny synthetic data, tiny models") -> None:
    """The arguments every race-style benchmark takes: ``--set``, ``--out`` and ``--smoke``."""
    ap.add_argument("--set", action="append", default=[], help=f"MODEL.KEY=VALUE, e.g. {example}")
    ap.add_argument("--out", help="write the markdown table(s) here (and the numbers to the same name with .csv)")
    ap.add_argument("--smoke", action="store_true", help=f"{smoke} (seconds, CI)")


def start(models_csv: str, set_items) -> tuple[list[str], dict[str, dict]]:
    """A race-style benchmark's start: the registered models of ``models_csv`` (the others named and skipped), the
    ``--set`` settings per model, and torch warmed up outside the timings."""
    models = known_models([m for m in models_csv.split(",") if m], log=stderr)
    sets = parse_sets(set_items)
    warm_up_torch()
    return models, sets


def report(header: str, md: str, table, out: str | None) -> None:
    """Print a benchmark's header and markdown table; with ``out``, also write them there and the numbers beside
    them (``out`` with ``.csv``)."""
    print(header)
    print(md)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{header}\n\n{md}\n")
        table.to_csv(path.with_suffix(".csv"), index=False)


def machine() -> str:
    """Platform, CPU model and count, e.g. ``Linux-6.1-x86_64, AMD EPYC 7B13, 2 CPUs, no GPU``."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return f"{platform.platform()}, {cpu}, {os.cpu_count()} CPUs{gpu}"


def git_commit() -> str:
    """Short commit of the checkout, ``+ local changes`` when tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode:
        return "unknown (not a git checkout)"
    dirty = git("diff", "--quiet", "HEAD").returncode != 0
    return head.stdout.strip() + (" + local changes" if dirty else "")


def command_line() -> str:
    """The command as typed, with the thread settings of the environment in front."""
    env = [f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ]
    return " ".join([*env, "python", *map(shlex.quote, sys.argv)])


def stamp(seconds: float | None = None, threads: str | int | None = None) -> str:
    """The date / commit / machine / command lines every benchmark report starts with (markdown bullets);
    ``threads``: the torch threads the measured processes used (default this process's)."""
    import torch

    took = f" ({seconds:.0f} s in all)" if seconds is not None else ""
    threads = torch.get_num_threads() if threads is None else threads
    return (f"- date: {datetime.date.today().isoformat()}; commit: {git_commit()}\n"
            f"- machine: {machine()}; torch {torch.__version__}, {threads} thread(s)\n"
            f"- command: `{command_line()}`{took}")
