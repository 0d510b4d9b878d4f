"""A run keeps the joint posterior's factor over its grid (docs/decide.md, "A run keeps its grid's factor").

For ``vecchia`` and ``dbk-nn`` every joint decision over a run's grid (area posteriors, joint samples, suggestions)
starts from the sparse factor of the joint Vecchia prediction over the grid's cells
(:mod:`gpcore.models.vecchia_joint`); building it is most of the first decision's time (seconds on a 50,000-cell
grid). A fit builds it once, beside the grid's marginals, and writes it into the run (:data:`rundir.JOINT
<gpcore.run.rundir.JOINT>`); :func:`prime` puts it back into a loaded model, so the first county table on the run's
grid starts from it. Exceedance already reads the stored marginals the same way.

The file is derived data. It records the SHA-256 of ``grid.parquet`` and of ``model/`` it was built from and the
grid's ``cell_id`` order; it is used only when both digests still match and its tensors pass
:meth:`VecchiaJoint.from_tensors <gpcore.models.vecchia_joint.VecchiaJoint.from_tensors>`'s checks. Otherwise it is
left alone (with a warning when damaged) and the factor is built on demand, as for any other places. A run with
time as an input stores the factor at its grid's quarter (``grid.parquet``'s, the latest; the quarter is part of
the identity); decisions at its other quarters build theirs when they ask.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gpcore.errors import RunError
from gpcore.run import rundir

FORMAT = 1
#: grids above this many cells store no factor (about 65 µs and 300 bytes per cell for ``vecchia``, more for
#: ``dbk-nn`` with its features: 13 s and 60 MB at the cap on a 2-core CPU); their decisions build it on demand
MAX_CELLS = 200_000


def _has_joint_factor(model) -> bool:
    return hasattr(model, "keep_joint") and hasattr(model, "joint_s")


def _inputs(model, grid, quarter: str | None = None) -> torch.Tensor:
    """The model's scaled inputs of the grid's cells (at ``quarter``'s decimal year for a run with time as an
    input), computed as a decision over the same frame computes them (:func:`~gpcore.run.predict.place_inputs` at
    :func:`~gpcore.data.temporal.parse_quarter`'s ``t``, then :mod:`gpcore.posterior`'s scaling), so the model's
    cache key matches (the tests check that no decision rebuilds the factor)."""
    from gpcore.data.temporal import parse_quarter
    from gpcore.models import as_2d_float
    from gpcore.run.predict import place_inputs

    t = None if quarter is None else parse_quarter(quarter)
    return model.scale_x(as_2d_float(place_inputs(grid, t, model.d_), "X", d=model.d_))


def _identity(run_dir: Path, quarter: str | None = None) -> dict:
    ident = {"format": FORMAT, "grid_sha256": rundir.file_digest(run_dir / rundir.GRID),
             "model_sha256": rundir.file_digest(run_dir / rundir.MODEL)}
    return ident if quarter is None else {**ident, "quarter": str(quarter)}


def write(run_dir, model, grid: pd.DataFrame, quarter: str | None = None) -> float | None:
    """Build the joint factor over ``grid`` (the frame written as the run's ``grid.parquet``, with ``cell_id``,
    ``lon``, ``lat``; for a run with time as an input at ``quarter``, the grid's) and write it into ``run_dir``
    after the grid and model files; the seconds it took, ``None`` for a model without a joint Vecchia posterior or
    a grid of more than :data:`MAX_CELLS` cells."""
    if not _has_joint_factor(model) or grid is None or not 0 < len(grid) <= MAX_CELLS:
        return None
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    joint = model.joint_s(_inputs(model, grid, quarter))
    tensors = joint.tensors()
    tensors["cell_id"] = torch.from_numpy(np.array(grid["cell_id"].to_numpy(dtype=np.int64)))
    rundir.write_joint(run_dir, tensors, {**_identity(run_dir, quarter), "cells": int(len(grid))})
    return time.perf_counter() - t0


def prime(run_dir, model, grid: pd.DataFrame, quarter: str | None = None) -> bool:
    """Put the run's stored grid factor into ``model`` (its joint posterior at ``grid``'s cells, in ``grid``'s row
    order; a run with time as an input: at ``quarter``) when it was built from this run's grid and model at that
    quarter; whether it did. A damaged file warns and is ignored."""
    if not _has_joint_factor(model) or grid is None or not len(grid):
        return False
    run_dir = Path(run_dir)
    try:
        stored = rundir.read_joint(run_dir)
    except RunError as e:
        warnings.warn(f"{e}; the grid's joint factor is built on demand", stacklevel=2)
        return False
    if stored is None:
        return False
    tensors, identity = stored
    if identity != {**_identity(run_dir, quarter), "cells": int(len(grid))}:
        return False  # another grid, model or quarter (the run was rewritten; a time run's other quarter)
    from gpcore.models.vecchia_joint import VecchiaJoint

    try:
        ids = tensors.pop("cell_id", None)
        if ids is None or ids.dtype != torch.int64 or ids.shape != (len(grid),):
            raise ValueError("'cell_id' is missing or is not one int64 per grid cell")
        perm = pd.Index(ids.numpy()).get_indexer(grid["cell_id"].to_numpy(dtype=np.int64))
        if (perm < 0).any() or len(np.unique(perm)) != len(perm):
            raise ValueError("its 'cell_id' are not the grid's cells")
        joint = VecchiaJoint.from_tensors(tensors, len(grid)).reindexed(perm)
    except ValueError as e:
        warnings.warn(f"run '{run_dir.name}': {rundir.JOINT} is damaged ({e}); the grid's joint factor is built on "
                      "demand", stacklevel=2)
        return False
    model.keep_joint(_inputs(model, grid, quarter), joint)
    return True
