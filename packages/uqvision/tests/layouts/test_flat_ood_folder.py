"""OOD folders need no class sub-folder (issue 37, section 6): a flat folder of images with no
label file is an OOD set, its images one class ``-1`` that the set's class map labels -1
(:data:`uqvision.layouts.UNLABELLED`, as an OOD image list's); a labelled set there is still
refused, naming the label files looked for. A real flat folder of JPEGs is swept with
``--ood-sets`` and scored by ``uqvision score ood``; the sweep runs in process on a
thread-based Dask cluster, as tests/test_sweep_sets.py's do (its fixtures are reused)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from PIL import Image
from test_sweep_sets import RANDOM, _dask_globals_kept, client  # noqa: F401  (fixtures)

from uqvision.cli import main
from uqvision.layouts import UNLABELLED, scan_layout


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """Four noise JPEGs directly in a folder: no class sub-folder, no label file."""
    root = tmp_path_factory.mktemp("flat_ood") / "far"
    root.mkdir()
    rng = np.random.default_rng(7)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(
            root / f"ood_{i}.jpg", "JPEG")
    return root


def test_a_flat_folder_is_unlabelled_images_only_where_labels_are_not_needed(flat):
    scan = scan_layout(flat, unlabelled=True)
    assert (scan.layout, scan.classes, scan.label_file) == ("flat", [UNLABELLED], None)
    assert scan.samples == [(f"ood_{i}.jpg", 0) for i in range(4)]
    with pytest.raises(FileNotFoundError, match="no label file was found: looked for"):
        scan_layout(flat)  # a labelled set needs class folders or a label file


def test_a_flat_folder_is_swept_as_an_ood_set_and_scored(flat, digits, tmp_path, client,  # noqa: F811
                                                         capsys):
    out = tmp_path / "sweep"
    assert main(["--threads", "1", "sweep", "--models", RANDOM, "--random-init", "--data",
                 str(digits / "test"), "--ood-sets", f"ood-far={flat}", "--calibration-size",
                 "0.3", "--scheduler", client.scheduler.address, "--out", str(out)]) == 0
    with xr.open_dataset(out / "caches" / f"{RANDOM}.ood-far.plain-000.nc") as ds:
        assert ds.sizes["sample"] == 4 and set(ds["label"].values.tolist()) == {-1}
        assert list(ds["sample"].values) == [f"ood_{i}.jpg" for i in range(4)]
    capsys.readouterr()
    assert main(["score", "ood", "--caches", str(out / "caches"), "--out",
                 str(tmp_path / "ood.nc")]) == 0, capsys.readouterr().err
    scores = xr.load_dataset(tmp_path / "ood.nc")
    assert "ood-far" in scores["ood_set"].values.tolist()
    assert np.isfinite(scores["auroc"].sel(ood_set="ood-far").values).all()
    # the same folder as an in-distribution set: refused before any model runs
    assert main(["predict", "--model", RANDOM, "--random-init", "--data", str(flat), "--out",
                 str(tmp_path / "id")]) == 2
    err = capsys.readouterr().err
    assert "holds images but no class sub-folder, and no label file was found" in err
    assert not (tmp_path / "id").exists()
