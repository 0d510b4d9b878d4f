"""app.modelinfo: what a run's training decided, in the words the Train page and the Maps header show."""

from __future__ import annotations

from app.modelinfo import training_note


def _manifest(**check):
    return {"train_info": {"feature_check": {"residual_only": 0.6714, "with_features": 0.6716, **check}}}


def test_kept_features_need_no_note():
    assert training_note(_manifest(kept=True)) == ""
    assert training_note({"train_info": {}}) == ""


def test_dropped_features_say_both_nlls():
    note = training_note(_manifest(kept=False, hybrid_fitted=True))
    assert "were dropped" in note and "0.6714 without them, 0.6716 with them)" in note


def test_a_screened_check_says_where_the_features_were_tried():
    """The screen skipped the full hybrid: the NLL 'with them' is at the residual GP's fitted shape."""
    note = training_note(_manifest(kept=False, hybrid_fitted=False))
    assert "0.6716 with them at the residual GP's fitted covariance shape)" in note


def test_a_gain_inside_the_screens_standard_error_says_so():
    """The screen's gate dropped features that validated a little better at the residual's shape: the note gives the
    gain and the standard error it did not beat (with the run's screen_se), not a 'threshold' the gain exceeds."""
    screen = {"a": 1.3, "gain_se": 0.0123}
    m = _manifest(kept=False, hybrid_fitted=False, residual_only=0.6876, with_features=0.6784, screen=screen)
    note = training_note(m)
    assert "lowered the validation NLL by 0.0092, not more than 1 standard error(s) of the validation rows " \
           "(0.0123)" in note
    assert "(0.6876 without them, 0.6784 with them)" in note
    m["config"] = {"settings": {"screen_se": 2.0}}
    assert "not more than 2 standard error(s)" in training_note(m)


def test_a_screen_that_gave_the_features_no_weight_says_so():
    screen = {"a": 0.0, "gain_se": 0.001}
    note = training_note(_manifest(kept=False, hybrid_fitted=False, screen=screen))
    assert "the best weight of the features was 0 (0.6714 without them, 0.6716 with the residual GP rescaled)" in note


def test_a_cross_validated_scale_is_said_after_the_feature_note():
    cv = {"folds": "blocks", "k": 10, "rows": 23792, "coverage_before": 0.9641, "coverage_after": 0.9500,
          "scale": 0.7234, "block_km": 10.0}
    note = training_note({"train_info": {"cv_calibration": cv}})
    assert note == ("the latent variance is scaled by 0.723, from 10-fold cross-validation over 10 km blocks of the "
                    "23,792 rows the model conditions on (as fitted the 95 % intervals covered 96.4 % of the held-out "
                    "rows, scaled 95.0 %).")
    m = _manifest(kept=False, hybrid_fitted=True)
    m["train_info"]["cv_calibration"] = {**cv, "folds": "rows"}
    both = training_note(m)
    assert both.startswith("the DBK features were dropped")
    assert "Vecchia) GP. The latent variance is scaled by 0.723, from 10-fold cross-validation over the 23,792 rows" \
        in both
    assert training_note({"train_info": {"cv_calibration": {"folds": "rows"}}}) == ""  # no scale: nothing to say
    assert training_note({"train_info": {"cv_calibration": {**cv, "rows": 0, "scale": 1.0}}}) == ""  # nothing held out
    for bad in ("0.72", True, float("nan"), None):  # a malformed scale says nothing, as the model ignores it
        assert training_note({"train_info": {"cv_calibration": {**cv, "scale": bad}}}) == ""


def test_a_skewed_noise_is_said_with_the_scale():
    shape = {"latent_scale": 0.7234, "c1": 1.35, "c2": 0.001, "pi": 0.3, "offset": 0.83}
    cv = {"folds": "rows", "k": 10, "rows": 1000, "scale": 0.7234, "noise_shape": shape}
    note = training_note({"train_info": {"cv_calibration": cv}})
    assert note.endswith("rows the model conditions on; a new measurement's noise is skewed: 30 % of measurements lie "
                         "about 0.83 noise SDs above the map with almost no noise of their own, the rest about "
                         "0.36 below it with 1.4× (docs/calibration.md).")
    slow = training_note({"train_info": {"cv_calibration": {**cv, "noise_shape": {**shape, "offset": -3.5,
                                                                                   "c2": 3.4}}}})
    assert "3.5 noise SDs below the map with 3.4× the noise variance" in slow
    broken = training_note({"train_info": {"cv_calibration": {**cv, "noise_shape": {**shape, "pi": "x"}}}})
    assert "skewed" not in broken and "scaled by 0.723" in broken


def test_noise_scales_per_tests_count_are_said_last():
    shape = {"latent_scale": 0.7234, "c1": 1.35, "c2": 0.001, "pi": 0.3, "offset": 0.83}
    cv = {"folds": "rows", "k": 10, "rows": 1000, "scale": 0.7234, "noise_shape": shape,
          "count_scales": {"bins": ["1", "2-4", "5-16", ">16"], "scales": [0.874, 1.106, 1.024, 1.057],
                           "rows": [400, 300, 200, 100]}}
    note = training_note({"train_info": {"cv_calibration": cv}})
    assert note.endswith("0.36 below it with 1.4×; the noise variance is scaled per tests count (1 / 2-4 / 5-16 / "
                         ">16: 0.87 / 1.11 / 1.02 / 1.06×) so that each count's held-out rows are covered 95 % "
                         "(docs/calibration.md).")
    for bad in ([1.0, 2.0], [1.0, "x", 1.0, 1.0], [1.0, 0.0, 1.0, 1.0], None, [1.0, float("inf"), 1.0, 1.0]):
        broken = training_note({"train_info": {"cv_calibration": {**cv, "count_scales": {"scales": bad}}}})
        assert "per tests count" not in broken and "skewed" in broken
