"""``uqreg verify``: a study made by ``uqreg sweep`` records its cells (``caches``) and one entry
per method; verify re-combines the cells and agrees with the file; a cell rewritten with one
prediction changed (self-consistent checksums, not the recorded one) makes its method's entry
disagree, naming the cell; a summary value changed in a study without cells disagrees."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import uqmetrics
from uqmetrics.runs.io import decode_attr

from uqreg import cli

#: Two methods (the closed-form reference and a 2-member ensemble trained 2 epochs), two
#: cells each (repetitions 0-1 and 2-3).
SWEEP = ["sweep", "--task", "sinusoid", "--complexities", "1", "--methods", "blr,ens",
         "--recipes", "paper", "--repetitions", "4", "--chunk-repetitions", "2", "--members", "2",
         "--epochs", "2", "--quiet", "--no-plots"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from dask.distributed import LocalCluster

    out = tmp_path_factory.mktemp("verify") / "sweep"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster:
        assert cli.main([*SWEEP, "--out", str(out), "--scheduler",
                         cluster.scheduler_address]) == 0
    return out / "study.nc"


def _verify(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["verify", *map(str, args)])
    return code, capsys.readouterr().out


def _blocks(text: str) -> dict[str, str]:
    return {b.split()[0]: b for b in re.split(r"^entry ", text, flags=re.MULTILINE)[1:]}


def test_sweep_records_cells_and_entries(study):
    ds = uqmetrics.read_dataset(study)
    cells = decode_attr(ds.attrs["caches"])
    entries = decode_attr(ds.attrs["entries"])
    assert len(cells) == 4 and all(uqmetrics.input_checksum(uqmetrics.read_dataset(p)) == c
                                   for p, c in cells.items())
    assert entries["dim"] == "method" and set(entries["provenance"]) == {"blr", "ens"}
    for m, prov in entries["provenance"].items():
        assert len(prov["caches"]) == 2 and all(f"_{m}_r" in p for p in prov["caches"])
        assert prov["seeds"] == {"seed": 0, "repetitions": [0, 3]}
        assert prov["wall_time_s"] >= 0
    assert entries["provenance"]["ens"]["recipes"]["paper"]["members"] == 2


def test_untouched_study_agrees(study, capsys):
    code, text = _verify(capsys, study)
    assert code == 0, text
    assert "summary: 2 entries: 2 agree, 0 disagree" in text
    assert "tolerance: rtol=1e-09, atol=1e-12" in text
    assert "disagree  " not in text


def test_altered_cell_disagrees_on_its_method(study, capsys):
    entries = decode_attr(uqmetrics.read_dataset(study).attrs["entries"])
    victim = entries["provenance"]["ens"]["caches"][1]
    cell = uqmetrics.read_dataset(victim)
    pred = cell["prediction"].values.copy()
    pred.flat[0] += 0.5
    cell["prediction"].values = pred
    uqmetrics.write_dataset(cell, victim, overwrite=True)  # checksums of the new data
    code, text = _verify(capsys, study)
    assert code == 1
    blocks = _blocks(text)
    assert "DISAGREE" in blocks["uqreg:ens"] and "DISAGREE" not in blocks["uqreg:blr"]
    assert f"cache disagree  {victim}: checksum" in blocks["uqreg:ens"]
    assert re.search(r"^  disagree  prediction\[", blocks["uqreg:ens"], flags=re.MULTILINE)


def test_altered_summary_of_a_study_without_cells_disagrees(study, tmp_path, capsys):
    ds = uqmetrics.read_dataset(study)
    entries = decode_attr(ds.attrs["entries"])
    for prov in entries["provenance"].values():
        del prov["caches"]
    del ds.attrs["caches"]  # as a study of ``uqreg study``: rescored from its raw variables
    ds.attrs["entries"] = json.dumps(entries)
    plain = tmp_path / "plain.nc"
    uqmetrics.write_dataset(ds, plain)
    code, text = _verify(capsys, plain)
    assert code == 0, text
    summary = next(v for v in ds.data_vars if v.startswith("coverage") and "method" in ds[v].dims)
    ds[summary].values = np.where(np.isnan(ds[summary].values), 0.0, ds[summary].values + 1e-6)
    altered = tmp_path / "altered.nc"
    uqmetrics.write_dataset(ds, altered)
    code, text = _verify(capsys, altered)
    assert code == 1
    assert re.search(rf"^  disagree  {summary}\[", text, flags=re.MULTILINE), text


def test_the_helps_example_verifies_an_entry_of_a_real_site(tmp_path, capsys):
    """``uqreg verify --help`` shows ``SITE#ENTRY_ID`` by an example: it names a registered
    method of this protocol, and, its ``site`` a report site of a study of that method (a
    sweep of its own: the module's study is altered above), it verifies that entry (exit 0),
    as written."""
    from dask.distributed import LocalCluster

    from uqreg.methods import METHODS
    from uqreg.verify import PROTOCOL

    study = tmp_path / "sweep" / "study.nc"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster:
        assert cli.main([*SWEEP, "--out", str(study.parent), "--scheduler",
                         cluster.scheduler_address]) == 0

    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        cli.main(["verify", "--help"])
    assert stop.value.code == 0
    example = re.search(r"\(e\.g\. (\S+)\)", " ".join(capsys.readouterr().out.split())).group(1)
    assert example == cli.verify_example()
    site, entry = example.split("#")
    protocol, method = entry.split(":")
    assert protocol == PROTOCOL and method in METHODS
    assert method in decode_attr(uqmetrics.read_dataset(study).attrs["entries"])["provenance"]
    assert cli.main(["report", str(study), "--out", str(tmp_path / site), "--no-figures"]) == 0
    code, text = _verify(capsys, cli.verify_example(str(tmp_path / site)))
    assert code == 0, text
    assert f"entry {entry}" in text and "summary: 1 entry: 1 agree, 0 disagree" in text
