"""uqmetrics.runs.testing.scripts.load_script: a file outside any package, loaded as a module."""

from __future__ import annotations

import sys

import pytest

from uqmetrics.runs.testing.scripts import load_script


def test_a_script_runs_as_a_fresh_module_each_time(tmp_path):
    script = tmp_path / "bench_thing.py"
    script.write_text("RUNS = []\nRUNS.append(1)\n\ndef twice(x):\n    return 2 * x\n")
    first, second = load_script(script), load_script(script, "_other")
    assert first.twice(4) == 8 and first.twice.__module__ == "_script_bench_thing"
    assert second.__name__ == "_other_bench_thing"
    first.RUNS.append(2)
    assert second.RUNS == [1]  # executed anew, nothing shared
    assert "_script_bench_thing" not in sys.modules


def test_a_missing_script_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_script(tmp_path / "nope.py")
