"""The decision commands of ``python -m gpcore`` (argparse and printing over :mod:`gpcore.run.decisions`).

    python -m gpcore exceed RUN_DIR --threshold 35 --units original --out p_below.parquet
    python -m gpcore areas RUN_DIR --areas counties --threshold 35 --out areas.geojson
    python -m gpcore sample RUN_DIR --n 4 --seed 0 --out samples.tif
    python -m gpcore suggest RUN_DIR --k 10 --target undecided --threshold 35 --out picks.geojson

A run fitted with time as an input is decided at one quarter: ``--at 2023Q4`` (default: its latest grid quarter).

Errors are raised (:class:`gpcore.errors.GPCoreError`, naming the flags); :func:`gpcore.cli.main` prints them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpcore.errors import GPCoreError


def add_decision_commands(sub) -> None:
    """Add ``exceed``, ``areas``, ``sample`` and ``suggest`` to the CLI's subparsers."""
    p = sub.add_parser("exceed", help="P(below/above a threshold) per grid cell of a run")
    p.add_argument("run_dir")
    _at_arg(p)
    _threshold_args(p, True)
    p.add_argument("--direction", default="below", choices=("below", "above"))
    p.add_argument("--out", help="output .parquet, .csv, .geojson or .tif (bands: P for f and for a new measurement)")
    p.set_defaults(func=cmd_exceed)

    p = sub.add_parser("areas", help="posterior of the (weighted) mean over each area: counties, strata, polygons")
    p.add_argument("run_dir")
    _at_arg(p)
    p.add_argument("--areas", default="counties",
                   help="counties (bundled, the run's state) | strata (the run's) | column:NAME | polygon FILE")
    p.add_argument("--name-column", help="area name column of a polygon FILE (default NAME/name)")
    p.add_argument("--weights", default="uniform", help="uniform | area (cell area) | a column of the places")
    p.add_argument("--points", help="average over these measurement locations instead of the run's grid cells")
    p.add_argument("--measurements", help="count the measurements of this file in each area")
    _threshold_args(p, False)
    p.add_argument("--samples", type=int, default=0,
                   help="joint samples for the arithmetic mean in original units (0 = skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=20, help="rows to print")
    p.add_argument("--out", help="output .geojson (polygon areas), .csv or .parquet")
    p.set_defaults(func=cmd_areas)

    p = sub.add_parser("sample", help="joint posterior samples over a run's grid (plausible maps)")
    p.add_argument("run_dir")
    _at_arg(p)
    p.add_argument("--n", type=int, default=4, help="number of samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--units", default="original", choices=("original", "model"))
    p.add_argument("--out", required=True, help="output .tif (one band per sample), .parquet, .csv or .geojson")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("suggest", help="where to measure next: k sites that most reduce the posterior variance")
    p.add_argument("run_dir")
    _at_arg(p)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--target", default="all", help="all | undecided (needs --threshold) | stratum:NAME")
    _threshold_args(p, False)
    p.add_argument("--candidates", help="candidate sites file (default: the run's grid cells)")
    p.add_argument("--min-km", type=float, default=0.0, help="minimum distance between picks in km")
    p.add_argument("--engine", default="auto", choices=("auto", "features", "dense"))
    p.add_argument("--seed", type=int, default=0, help="seed of the residual's random features (SVGP family)")
    p.add_argument("--out", help="output .geojson, .csv or .parquet")
    p.set_defaults(func=cmd_suggest)


def _at_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--at", help="a run with time as an input: decide at this quarter (2023Q4; default the run's "
                                "latest grid quarter)")


def _decision_run(run_dir, at: str | None = None):
    """The stored run (:class:`gpcore.run.decisions.StoredRun`, at quarter ``at`` for a run with time as an input),
    with a note when its joint posterior is weak."""
    from gpcore.decide import joint_caveat
    from gpcore.run.decisions import open_run

    run = open_run(run_dir, at=at)
    note = joint_caveat(run.model)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if run.quarter:
        print(f"at {run.quarter} (t = {run.t:g})", file=sys.stderr)
    return run


def _out_format(path: Path, allowed: tuple[str, ...]) -> str:
    from gpcore.data.export import frame_format

    try:
        return frame_format(path, allowed)
    except GPCoreError as e:
        raise type(e)(f"--out {e}") from None


def _save(df, path: str, allowed: tuple[str, ...], what: str = "") -> None:
    """Write ``df`` to the ``--out`` file ``path`` (a format in ``allowed``) and say so."""
    from gpcore.data.export import write_frame

    try:
        write_frame(df, Path(path), _out_format(Path(path), allowed))
    except GPCoreError as e:
        raise type(e)(str(e) if str(e).startswith("--out") else f"--out {e}") from None
    print(f"wrote {what}{path}")


def _threshold_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--threshold", type=float, required=required,
                   help="threshold, e.g. 35 (Mbps) with --units original")
    p.add_argument("--units", default="original", choices=("original", "model"),
                   help="threshold in the target's original units (through the run's transform) or model space")


def cmd_exceed(args) -> int:
    from gpcore import decide
    from gpcore.run.decisions import exceedance_frame

    run = _decision_run(args.run_dir, args.at)
    side = args.direction
    out, e = exceedance_frame(run, args.threshold, args.units, side)
    print(f"threshold {args.threshold:g} ({args.units} units; {e.threshold_model:.4f} in model space), "
          f"{len(out)} cells: P(f {side}) > 0.8 in {int((e.p_f > 0.8).sum())}, < 0.2 in {int((e.p_f < 0.2).sum())}, "
          f"undecided in {int(decide.undecided_mask(e.p_f).sum())}")
    if args.out:
        path = Path(args.out)
        fmt = _out_format(path, ("csv", "parquet", "geojson", "geotiff"))
        if fmt != "geotiff":
            _save(out, args.out, (fmt,))
        else:
            from gpcore import data as D

            D.export_predictions(out, path, columns=[f"p_{side}", f"p_{side}_y"],
                                 tags={"threshold": args.threshold, "units": args.units})
            print(f"wrote {path}")
    return 0


def _flagged(fn, *a, **kw):
    """``fn(...)``, its errors naming the command line's flags (--areas, --weights, --target)."""
    try:
        return fn(*a, **kw)
    except GPCoreError as e:
        text = str(e)
        for word in ("areas", "weights", "target"):
            if text.startswith((f"{word} ", f"{word} column")):
                text = f"--{text}"
        raise type(e)(text) from None


def cmd_areas(args) -> int:
    from gpcore.run import decisions as dec

    run = _decision_run(args.run_dir, args.at)
    if args.points:
        from gpcore import data as D

        places, where = D.read_measurements(args.points, allow_drop=True), f"'{args.points}'"
    else:
        places, where = run.grid, "the run's grid"
    kw = dict(state=run.state, strata=run.strata, name_column=args.name_column)
    labels, polys = _flagged(dec.area_labels, places, args.areas, where=where, **kw)
    weights = _flagged(dec.area_weights, places, args.weights)
    meas = None
    if args.measurements:
        from gpcore import data as D

        pts = D.read_measurements(args.measurements, allow_drop=True)
        meas = _flagged(dec.area_labels, pts, args.areas, where=f"'{args.measurements}'", **kw)[0]
    table = dec.area_table(run.model, places, labels, weights=weights, threshold=args.threshold, units=args.units,
                           transform=run.transform, samples=args.samples, seed=args.seed, measurements=meas, t=run.t)
    cols = [c for c in ("area", "cells", "measurements", "mean", "lower", "upper", "p_below", "mean_arith")
            if c in table.columns]
    print(table[cols].head(args.show).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out:
        _save(dec.with_polygons(table, polys), args.out, ("csv", "parquet", "geojson"), f"{len(table)} areas to ")
    return 0


def cmd_sample(args) -> int:
    from gpcore import data as D
    from gpcore.run.decisions import samples

    if args.n < 1:
        raise GPCoreError(f"--n {args.n}: ask for at least one sample")
    run = _decision_run(args.run_dir, args.at)
    grid = run.grid
    S = samples(run.model, grid, args.n, seed=args.seed, units=args.units, transform=run.transform, t=run.t)
    cols = [f"sample_{i + 1}" for i in range(args.n)]
    path = Path(args.out)
    _out_format(path, ("csv", "parquet", "geojson", "geotiff"))
    out = grid[["cell_id", "lon", "lat", "geometry"] + [c for c in ("row", "col") if c in grid]].copy()
    out.attrs = grid.attrs
    D.export_predictions(out, path, predictions=dict(zip(cols, S, strict=True)), columns=cols,
                         tags={"seed": args.seed, "units": args.units, "samples": args.n})
    print(f"wrote {args.n} joint samples over {len(grid)} cells (seed {args.seed}) to {path}")
    return 0


def cmd_suggest(args) -> int:
    import geopandas as gpd

    from gpcore.run import decisions as dec

    if args.target == "undecided" and args.threshold is None:
        raise GPCoreError("--target undecided needs --threshold (cells with 0.2 < P(below) < 0.8)")
    run = _decision_run(args.run_dir, args.at)
    mask = _flagged(dec.target_mask, run.model, run.grid, args.target, threshold=args.threshold, units=args.units,
                    transform=run.transform, strata=run.strata, state=run.state, require=True, t=run.t)
    cand = run.grid
    if args.candidates:
        from gpcore import data as D

        cand = D.read_measurements(args.candidates, allow_drop=True)
    res = dec.suggest(run.model, run.grid, mask, args.k, candidates=cand, min_km=args.min_km, engine=args.engine,
                      seed=args.seed, t=run.t)
    picks = dec.picks_table(res, cand)
    print(f"{len(picks)} sites over {int(mask.sum())} target cells ({res.engine} engine); mean latent variance "
          f"{res.mean_var_before:.4g} -> {res.mean_var_after:.4g} (model units squared)")
    print(picks.to_string(index=False, float_format=lambda v: f"{v:.5g}"))
    if args.out:
        _save(gpd.GeoDataFrame(picks, geometry=gpd.points_from_xy(picks["lon"], picks["lat"]), crs=4326), args.out,
              ("csv", "parquet", "geojson"))
    return 0


