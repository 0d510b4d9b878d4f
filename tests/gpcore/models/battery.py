"""The shared battery every model class must pass (STYLE.md habit 6).

A model's test file subclasses :class:`ModelBattery` and sets ``name`` (registry name) and
``settings`` (small, fast settings). Everything runs in float64 on the CPU on a tiny problem.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpcore import ConfigError, InputError, load_model, make_model


def toy_data(n=120, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 5.0, size=(n, d))  # deliberately not in [-1, 1]: the model scales inputs
    f = np.sin(X[:, 0]) + 0.3 * np.cos(2 * X[:, -1])
    y = 10.0 + 2.0 * f + 0.2 * rng.normal(size=n)  # deliberately not standardised
    return X, y


class ModelBattery:
    name: str = ""
    settings: dict = {}

    def make(self, **extra):
        return make_model(self.name, **{"dtype": "float64", "device": "cpu", "seed": 0, **self.settings, **extra})

    @pytest.fixture(scope="class")
    @classmethod
    def data(cls):
        X, y = toy_data()
        return X[:80], y[:80], X[80:100], y[80:100], X[100:], y[100:]

    @pytest.fixture(scope="class")
    @classmethod
    def fitted(cls, data):
        Xtr, ytr, Xv, yv, _, _ = data
        return cls.make(cls).fit(Xtr, ytr, Xv, yv)

    def test_shapes_and_dtypes(self, fitted, data):
        Xte = data[4]
        pred = fitted.predict(Xte)
        for arr in (pred.mean, pred.var_f, pred.var_y):
            assert arr.shape == (Xte.shape[0],)
            assert arr.dtype == np.float64
            assert np.isfinite(arr).all()
        assert (pred.var_f >= 0).all()
        assert (pred.var_y > pred.var_f).all()
        lo, hi = pred.interval(0.95)
        np.testing.assert_allclose(hi - lo, 2 * 1.959963984540054 * np.sqrt(pred.var_y), rtol=1e-9)
        assert fitted.noise_variance > 0
        K = fitted.kernel(Xte[:7], Xte[:5])
        assert K.shape == (7, 5)

    def test_predictive_variance_scores_like_the_trainer(self, fitted, data):
        """Independent oracle for ``var_y``: the trainer scored the restored best epoch on the validation
        split through its own path (``predict_scaled`` + ``_noise_s`` in standardised units, plus
        ``log y_std``); the Gaussian NLL of ``predict``'s mean and ``var_y`` in caller units must equal it."""
        _, _, Xv, yv, _, _ = data
        pred = fitted.predict(Xv)
        nll = np.mean(0.5 * np.log(2 * np.pi * pred.var_y) + (yv - pred.mean) ** 2 / (2 * pred.var_y))
        assert nll == pytest.approx(fitted.train_info_["best_val_nll"], rel=1e-8, abs=1e-10)

    def test_weight_decay_only_on_the_backbone(self, fitted):
        """docs/methods/dbk.md §2.11, erratum D5: AdamW decays the backbone (input projection, residual blocks, norms)
        and nothing else: kernel, inducing, variational, noise and mean parameters have no decay."""
        from gpcore.models.training import Performance, _make_optimizer

        mod = fitted.module_
        backbone = getattr(mod, "backbone", None)
        expected = {id(p) for p in backbone.parameters()} if backbone is not None else set()
        if self.name in ("dbk", "dbk-silu", "dbk-rbf", "dbk-mml", "sv-dkl", "pp-dkl"):
            assert expected  # the deep models have a backbone to decay
        cfg = fitted.config.replace(weight_decay=0.125)
        opt = _make_optimizer(fitted, cfg, Performance())
        if getattr(cfg, "optimizer", "adam") == "lbfgs":  # full-batch L-BFGS: no weight decay at all
            expected = set()
        decayed = {id(p) for g in opt.param_groups if g.get("weight_decay", 0.0) != 0.0 for p in g["params"]}
        assert decayed == expected
        trainable = [id(p) for p in mod.parameters() if p.requires_grad]
        in_groups = [id(p) for g in opt.param_groups for p in g["params"]]
        assert sorted(in_groups) == sorted(trainable)  # every trainable parameter exactly once
        assert all(g["weight_decay"] == 0.125 for g in opt.param_groups if g.get("weight_decay", 0.0) != 0.0)

    def test_predictions_in_caller_units(self, fitted, data):
        _, ytr, _, _, Xte, yte = data
        pred = fitted.predict(Xte)
        # the targets are around 10 with sd ~ 1.5: predictions must be in those units
        assert abs(np.mean(pred.mean) - np.mean(ytr)) < 2.0

    def test_batching_does_not_change_predictions(self, fitted, data):
        Xte = data[4]
        a = fitted.predict(Xte)
        b = fitted.predict(Xte, batch_size=3)
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(a.var_y, b.var_y, rtol=1e-9, atol=1e-9)

    def test_seed_reproduces(self, fitted, data):
        Xtr, ytr, Xv, yv, Xte, _ = data
        again = self.make().fit(Xtr, ytr, Xv, yv)
        np.testing.assert_allclose(again.predict(Xte).mean, fitted.predict(Xte).mean, rtol=1e-8, atol=1e-8)

    def test_save_load_round_trip(self, fitted, data, tmp_path):
        Xte = data[4]
        path = fitted.save(tmp_path / "model")
        files = sorted(p.name for p in path.iterdir())
        assert files == ["model.json", "model.safetensors"]
        loaded = load_model(path)
        a, b = fitted.predict(Xte), loaded.predict(Xte)
        # identical up to BLAS summation order (memory layout of reloaded tensors)
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(a.var_y, b.var_y, rtol=1e-12, atol=1e-13)
        assert loaded.noise_variance == fitted.noise_variance
        assert loaded.config == fitted.config
        # index buffers travel as int16 / int32 (smaller files) and come back with the module's own dtypes
        from safetensors.torch import load_file

        own = fitted.module_.state_dict()
        saved = load_file(str(path / "model.safetensors"))
        assert {k: v.dtype for k, v in loaded.module_.state_dict().items()} == {k: v.dtype for k, v in own.items()}
        for k, v in own.items():
            narrow = torch.int16 if v.numel() and -(2**15) <= int(v.min()) and int(v.max()) < 2**15 else torch.int32
            assert saved[k].dtype == (narrow if v.dtype == torch.int64 else v.dtype), k
            assert torch.equal(saved[k].to(v.dtype), v.cpu()), k

    def test_kernel_slice_matches_kernel(self, fitted, data):
        Xte = data[4]
        K = fitted.kernel(Xte, Xte)
        for j in (0, 7):
            np.testing.assert_allclose(fitted.kernel_slice(Xte, Xte[j]), K[:, j], rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(fitted.kernel_diag(Xte), np.diag(K), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(K, K.T, rtol=1e-8, atol=1e-10)
        assert np.linalg.eigvalsh(K).min() > -1e-8 * np.abs(K).max()

    def test_callback_cancel_keeps_a_model(self, data):
        Xtr, ytr, Xv, yv, Xte, _ = data
        seen = []

        def cb(progress):
            seen.append(progress)
            return False

        model = self.make().fit(Xtr, ytr, Xv, yv, callback=cb)
        assert len(seen) == 1 and model.train_info_["cancelled"]
        assert seen[0].epoch == 1 and np.isfinite(seen[0].loss) and seen[0].val_nll is not None
        assert np.isfinite(model.predict(Xte).mean).all()

    def test_bad_input_errors(self, fitted, data):
        Xtr, ytr = data[0], data[1]
        bad = Xtr.copy()
        bad[3, 1] = np.nan
        with pytest.raises(InputError, match="NaN"):
            self.make().fit(bad, ytr)
        with pytest.raises(InputError, match="must match"):
            self.make().fit(Xtr, ytr[:-1])
        with pytest.raises(InputError, match="at least 2"):
            self.make().fit(Xtr[:1], ytr[:1])
        with pytest.raises(InputError, match="numeric"):
            self.make().fit([["a", "b"]] * 5, ytr[:5])
        with pytest.raises(InputError, match="column"):
            fitted.predict(np.zeros((3, Xtr.shape[1] + 1)))

    def test_bad_settings_errors(self):
        with pytest.raises(ConfigError, match="unknown setting"):
            self.make(not_a_setting=1)
        with pytest.raises(ConfigError, match="epochs"):
            self.make(epochs=0)
        with pytest.raises(ConfigError, match="allowed values"):
            self.make(device="tpu")
