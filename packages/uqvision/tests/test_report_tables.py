"""Issue 37 §5: every protocol's declared leaderboard (:attr:`Protocol.report`) holds on the
score file of its smoke reproduction: its rows are the declared dims stacked, each declared
headline column is a column of the file (no name silently left out), its mean columns are
derived, and the page's subtitle is the run's (its rows), not the paper's description."""

from __future__ import annotations

import math

import numpy as np
import pytest
from uqmetrics import read_result
from uqmetrics.report import headline_columns, leaderboard
from uqmetrics.report.leaderboard import _matches

from uqvision.cli.report import _hook
from uqvision.protocols import VISION_PROTOCOLS

pytestmark = pytest.mark.slow

#: The headline of the researchers' tables (issue 37 §5).
EXPECTED = {
    "ood": (("model", "detector"), ["near_fpr_at_95_tpr", "near_auroc", "far_fpr_at_95_tpr",
                                    "far_auroc", "id_accuracy"]),
    "shift": (("model",), ["clean_accuracy[calibration=none]", "clean_ece[calibration=none]",
                           "clean_ece[calibration=temperature]", "mean_corruption_error",
                           "relative_mean_corruption_error"]),
    # RAPS's Table 1 as published (issue 38 §2): medians over the trials, Platt per trial
    "conformal": (("model",), ["accuracy_median", "top5_accuracy_median"] + [
        f"{v}_median[method={m},alpha={a},calibration=platt]" for v in ("coverage", "mean_set_size")
        for m in ("topk", "naive", "aps", "raps") for a in ("0.1", "0.05")]),
}


#: The protocols of this package (a plugin's declares its own, or reads generically).
BUILT_IN = [n for n in VISION_PROTOCOLS.names() if n not in getattr(VISION_PROTOCOLS, "plugins",
                                                                     {})]


@pytest.mark.parametrize("name", BUILT_IN)
def test_declared_leaderboard_holds_on_the_smoke_file(name, smoke_run):
    proto = VISION_PROTOCOLS.lookup(name)
    assert proto.report is not None, f"{name} declares no leaderboard"
    out, path = smoke_run(name)
    if path.suffix != ".nc":  # a driver that returns its summary: the score file it wrote
        path = next(p for p in sorted(out.rglob("*.nc"))
                    if "caches" not in p.relative_to(out).parts and not p.name.startswith(".")
                    and read_result(p).attrs.get("protocol") == name)
    board = leaderboard(path, name, _hook(proto))
    table = proto.report
    ds = read_result(path)
    assert (board.dim, *board.keys) == tuple(table.rows)
    assert len(board.rows) == math.prod(ds.sizes[d] for d in table.rows)
    if isinstance(table.headline, tuple) and table.headline:
        for pattern in table.headline:
            assert any(_matches(pattern, c) for c in board.columns), (name, pattern)
    elif not table.headline:
        assert board.headline == headline_columns(board.columns)  # the generic rule
    if name in EXPECTED:
        assert (tuple(table.rows), board.headline) == EXPECTED[name]
    for spec in table.means:
        derived = [k for k in board.extra if k.startswith(spec.split("[")[0] + "[")]
        assert derived and all(np.isfinite(v) for v in board.extra[derived[0]]), spec
    n = ds.sizes[table.rows[0]]
    assert board.subtitle.startswith(f"{n} {table.rows[0]}")
    assert proto.description not in board.subtitle
