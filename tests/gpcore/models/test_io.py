"""Saved model files: integer index buffers are stored narrow and come back as the module's dtype."""

from __future__ import annotations

import torch

from gpcore.models.io import _compact


def test_index_tensors_are_saved_in_the_narrowest_integer_type_that_holds_them():
    assert _compact(torch.tensor([-1, 32767])).dtype == torch.int16
    assert _compact(torch.tensor([-32769, 5])).dtype == torch.int32
    assert _compact(torch.tensor([-1, 32768])).dtype == torch.int32
    assert _compact(torch.tensor([0, 2**31])).dtype == torch.int64  # too wide for int32: kept
    assert _compact(torch.tensor([0.5, 2.0**40])).dtype == torch.float32  # floats untouched
    assert _compact(torch.zeros(0, dtype=torch.int64)).dtype == torch.int64
    big = torch.arange(-1, 70_000)
    assert torch.equal(_compact(big).to(torch.int64), big)


def test_saved_files_follow_the_umask_like_the_json(tmp_path):
    """``model.safetensors`` is readable wherever ``model.json`` is (safetensors' save_file would make it 0600, so a
    dashboard running as another user could not load a run the CLI wrote), and it loads back."""
    import os

    import numpy as np

    from gpcore import load_model, make_model

    rng = np.random.default_rng(0)
    X = rng.uniform(0, 1, (60, 2))
    model = make_model("vecchia", epochs=1, neighbors=5).fit(X, np.sin(3 * X[:, 0]))
    old = os.umask(0o022)
    try:
        path = model.save(tmp_path / "m")
    finally:
        os.umask(old)
    modes = {f.name: f.stat().st_mode & 0o777 for f in path.iterdir()}
    assert modes == {"model.json": 0o644, "model.safetensors": 0o644}
    np.testing.assert_allclose(load_model(path).predict(X[:5]).mean, model.predict(X[:5]).mean)
