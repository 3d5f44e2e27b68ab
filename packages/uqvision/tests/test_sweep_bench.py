"""bench_sweep.py's measurement helpers (the benchmark itself is timed, so not run here): its
generated images do not depend on the threads making them, and its fixed cost per cell is the
intercept of the line through the small and large folders' times."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from uqmetrics.runs.testing.scripts import load_script

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_sweep.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCH)


def test_jpegs_do_not_depend_on_threads(bench, tmp_path):
    one = bench.make_jpegs(tmp_path / "one", 6, seed=3, threads=1)
    three = bench.make_jpegs(tmp_path / "three", 6, seed=3, threads=3)
    files = sorted(p.relative_to(one) for p in one.rglob("*.jpg"))
    assert len(files) == 6
    assert files == sorted(p.relative_to(three) for p in three.rglob("*.jpg"))
    assert all((one / f).read_bytes() == (three / f).read_bytes() for f in files)
    # a larger folder starts with the same images (image i from its own seed)
    more = bench.make_jpegs(tmp_path / "more", 8, seed=3, threads=2)
    assert all((one / f).read_bytes() == (more / f).read_bytes() for f in files)


def test_fixed_cost_is_the_intercept(bench):
    f, v = bench.fixed_cost(2.0 + 8 * 0.5, 8, 2.0 + 5000 * 0.5, 5000)
    assert f == pytest.approx(2.0) and v == pytest.approx(0.5)
    with pytest.raises(ValueError, match="n_large: 8"):
        bench.fixed_cost(1.0, 8, 2.0, 8)
    assert doctest.testmod(bench).failed == 0
