"""Runs: everything about one trained model on one data set, and the folders that hold them.

* :mod:`gpcore.run.config` — :class:`RunConfig`, the validated settings of a run.
* :mod:`gpcore.run.timespan` — the quarters of a run with time as an input, as a form picks them (range, test period).
* :mod:`gpcore.run.rundir` — the run folder's format (the only code that knows its file names): atomic
  writes, the validated manifest ``run.json``, the model, the grid, its cells and the tables.
* :mod:`gpcore.run.dataset` — the data side as the dashboard shows it: a file's columns, a run's data set.
* :mod:`gpcore.run.pipeline` — data → split → fit → metrics → grid, written as one run folder.
* :mod:`gpcore.run.store` — a collection of run folders (the dashboard's list, bundled runs).
* :mod:`gpcore.run.predict` — prediction columns, kernel slices over a grid, and streamed prediction of any
  number of cells (a function of model, source and sink).
* :mod:`gpcore.run.decisions` — exceedance, areas, samples and suggestions over a stored run.
* :mod:`gpcore.run.compare` and :mod:`gpcore.run.sharded` — several runs ranked; runs under torchrun.

Layering (checked by ``tests/gpcore/test_import_graph.py``): config ← rundir ← store ← predict ← pipeline ←
compare, sharded, dataset; decisions sits on store and pipeline. Front ends (``gpcore.cli``, ``app``) sit on
top and never import each other.
"""
