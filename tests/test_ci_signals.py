"""CI does not depend on how it is started (issue 36). A shell starts a background job
(``.ci/run &``) or a ``nohup`` command with ``SIGINT`` ignored, every process started from it
inherits that, and Python then installs no ``KeyboardInterrupt`` handler: the Ctrl-C tests used
to fail there. Every test that interrupts a process now sets that process's ``SIGINT``
disposition itself (:mod:`uqmetrics.runs.testing.signals`); here, one test of each kind runs in a
pytest started with ``SIGINT`` ignored and must pass."""

from __future__ import annotations

import doctest
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import uqmetrics.runs.testing.signals
from uqmetrics.runs.testing.signals import interruptible, sigint_ignored, sigint_raises

REPO = Path(__file__).resolve().parents[1]

#: One Ctrl-C test of each kind: one signals a process it starts (``interruptible``), the other
#: signals its own process (``sigint_raises``).
CTRL_C_TESTS = [
    "shared/tests/test_sweep.py::test_ctrl_c_stops_a_local_cluster_without_a_line_from_dask",
    ("packages/uqvision/tests/data/test_data_corruptions.py::"
     "test_a_dask_generation_interrupted_by_ctrl_c_resumes_byte_identical"),
]


def _sigint_in(cmd: list[str]) -> str:
    code = "import signal; print(signal.getsignal(signal.SIGINT))"
    return subprocess.run([*cmd, sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_the_launchers_set_sigint_and_the_handler_is_put_back():
    assert _sigint_in(sigint_ignored([])) == str(signal.SIG_IGN)
    assert _sigint_in(sigint_ignored(interruptible([]))) == str(signal.default_int_handler)
    before = signal.getsignal(signal.SIGINT)
    with sigint_raises():
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is before
    result = doctest.testmod(uqmetrics.runs.testing.signals)
    assert result.attempted and not result.failed


@pytest.mark.slow
@pytest.mark.parametrize("nodeid", CTRL_C_TESTS, ids=["subprocess", "in-process"])
def test_a_ctrl_c_test_passes_when_ci_starts_with_sigint_ignored(nodeid):
    r = subprocess.run(sigint_ignored([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                       "-q", nodeid]),
                       cwd=REPO, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]
