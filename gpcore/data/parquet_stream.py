"""Lazy reading of large Parquet files: batches of columns, or one process's shard of the rows.

Used where a table need not (or cannot) be held whole: streaming predictions over a big cell table
(:mod:`gpcore.run.predict`) and per-rank shards for distributed training. Memory is one batch
(``iter_batches``) or one shard (``read_shard``), plus pyarrow's buffer of one row group.

>>> import pandas as pd, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "cells.parquet")
>>> pd.DataFrame({"lon": [1.0, 2.0, 3.0], "lat": [4.0, 5.0, 6.0]}).to_parquet(path)
>>> src = ParquetSource(path, ["lon"])
>>> src.num_rows, [b["lon"].tolist() for b in src.iter_batches(2)]
(3, [[1.0, 2.0], [3.0]])

Row groups (the unit Parquet stores and pyarrow reads) are exposed too: :attr:`ParquetSource.row_group_sizes`,
:meth:`ParquetSource.read_row_group`, :func:`shard_row_groups` (whole row groups per rank, contiguous, each
exactly once) and :class:`RowGroupDataset`, a map-style dataset of row groups that
``torch.utils.data.DistributedSampler`` can hand to ranks for streamed epochs. (``DistributedSampler`` pads
with repeated items so that every rank gets as many; use :meth:`ParquetSource.read_shard` or
:func:`shard_row_groups` where every row must count exactly once, as for exact statistics.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from gpcore.errors import DataError


def _column_array(col) -> np.ndarray:
    """A pyarrow array/chunked array as NumPy (numbers as numbers, nulls as NaN/None)."""
    try:
        return col.to_numpy(zero_copy_only=False)
    except TypeError:  # ChunkedArray.to_numpy has no zero_copy_only argument
        return col.to_numpy()


class ParquetSource:
    """A Parquet file read by batches.

    Parameters
    ----------
    path : str or Path
    columns : sequence of str, optional
        Columns to read (default: all).

    Attributes
    ----------
    schema_names : list of str
        Every column of the file.
    num_rows : int
    columns : list of str
        The columns each batch holds.
    """

    def __init__(self, path, columns=None):
        import pyarrow.parquet as pq

        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"file '{self.path}' not found; check the path")
        try:
            self._file = pq.ParquetFile(self.path)
        except Exception as e:  # pyarrow raises several types for non-Parquet content
            raise DataError(f"file '{self.path.name}' is not a readable Parquet file ({e})") from None
        self.schema_names = list(self._file.schema_arrow.names)
        self.num_rows = int(self._file.metadata.num_rows)
        if columns is None:
            self.columns = list(self.schema_names)
        else:
            self.columns = [str(c) for c in columns]
            missing = [c for c in self.columns if c not in self.schema_names]
            if missing:
                raise DataError(
                    f"file '{self.path.name}' has no column(s) {', '.join(missing)}; "
                    f"columns: {', '.join(self.schema_names)}"
                )

    def __len__(self) -> int:
        return self.num_rows

    @property
    def row_group_sizes(self) -> list[int]:
        """Rows in each row group, in file order."""
        meta = self._file.metadata
        return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]

    @property
    def num_row_groups(self) -> int:
        return self._file.metadata.num_row_groups

    def read_row_group(self, i: int) -> dict[str, np.ndarray]:
        """Row group ``i`` as ``{column: array}``."""
        table = self._file.read_row_group(int(i), columns=self.columns)
        return {name: _column_array(table.column(name)) for name in self.columns}

    def iter_batches(self, batch_size: int, row_groups: Sequence[int] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Consecutive batches of at most ``batch_size`` rows: ``{column: array of shape (b,)}``.

        ``row_groups`` restricts the reading to those row groups (in that order).
        """
        if int(batch_size) < 1:
            raise DataError(f"batch_size={batch_size!r} must be a positive integer")
        groups = None if row_groups is None else list(row_groups)
        for batch in self._file.iter_batches(batch_size=int(batch_size), columns=self.columns, row_groups=groups):
            yield {name: _column_array(batch.column(i)) for i, name in enumerate(batch.schema.names)}

    def shard_bounds(self, rank: int, world: int) -> tuple[int, int]:
        """Rows ``[start, stop)`` of shard ``rank`` of ``world`` near-equal contiguous shards."""
        if not (0 <= rank < world):
            raise DataError(f"rank={rank} must lie in [0, world={world})")
        base, extra = divmod(self.num_rows, world)
        start = rank * base + min(rank, extra)
        return start, start + base + (1 if rank < extra else 0)

    def read_shard(self, rank: int, world: int) -> dict[str, np.ndarray]:
        """The rows of shard ``rank`` (see :meth:`shard_bounds`), reading only the row groups that hold them."""
        start, stop = self.shard_bounds(rank, world)
        meta = self._file.metadata
        groups, offset, first = [], 0, None
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if offset + n > start and offset < stop:
                groups.append(g)
                first = offset if first is None else first
            offset += n
        if not groups:
            return {c: np.zeros(0) for c in self.columns}
        table = self._file.read_row_groups(groups, columns=self.columns)
        table = table.slice(start - first, stop - start)
        return {name: _column_array(table.column(name)) for name in self.columns}


def shard_row_groups(sizes: Sequence[int], rank: int, world: int) -> list[int]:
    """Row-group indices of one rank: contiguous runs balanced by rows, each row group exactly once.

    Row group ``i`` goes to the rank whose share of the cumulative row count holds the group's first
    row. With fewer row groups than ranks some ranks get none (write files with more row groups than
    processes: ``pyarrow.parquet.write_table(..., row_group_size=...)``).
    """
    if not (0 <= rank < world):
        raise DataError(f"rank={rank} must lie in [0, world={world})")
    total = int(sum(sizes))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else np.zeros(0, np.int64)
    owner = np.minimum((starts * world) // max(total, 1), world - 1)
    return [i for i in range(len(sizes)) if owner[i] == rank]


class RowGroupDataset:
    """Map-style dataset over a Parquet file's row groups: item ``i`` is row group ``i`` as ``{column: array}``.

    Works with ``torch.utils.data.DistributedSampler`` (it needs ``__len__``)::

        ds = RowGroupDataset("big.parquet", ["lon", "lat", "y"])
        sampler = DistributedSampler(ds, num_replicas=W, rank=r, shuffle=True, seed=0)
        for epoch in range(E):
            sampler.set_epoch(epoch)
            for i in sampler:
                block = ds[i]          # one row group of this rank, read on demand
    """

    def __init__(self, path, columns=None):
        self.source = ParquetSource(path, columns)

    def __len__(self) -> int:
        return self.source.num_row_groups

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.source.read_row_group(int(i))


def write_parquet_in_row_groups(path, columns: dict, row_group_size: int = 65536) -> Path:
    """Write ``{name: array}`` to ``path`` in row groups of ``row_group_size`` rows (tests, benchmarks)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), str(path), row_group_size=int(row_group_size))
    return Path(path)
