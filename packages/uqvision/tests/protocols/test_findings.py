"""One home for what the protocols share (issue 39, item 3): the findings of shift, ood and
conformal are one :class:`~uqvision.protocols.findings.Finding` vocabulary, made by one
constructor with the ``untestable`` rule and written by one table; the protocols' scoring and
figure wiring come from :mod:`uqvision.protocols.base`."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from uqvision.protocols import VISION_PROTOCOLS, base
from uqvision.protocols.conformal.findings import ConformalFinding
from uqvision.protocols.findings import (
    ALPHA,
    Finding,
    findings_table,
    mean_or_nan,
    sign_finding,
    sign_verdict,
)
from uqvision.protocols.ood.findings import OodFinding
from uqvision.protocols.shift.findings import ShiftFinding


def test_the_protocols_findings_are_one_vocabulary():
    assert ShiftFinding is OodFinding is ConformalFinding is Finding
    assert [f.name for f in Finding.__dataclass_fields__.values()] == [
        "claim", "subject", "condition", "statistic", "before", "after", "k", "n", "p_value",
        "verdict"]
    assert base.sign_verdict is sign_verdict and base.findings_table is findings_table


def test_a_claim_over_too_few_cells_is_untestable_by_the_protocols_rule():
    four, five = np.ones(4, bool), np.ones(5, bool)  # 1/16 >= ALPHA > 1/32
    assert sign_finding("c", "s", "none", "x", 1, 2, four).verdict == "untestable (n = 4)"
    assert sign_finding("c", "s", "none", "x", 1, 2, five).verdict == "reproduced"
    assert sign_finding("c", "s", "", "x", 1, 2, four,
                        untestable="untestable with {n} sets").verdict == "untestable with 4 sets"
    kept = sign_finding("c", "s", "", "x", 1, 2, four, untestable=None)
    assert (kept.k, kept.n, kept.verdict) == (4, 4, "not reproduced")
    assert np.isnan(sign_finding("c", "s", "", "x", 1, 2, []).p_value)  # no cell: no rule
    assert ALPHA == 0.05 and np.isnan(mean_or_nan([])) and mean_or_nan([1, 2]) == 1.5


def test_the_table_names_a_field_by_the_protocols_header():
    row = Finding("c", "net", "temperature", "cells", 0.5, 0.25, 5, 5, 0.03125, "reproduced")
    text = findings_table([row], ("claim", ("subject", "predictor"),
                                  ("condition", "calibration"), "statistic"), ALPHA)
    assert text.splitlines()[2:] == [
        "| claim | predictor | calibration | statistic | before | after | k / n | p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
        "| c | net | temperature | cells | 0.5000 | 0.2500 | 5 / 5 | 0.031 | reproduced |"]


@pytest.mark.parametrize("name", ["shift", "ood", "conformal"])
def test_a_folder_protocol_is_wired_from_its_folder(name):
    proto = VISION_PROTOCOLS.lookup(name)
    assert proto.name == proto.score_name == name
    assert proto.reproduce.module == f"uqvision.protocols.{name}.reproduce"
    assert proto.score.__doc__ and proto.rescore is not None and proto.plots is not None
    parser = argparse.ArgumentParser()
    proto.add_options(parser)  # the config imported on use: its options
    assert "--ensemble" in parser.format_help()


def test_fraction_options_say_what_they_always_said():
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--x", type=base.fraction)
    with pytest.raises(argparse.ArgumentError, match="invalid _fraction value: 'abc'"):
        parser.parse_args(["--x", "abc"])
    with pytest.raises(argparse.ArgumentError, match=r"must be a fraction in \(0, 1\), got '2'"):
        parser.parse_args(["--x", "2"])
