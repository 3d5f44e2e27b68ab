"""Where a study sweep's time went, from its cell files (run: ``python
packages/uqreg/benchmarks/sweep_profile.py OUT/cells``; ``benchmarks/gpu_check.sh`` runs it after
``paper_e1``).

Every cell file records the seconds each of its methods took (attr ``wall_time_s``: training,
prediction and intervals, and on CUDA the engine's first measurement of a plan for a shape class
it had not seen). A method's cells differ in complexity ``c``, and the paper's recipe trains for
``300·c`` epochs, so its cells' seconds against ``c`` are, to a good approximation, a line: the
intercept is what a cell costs whatever its epochs (building the networks, the MC passes and
predictions, a plan's measurement), the slope what one more level of complexity's epochs cost.
The script fits that line per method by least squares and prints:

* ``DETAIL method=<m> cells=<n> total_s=<s> fixed_s=<intercept> per_level_s=<slope>``, the
  methods by total, slowest first;
* ``DETAIL slowest <cell file> <method> <s>``, the ``--top`` slowest cells;
* ``RESULT cells_total_s=<sum over cells> cells_fixed_s=<sum of every cell's intercept>
  cells=<n>``: the share of the sweep's time that more epochs per second would not remove.

The sweep's wall time minus ``cells_total_s`` (on one worker) is what the sweep spent outside
the cells: starting workers, writing files, combining the study.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import xarray as xr


def cell_times(cells_dir: str | Path) -> list[dict]:
    """One record per (cell file, method): ``file``, ``method``, ``complexity``, ``seconds``.

    Parameters
    ----------
    cells_dir : path
        A sweep's ``cells/`` folder; files not complete (attr ``complete`` not ``"1"``) are
        passed over, as the sweep would recompute them.

    Raises
    ------
    ValueError
        No complete cell file in ``cells_dir``, naming it.
    """
    records = []
    for path in sorted(Path(cells_dir).glob("*.nc")):
        with xr.open_dataset(path) as ds:
            if str(ds.attrs.get("complete", "")) != "1":
                continue
            wall = json.loads(ds.attrs.get("wall_time_s", "{}"))
            complexity = int(ds["complexity"].values.ravel()[0])
        records += [{"file": path.name, "method": m, "complexity": complexity, "seconds": float(s)}
                    for m, s in wall.items()]
    if not records:
        raise ValueError(f"cells_dir {str(cells_dir)!r}: no complete cell file (*.nc) there")
    return records


def fit_methods(records: list[dict]) -> dict[str, dict]:
    """Per method: ``cells``, ``total_s``, and the least-squares line of seconds against
    complexity, ``fixed_s`` (intercept) and ``per_level_s`` (slope); with one complexity only,
    the slope is NaN and the intercept the mean. Methods ordered by ``total_s``, largest first."""
    out = {}
    for method in sorted({r["method"] for r in records}):
        mine = [r for r in records if r["method"] == method]
        c = np.array([r["complexity"] for r in mine], float)
        s = np.array([r["seconds"] for r in mine], float)
        if np.unique(c).size > 1:
            slope, intercept = np.polyfit(c, s, 1)
        else:
            slope, intercept = np.nan, float(s.mean())
        out[method] = {"cells": len(mine), "total_s": float(s.sum()), "fixed_s": float(intercept),
                       "per_level_s": float(slope)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["total_s"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells_dir", help="a sweep's cells/ folder")
    ap.add_argument("--top", type=int, default=5, help="how many of the slowest cells to name")
    args = ap.parse_args(argv)
    records = cell_times(args.cells_dir)
    methods = fit_methods(records)
    for method, f in methods.items():
        print(f"DETAIL method={method} cells={f['cells']} total_s={f['total_s']:.2f} "
              f"fixed_s={f['fixed_s']:.3f} per_level_s={f['per_level_s']:.3f}")
    for r in sorted(records, key=lambda r: -r["seconds"])[:args.top]:
        print(f"DETAIL slowest {r['file']} {r['method']} {r['seconds']:.2f}")
    fixed = sum(f["fixed_s"] * f["cells"] for f in methods.values())
    print(f"RESULT cells_total_s={sum(r['seconds'] for r in records):.1f} cells_fixed_s={fixed:.1f} "
          f"cells={len({r['file'] for r in records})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
