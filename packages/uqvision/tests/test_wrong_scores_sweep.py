"""Issue 36, rows 7 and 20, through real sweeps (``uqvision sweep`` in process, on a thread-based
Dask cluster, as test_sweep.py's):

- row 7: a rerun in which a model fails, into an ``--out`` whose scores hold more models, used
  to rewrite the results table with the models of that run only; a results table or score file
  never loses rows (the rows of caches still there are kept; files that hold rows whose caches
  are gone are kept, the new ones written beside them);
- row 20: a model without recorded class names (``--random-init``) swept on a one-class OOD
  folder had an OOD cache of 1 class beside its 10-class ID cache (AUROC 1.000 or 0.000): its
  class space now comes from ``--data``, never from an OOD folder, and a model's caches in two
  class spaces are refused naming both files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xarray as xr
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.predict import PredictConfig, predict_to_files
from uqvision.protocols.ood.score import OodConfig, score_ood


@pytest.fixture(scope="module")
def scheduler():
    """One in-process Dask cluster for the command-line sweeps of this module (--scheduler)."""
    from dask.distributed import LocalCluster

    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _rows(out: Path, stem: str = "test") -> tuple[list[str], list[str]]:
    """The model rows of the score file and of the results table (JSON and CSV agree)."""
    with xr.open_dataset(out / "scores" / f"selective-{stem}.nc") as ds:
        scored = sorted(str(m) for m in ds["model"].values)
    table = json.loads((out / "scores" / f"results-{stem}.json").read_text())
    tabled = sorted(r["model"] for r in table["rows"])
    csv = (out / "scores" / f"results-{stem}.csv").read_text().splitlines()[1:]
    assert sorted(line.split(",")[0] for line in csv) == tabled
    return scored, tabled


def test_a_rerun_with_a_failed_model_keeps_the_rows_of_the_table_and_the_scores(
        digits, tmp_path, scheduler, capsys):
    out = tmp_path / "s"
    common = ["--threads", "1", "sweep", "--random-init", "--data", str(digits / "test"),
              "--out", str(out), "--calibration-size", "0.3", "--scheduler", scheduler]
    assert main([*common, "--models", "test_vit", "test_resnet"]) == 0
    both = ["test_resnet", "test_vit"]
    assert _rows(out) == (both, both)
    # the rerun: test_resnet is not swept again, and a broken checkpoint fails
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a checkpoint at all")
    assert main([*common, "--models", "test_vit", f"test_byobnet={bad}"]) == 1
    assert _rows(out) == (both, both)  # the table used to hold test_vit alone
    capsys.readouterr()
    # test_resnet's cache gone (deleted, or another user's file that cannot be read): the
    # score file and table that hold its row are kept, this run's written beside them
    kept = {p.name: _sha(p) for p in (out / "scores").iterdir()}
    (out / "caches" / "test_resnet.test.plain-000.nc").unlink()
    assert main([*common, "--models", "test_vit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {p.name: _sha(p) for p in (out / "scores").iterdir() if p.name in kept} == kept
    assert _rows(out) == (both, both)
    assert _rows(out, "test.1") == (["test_vit"], ["test_vit"])
    (note,) = [ln for ln in lines if ln.startswith("note: ")]
    assert note == (f"note: {str(out / 'scores' / 'selective-test.nc')!r} and "
                    "results-test.csv/.json hold 1 model(s) this run did not score "
                    "(test_resnet: their caches in caches/ are gone or cannot be read); they "
                    "are kept as they are, and this run's scores and table go beside them: "
                    "selective-test.1.nc, results-test.1.csv/.json")
    assert str(out / "scores" / "selective-test.1.nc") in lines



def test_a_random_model_takes_its_classes_from_the_data_never_from_an_ood_folder(
        digits, tmp_path, scheduler, one_class_folder):
    ood = one_class_folder(tmp_path / "far")
    out = tmp_path / "s"
    assert main(["--threads", "1", "sweep", "--models", "test_byobnet", "--random-init",
                 "--data", str(digits / "test"), "--ood-sets", f"ood-far:far={ood}",
                 "--out", str(out), "--calibration-size", "0.3", "--scheduler",
                 scheduler]) == 0
    caches = out / "caches"
    with xr.open_dataset(caches / "test_byobnet.test.plain-000.nc") as idc, \
            xr.open_dataset(caches / "test_byobnet.far.plain-000.nc") as oodc:
        classes = [str(c) for c in idc["class"].values]
        # one class space: the 10 digits (the OOD cache used to have 1 class, "0")
        assert oodc["class"].values.tolist() == classes
        assert idc.sizes["class"] == 10 and oodc["logits"].shape == (6, 10)
        assert oodc.attrs["class_names_source"] == "model_classes"
        assert set(oodc["label"].values.tolist()) == {-1}
    ds = score_ood(caches, OodConfig(detectors=("msp",)))
    assert ds["auroc"].shape == (1, 1, 1)
    # predicted alone, such a model's classes would come from the OOD folder: refused
    with pytest.raises(InputError, match=(
            r"^model 'test_byobnet' records no class names and gets random weights: its "
            rf"classes would be those of OOD folder '{ood}' \(eval set 'ood-far'\)")):
        predict_to_files("test_byobnet", ood, tmp_path / "alone",
                         PredictConfig(allow_random_init=True, eval_set="ood-far",
                                       num_workers=0))
    # given its ID folder's classes, it is predicted in them
    (path,) = predict_to_files(
        "test_byobnet", ood, tmp_path / "given",
        PredictConfig(allow_random_init=True, eval_set="ood-far", num_workers=0,
                      model_classes=classes))
    with xr.open_dataset(path) as given:
        assert given.sizes["class"] == 10
