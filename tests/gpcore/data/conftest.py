"""Shared helpers for the data-layer tests: small valid tables in Puerto Rico and file writers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def pr_table(n: int = 30, seed: int = 0) -> pd.DataFrame:
    """n points on the main island of Puerto Rico with a positive target ``mbps`` and weights ``tests``."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "lon": rng.uniform(-66.9, -65.7, n).round(6),
            "lat": rng.uniform(18.05, 18.45, n).round(6),
            "mbps": rng.uniform(5, 200, n).round(3),
            "tests": rng.integers(1, 50, n),
        }
    )


@pytest.fixture
def table() -> pd.DataFrame:
    return pr_table()


@pytest.fixture
def make_table():
    """make_table(n=30, seed=0) -> a fresh valid table (see pr_table)."""
    return pr_table


@pytest.fixture
def write_text(tmp_path):
    """write_text(name, text) -> path of a new file under tmp_path."""

    def _write(name: str, text: str | bytes):
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path

    return _write


@pytest.fixture
def write_csv(tmp_path):
    """write_csv(df, name="data.csv", **to_csv_kwargs) -> path."""

    def _write(df: pd.DataFrame, name: str = "data.csv", **kwargs):
        path = tmp_path / name
        df.to_csv(path, index=False, **kwargs)
        return path

    return _write
