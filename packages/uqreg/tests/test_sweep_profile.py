"""benchmarks/sweep_profile.py, which says where a sweep's time went (gpu_check's paper_e1
item runs it): it reads every complete cell's per-method seconds and fits each method's seconds
against complexity."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics.runs.testing.scripts import load_script

from uqreg.engine import TrainConfig
from uqreg.study import StudyConfig
from uqreg.sweep import run_study_sweep

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep_profile.py"


def _script():
    return load_script(SCRIPT)


def test_the_profile_sums_the_cells_seconds_and_names_the_slowest(tmp_path, capsys, scheduler):
    study = StudyConfig(task="sinusoid", complexities=(1, 2), methods=("blr", "bd"), repetitions=2,
                        train=TrainConfig(members=2, epochs=4, mc_samples=3, dtype="float32"))
    run_study_sweep(study, tmp_path, chunk_repetitions=2, scheduler=scheduler, progress=False)
    cells = sorted((tmp_path / "cells").glob("*.nc"))
    assert len(cells) == 4
    seconds = {}
    for path in cells:
        with xr.open_dataset(path) as ds:
            seconds.update({(path.name, m): s for m, s in json.loads(ds.attrs["wall_time_s"]).items()})
    profile = _script()
    records = profile.cell_times(tmp_path / "cells")
    assert {(r["file"], r["method"]): r["seconds"] for r in records} == seconds
    assert {r["complexity"] for r in records} == {1, 2}
    assert profile.main([str(tmp_path / "cells"), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    slowest = max(seconds, key=seconds.get)
    assert out[2] == f"DETAIL slowest {slowest[0]} {slowest[1]} {seconds[slowest]:.2f}"
    assert out[-1].startswith(f"RESULT cells_total_s={sum(seconds.values()):.1f} ")
    assert out[-1].endswith(" cells=4")


def test_each_methods_line_through_its_cells_is_recovered():
    # seconds = fixed + per_level·c exactly: the fit gives both back; one complexity: the mean
    records = [{"file": f"{m}{c}", "method": m, "complexity": c, "seconds": fixed + slope * c}
               for m, fixed, slope in (("ens", 2.0, 3.0), ("bd", 0.5, 0.25)) for c in range(1, 11)]
    records += [{"file": "blr", "method": "blr", "complexity": 3, "seconds": 0.1}]
    fits = _script().fit_methods(records)
    assert list(fits) == ["ens", "bd", "blr"]  # by total, largest first
    assert fits["ens"]["fixed_s"] == pytest.approx(2.0) and fits["ens"]["per_level_s"] == pytest.approx(3.0)
    assert fits["bd"]["cells"] == 10 and fits["bd"]["total_s"] == pytest.approx(10 * 0.5 + 0.25 * 55)
    assert fits["blr"]["fixed_s"] == pytest.approx(0.1) and np.isnan(fits["blr"]["per_level_s"])


def test_a_folder_without_complete_cells_is_named(tmp_path):
    xr.Dataset(attrs={"complete": "0"}).to_netcdf(tmp_path / "half.nc")
    with pytest.raises(ValueError, match=re.escape(f"cells_dir '{tmp_path}': no complete cell file")):
        _script().cell_times(tmp_path)
