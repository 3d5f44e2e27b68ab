"""Findings: a paper's claims, each a one-sided sign test over cells, in one vocabulary for
every protocol that tests claims (shift, ood, conformal).

- :class:`Finding`: one claim tested on one subject (a predictor, a detector, a level), under
  one condition (a calibration, or none), with the two means compared and the test;
- :func:`sign_verdict` and :func:`sign_finding`: the test of the cells' outcomes at
  :data:`ALPHA`, and a finding from them (with the ``untestable`` rule: a claim over too few
  cells for any count to reach the level, ``0.5 ** n >= alpha``);
- :func:`findings_table`: the findings as the markdown table of ``findings.md``;
  :func:`mean_or_nan`: the mean of the cells compared (NaN for none).

Light on import (numpy and scipy are imported on use): :mod:`~uqvision.protocols.base`
re-exports the test and the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ALPHA", "UNTESTABLE", "Finding", "findings_table", "mean_or_nan", "sign_finding",
           "sign_verdict"]

#: The level of the one-sided sign tests: a claim is ``reproduced`` where ``p < ALPHA``.
ALPHA = 0.05
#: The verdict of a claim over too few cells for any count to reach the level (``{n}``: the
#: cells).
UNTESTABLE = "untestable (n = {n})"


@dataclass(frozen=True)
class Finding:
    """One claim tested on one subject.

    Attributes
    ----------
    claim : str
        The claim, in words (each protocol's module names its claims).
    subject : str
        What the claim is about: a predictor (a row of ``model``), a detector, a level or the
        cells' group (``every row (<n>)``, ``severity <s>``).
    condition : str
        The condition it is tested under (the calibration: ``none``, ``temperature``, ...);
        empty where the protocol has none.
    statistic : str
        What was counted, in words.
    before, after : float
        The two means compared (the baseline's, then the subject's), each over the cells with
        both values.
    k, n : int
        Cells where the claim's inequality holds, out of those with both values.
    p_value : float
        One-sided sign test of ``k`` successes in ``n`` at probability 1/2.
    verdict : str
        ``reproduced`` (``p < ALPHA``), ``not reproduced``, or the protocol's ``untestable``
        wording where no count of ``n`` could reach ``ALPHA``.
    """

    claim: str
    subject: str
    condition: str
    statistic: str
    before: float
    after: float
    k: int
    n: int
    p_value: float
    verdict: str


def sign_verdict(wins: Any, alpha: float) -> tuple[int, int, float, str]:
    """The sign test of a claim over cells (:func:`uqmetrics.metrics.stats.sign_test`).

    Parameters
    ----------
    wins : array-like of bool
        One entry per cell with both values compared: whether the claim's inequality holds.
    alpha : float
        The test's level.

    Returns
    -------
    k, n : int
        The cells where the claim holds, out of all.
    p_value : float
        The one-sided sign test's p-value (NaN for no cell).
    verdict : str
        ``reproduced`` where ``p_value < alpha``, else ``not reproduced``.
    """
    import numpy as np
    from uqmetrics.metrics.stats import sign_test  # scipy: imported on use

    wins = np.asarray(wins, bool)
    k, n = int(wins.sum()), int(wins.size)
    p = sign_test(k, n)
    return k, n, p, "reproduced" if p < alpha else "not reproduced"


def sign_finding(claim: str, subject: str, condition: str, statistic: str, before: float,
                 after: float, wins: Any, *, alpha: float = ALPHA,
                 untestable: str | None = UNTESTABLE) -> Finding:
    """A :class:`Finding` from the cells' outcomes (:func:`sign_verdict` at ``alpha``).

    Parameters
    ----------
    claim, subject, condition, statistic : str
        As the finding's.
    before, after : float
        The two means compared.
    wins : array-like of bool
        One entry per cell with both values: whether the claim's inequality holds.
    alpha : float, default ALPHA
        The test's level.
    untestable : str or None, default UNTESTABLE
        The verdict (``{n}``: the cells) where ``0 < n`` and even ``n`` of ``n`` cannot reach
        ``alpha`` (``0.5 ** n >= alpha``: ``n <= 4`` at 0.05); None: no such rule, the
        verdict stays ``not reproduced``.

    Returns
    -------
    Finding
    """
    k, n, p, verdict = sign_verdict(wins, alpha)
    if untestable is not None and 0 < n and 0.5 ** n >= alpha:  # n of n cannot reach alpha
        verdict = untestable.format(n=n)
    return Finding(claim, subject, condition, statistic, float(before), float(after), k, n, p,
                   verdict)


def mean_or_nan(x: Any) -> float:
    """The mean of ``x`` (the cells compared), NaN where there is none."""
    import numpy as np

    x = np.asarray(x, float)
    return float(x.mean()) if x.size else float("nan")


def findings_table(findings: Sequence[Any], columns: Sequence[str | tuple[str, str]],
                   alpha: float) -> str:
    """Findings as a markdown table (one row each), after a line naming the test's level: the
    text of a protocol's ``findings.md``.

    Parameters
    ----------
    findings : sequence
        :class:`Finding` rows (any rows with the attributes ``columns`` and ``before``,
        ``after``, ``k``, ``n``, ``p_value``, ``verdict``).
    columns : sequence of str or (str, str)
        The leading columns, each an attribute written as is (e.g. ``claim``, ``subject``,
        ``statistic``), or ``(attribute, header)`` where the column's header is another word
        (``("subject", "predictor")``); then ``before``, ``after`` (4 decimals), ``k / n``,
        ``p`` (2 significant digits) and ``verdict``.
    alpha : float
        The sign tests' level.

    Returns
    -------
    str
        The note, a blank line, the table; ends with a newline.
    """
    pairs = [(c, c) if isinstance(c, str) else tuple(c) for c in columns]
    head = "| " + " | ".join([*(h for _, h in pairs), "before", "after", "k / n", "p",
                              "verdict"]) + " |"
    note = (f"One-sided sign tests at level {alpha} (the cells share their images: a guide, "
            "not an exact error rate).")
    lines = [note, "", head, "|---" * (len(pairs) + 5) + "|"]
    for f in findings:
        cells = [f"{getattr(f, c)}" for c, _ in pairs]
        cells += [f"{f.before:.4f}", f"{f.after:.4f}", f"{f.k} / {f.n}", f"{f.p_value:.2g}",
                  f"{f.verdict}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
