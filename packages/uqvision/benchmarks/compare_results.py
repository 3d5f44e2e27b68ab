"""Compare two result trees netCDF by netCDF: are the data variables equal?

Used to check that a refactoring moved code without changing what it computes: run the
``uqvision reproduce`` drivers and ``uqvision demo`` at smoke scale before and after, into
``BEFORE/<name>/`` and ``AFTER/<name>/``, then::

    python packages/uqvision/benchmarks/compare_results.py /tmp/before /tmp/after

Every ``*.nc`` file under either root is opened with xarray (``decode_times=False``; the file's
attrs, which hold paths and timings, are not compared); for each file the script checks that
both trees have it, the same data variables and coordinates, the same shapes, and equal
values (NaN equal to NaN; ``--atol``/``--rtol`` allow a tolerance, default exact). It prints one
Markdown row per file and, for a file that differs, the differing variables with max |Δ|.
Exit status 0 when every file matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import xarray as xr


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over the entries where not both are NaN (inf when one side only is NaN)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) ^ np.isnan(b)
    if one_nan.any():
        return float("inf")
    d = np.abs(np.where(both_nan, 0.0, a - b))
    return float(d.max()) if d.size else 0.0


def compare_variable(a: xr.DataArray, b: xr.DataArray, atol: float, rtol: float) -> str | None:
    """None when equal, else a short description of the difference."""
    if a.dims != b.dims or a.shape != b.shape:
        return f"dims/shape {a.dims}{a.shape} vs {b.dims}{b.shape}"
    va, vb = a.values, b.values
    if np.issubdtype(va.dtype, np.number) and np.issubdtype(vb.dtype, np.number):
        if va.dtype.kind in "iub" and vb.dtype.kind in "iub" and atol == rtol == 0:
            return None if np.array_equal(va, vb) else \
                f"max |Δ| = {_max_abs_diff(va, vb):.3g}"
        if np.allclose(va, vb, atol=atol, rtol=rtol, equal_nan=True) and (
                atol or rtol or np.array_equal(va, vb, equal_nan=True)):
            return None
        return f"max |Δ| = {_max_abs_diff(va, vb):.3g}"
    same = np.array_equal(va.astype(str), vb.astype(str))
    return None if same else f"{int((va.astype(str) != vb.astype(str)).sum())} entries differ"


def compare_file(before: Path, after: Path, atol: float, rtol: float) -> tuple[int, list[str]]:
    """(number of variables compared, problems) of one pair of netCDF files."""
    problems = []
    with xr.open_dataset(before, decode_times=False) as a, \
            xr.open_dataset(after, decode_times=False) as b:
        names_a, names_b = set(a.data_vars), set(b.data_vars)
        for n in sorted(names_a - names_b):
            problems.append(f"{n}: only before")
        for n in sorted(names_b - names_a):
            problems.append(f"{n}: only after")
        coords_a, coords_b = set(a.coords), set(b.coords)
        for n in sorted(coords_a ^ coords_b):
            problems.append(f"coord {n}: only {'before' if n in coords_a else 'after'}")
        for n in sorted(names_a & names_b):
            why = compare_variable(a[n], b[n], atol, rtol)
            if why:
                problems.append(f"{n}: {why}")
        for n in sorted(coords_a & coords_b):
            why = compare_variable(a[n], b[n], atol, rtol)
            if why:
                problems.append(f"coord {n}: {why}")
        return len(names_a & names_b), problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--atol", type=float, default=0.0)
    ap.add_argument("--rtol", type=float, default=0.0)
    a = ap.parse_args(argv)
    rel = sorted({p.relative_to(a.before) for p in a.before.rglob("*.nc")}
                 | {p.relative_to(a.after) for p in a.after.rglob("*.nc")})
    if not rel:
        print(f"no .nc file under {a.before} or {a.after}")
        return 1
    failed = 0
    per_run: dict[str, list[int]] = {}
    print("| file | data variables | result |")
    print("|---|---:|---|")
    for r in rel:
        b, f = a.before / r, a.after / r
        run = per_run.setdefault(r.parts[0], [0, 0, 0])
        run[0] += 1
        if not (b.exists() and f.exists()):
            print(f"| {r} | – | only {'before' if b.exists() else 'after'} |")
            failed += 1
            run[2] += 1
            continue
        n, problems = compare_file(b, f, a.atol, a.rtol)
        run[1] += n
        if problems:
            failed += 1
            run[2] += 1
            print(f"| {r} | {n} | DIFFERS: {'; '.join(problems)} |")
        else:
            print(f"| {r} | {n} | equal |")
    print()
    print("| run | files | data variables | files differing |")
    print("|---|---:|---:|---:|")
    for name, (files, nvars, bad) in per_run.items():
        print(f"| {name} | {files} | {nvars} | {bad} |")
    print(f"\n{len(rel) - failed} of {len(rel)} files equal")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
