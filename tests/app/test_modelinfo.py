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
