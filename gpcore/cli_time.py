"""The time commands of ``python -m gpcore`` (argparse and printing over :mod:`gpcore.run.change`).

    python -m gpcore change RUN_DIR --from 2019Q4 --to 2023Q4 --out change.parquet

``fit --time-input``, ``--split forecast --test-period`` and ``predict --at`` are flags of the commands in
:mod:`gpcore.cli`. Errors are raised (:class:`gpcore.errors.GPCoreError`, naming the flags);
:func:`gpcore.cli.main` prints them. Method: docs/methods/spacetime.md.
"""

from __future__ import annotations

from pathlib import Path

from gpcore.errors import GPCoreError
from gpcore.run.change import HYPER_DRAWS


def add_time_commands(sub) -> None:
    """Add ``change`` to the CLI's subparsers."""
    p = sub.add_parser(
        "change", help="posterior of the change f(t2) - f(t1) per grid cell of a run with time as an input",
        description="Per grid cell of a run fitted with --time-input: the mean, sd and interval of the change "
                    "f(x, t2) - f(x, t1) from the joint posterior (Var = v1 + v2 - 2 c12, not two independent "
                    "marginals) and P(change > 0), in the model's units (log10 units for a log10 run).",
    )
    p.add_argument("run_dir")
    p.add_argument("--from", dest="t_from", required=True, help="the earlier quarter t1, e.g. 2019Q4")
    p.add_argument("--to", dest="t_to", required=True, help="the later quarter t2, e.g. 2023Q4")
    p.add_argument("--level", type=float, default=0.95, help="level of the change interval (change_lo, change_hi)")
    p.add_argument("--hyper-draws", type=int, default=HYPER_DRAWS,
                   help=f"average the change over this many draws of the hyperparameters' posterior (REML, Laplace; "
                        f"vecchia and dbk-nn without features; default {HYPER_DRAWS}); 0 = at the fitted values")
    p.add_argument("--out", required=True, help="output .parquet or .csv (cell_id, lon, lat, change_mean, "
                                                "change_sd, change_lo, change_hi, p_increase), .geojson (the same "
                                                "on the grid's cells) or .tif (one band per change column)")
    p.set_defaults(func=cmd_change)


def cmd_change(args) -> int:
    import numpy as np

    from gpcore.data.export import frame_format
    from gpcore.run.change import run_change
    from gpcore.run.decisions import write_change

    path = Path(args.out)
    try:
        fmt = frame_format(path, ("csv", "parquet", "geojson", "geotiff"))
    except GPCoreError as e:
        raise type(e)(f"--out {e}") from None
    if not 0 < args.level < 1:
        raise GPCoreError(f"--level {args.level:g} is not a probability in (0, 1); use e.g. --level 0.95")
    if args.hyper_draws < 0:
        raise GPCoreError(f"--hyper-draws {args.hyper_draws} is negative; use 0 (the fitted hyperparameters) or more")
    res = run_change(args.run_dir, args.t_from, args.t_to, level=args.level, hyper_draws=args.hyper_draws)
    t = res.table
    p = t["p_increase"].to_numpy()
    print(f"change {res.t_from} -> {res.t_to} over {len(t)} cells, in {res.units}; {res.hyper}")
    print(f"  median change {np.median(t['change_mean']):+.4f} (median sd {np.median(t['change_sd']):.4f}); "
          f"P(increase) > 0.95 in {int((p > 0.95).sum())} cells, < 0.05 in {int((p < 0.05).sum())}, "
          f"sign uncertain in {int(((p >= 0.05) & (p <= 0.95)).sum())}")
    write_change(args.run_dir, t, path, fmt, res.t_from, res.t_to)
    print(f"wrote {path}")
    return 0
