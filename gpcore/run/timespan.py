"""The quarters of a run with time as an input: a range of the data's quarters and, for the forecast split, the test
period inside it (docs/methods/spacetime.md).

The command line names such a run with ``--quarter FIRST:LAST --time-input [--split forecast --test-period A:B]``
(docs/cli.md); a form (the dashboard's Train page) picks the same from the quarters its data set holds.
:func:`time_run_fields` checks those picks and returns the :class:`~gpcore.run.config.RunConfig` fields; its errors
name each pick in the caller's words (``names``: a form's labels), so the message points at the control to change.
:func:`check_time_rows` is what :func:`gpcore.run.pipeline.prepare` checks of the rows a time run read, whichever
front end built it.

>>> q = ["2023Q1", "2023Q2", "2023Q3", "2023Q4"]
>>> time_run_fields(q, "2023Q1", "2023Q4", "forecast", *default_test_period(q), period="2023")
{'time_input': True, 'quarter': '2023', 'split': 'forecast', 'test_period': '2023Q4'}
>>> time_run_fields(q, "2023Q2", "2023Q4")["quarter"]
'2023Q2:2023Q4'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gpcore.errors import ConfigError, DataError

#: how :func:`time_run_fields` names each pick in its errors unless the caller says otherwise
NAMES = {"first": "first quarter", "last": "last quarter", "test_from": "first test quarter",
         "test_to": "last test quarter"}

#: at least this many quarters in the range before the forecast test period defaults to a year, not one quarter
YEAR_TEST_FROM = 6


def _index(label: str, what: str) -> int:
    from gpcore.data.temporal import period_bounds

    try:
        lo, hi = period_bounds(label, what)
    except DataError as e:
        raise ConfigError(str(e)) from None
    if lo != hi:
        raise ConfigError(f"{what} {label!r} is not one quarter; choose one like 2023Q1")
    return lo


def _period(first: str, last: str) -> str:
    return first if first == last else f"{first}:{last}"


def default_test_period(quarters: Sequence[str]) -> tuple[str, str]:
    """The forecast test period a form opens with over the range ``quarters`` (sorted labels): its last 4 quarters,
    or only its last one when the range has fewer than :data:`YEAR_TEST_FROM` (so enough is left to train on).

    >>> default_test_period([f"2022Q{i}" for i in range(1, 5)] + ["2023Q1", "2023Q2"])
    ('2022Q3', '2023Q2')
    >>> default_test_period(["2023Q1", "2023Q2", "2023Q3"])
    ('2023Q3', '2023Q3')
    """
    q = list(quarters)
    if not q:
        raise ConfigError("no quarters to test on")
    return (q[-4] if len(q) >= YEAR_TEST_FROM else q[-1]), q[-1]


def time_run_fields(quarters: Sequence[str], first: str, last: str, split: str = "random",
                    test_from: str | None = None, test_to: str | None = None, *, period: str | None = None,
                    names: Mapping[str, str] | None = None) -> dict:
    """The :class:`~gpcore.run.config.RunConfig` fields of a run with time as an input over ``first``..``last``.

    Parameters
    ----------
    quarters : sequence of str
        The quarters the data set holds (``"2023Q1"`` labels, any order).
    first, last : str
        The first and the last quarter of the run (inclusive); the range must hold at least 2 of ``quarters``.
    split : {"random", "block", "forecast"}
        The test split; ``"forecast"`` tests on ``test_from``..``test_to`` and trains on the quarters before it.
    test_from, test_to : str, optional
        The forecast test period: inside ``first``..``last``, with at least one quarter of the data before it.
    period : str, optional
        The period ``quarters`` were read with (the data set's ``RunConfig.quarter``; None: the whole file). When the
        range is every one of ``quarters`` the run reads that period, so it stays on the same data set
        (:mod:`gpcore.identity`); otherwise it reads the range.
    names : mapping, optional
        How the errors name ``first``, ``last``, ``test_from`` and ``test_to`` (default :data:`NAMES`).

    Returns
    -------
    dict
        ``time_input`` (True), ``quarter``, ``split`` and ``test_period`` (None unless forecast).

    Raises
    ------
    ConfigError
        A pick that is not one of ``quarters``, a range that ends before it starts or holds fewer than 2 quarters, a
        test period outside the range or with nothing before it; the message names the pick and the fix.
    """
    from gpcore.data.temporal import quarter_label

    n = {**NAMES, **(names or {})}
    have = sorted({_index(q, "quarter") for q in quarters})
    if len(have) < 2:
        raise ConfigError(f"time as an input needs at least 2 quarters; the data has {len(have)}: load a data set "
                          "(or a period) with more quarters")
    span = f"{quarter_label(have[0])}..{quarter_label(have[-1])}"
    picks = {}
    for key, label in (("first", first), ("last", last)):
        picks[key] = _index(label, n[key])
        if picks[key] not in have:
            raise ConfigError(f"{n[key]} {label} is not a quarter of the data ({span}); choose one of its quarters")
    lo, hi = picks["first"], picks["last"]
    if hi < lo:
        raise ConfigError(f"{n['first']} {first} comes after {n['last']} {last}: choose a {n['first']} on or before "
                          f"the {n['last']}")
    inside = [q for q in have if lo <= q <= hi]
    if len(inside) < 2:
        raise ConfigError(f"time as an input needs at least 2 quarters; {_period(first, last)} holds only "
                          f"{len(inside)}: choose an earlier {n['first']} or a later {n['last']}")
    every = inside == have
    fields = {"time_input": True, "quarter": period if every else _period(first, last),
              "split": split, "test_period": None}
    if split != "forecast":
        return fields
    if test_from is None or test_to is None:
        raise ConfigError(f"the forecast split needs a test period: choose the {n['test_from']} and the "
                          f"{n['test_to']}")
    a, b = _index(test_from, n["test_from"]), _index(test_to, n["test_to"])
    if b < a:
        raise ConfigError(f"{n['test_from']} {test_from} comes after {n['test_to']} {test_to}: choose a "
                          f"{n['test_from']} on or before the {n['test_to']}")
    if a < lo or b > hi:
        raise ConfigError(f"the test period {_period(test_from, test_to)} is not inside the quarters of the run "
                          f"({_period(first, last)}): choose a {n['test_from']} and a {n['test_to']} inside them, or "
                          f"widen the range ({n['first']}, {n['last']})")
    if not any(lo <= q < a for q in have):
        raise ConfigError(f"nothing is left to train on before the test period {_period(test_from, test_to)}: choose "
                          f"a later {n['test_from']} or an earlier {n['first']}")
    fields["test_period"] = _period(test_from, test_to)
    return fields


def check_time_rows(t: np.ndarray | None, time_input: bool, quarter: str | None) -> None:
    """What a run with time as an input needs of the rows it read (``t``: their decimal years): at least 2 quarters.

    Raises
    ------
    DataError
        Naming the quarters read and the fix (``--quarter``, the quarters the run reads).
    """
    if not time_input or t is None:
        return
    from gpcore.data.temporal import quarter_index, quarter_label

    t = np.asarray(t, dtype=float)
    read = np.unique(quarter_index(t[np.isfinite(t)]))
    if len(read) < 2:
        which = quarter_label(read[0]) if len(read) else "none"
        only = "only " if len(read) else ""
        raise DataError(f"time as an input (--time-input) needs rows from at least 2 quarters; the rows read hold "
                        f"{only}{which} (--quarter {quarter or 'default'}): read more quarters, e.g. --quarter "
                        "2022Q1:2023Q4")


def rows_in(t: np.ndarray, first: str, last: str) -> np.ndarray:
    """Boolean mask, shape (n,), of the rows whose decimal year ``t`` falls in the quarters ``first``..``last``.

    >>> rows_in(np.array([2022.875, 2023.125, 2023.625, np.nan]), "2023Q1", "2023Q3").tolist()
    [False, True, True, False]
    """
    from gpcore.data.temporal import quarter_index

    qi = quarter_index(t)
    return (qi >= _index(first, "first quarter")) & (qi <= _index(last, "last quarter"))
