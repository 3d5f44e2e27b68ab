"""ImageNet's layouts end to end (uqvision.layouts): ``predict`` and ``sweep`` on a flat folder
with its label file, an ImageNet-R-like folder and its tar, scored in the 1000-class space.
"""

from __future__ import annotations

import json
import pkgutil
import shutil
import tarfile

import numpy as np
from layouts_support import IMAGE_CLASS, IN1K, PICKED, _cache, _jpeg, _name

from uqvision.cli import main
from uqvision.data import ImageFolderDataset, folder_fingerprint

# -- end to end: predict in the 1000-class space ---------------------------------------------


def test_cli_predict_on_a_flat_folder_labels_in_1000_class_space(sets, tmp_path, in1k_checkpoint,
                                                                 capsys):
    out = tmp_path / "caches"
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--out", str(out), "--batch-size", "4"]) == 0
    ds = _cache(out)
    assert ds["logits"].shape == (8, 1000) and ds.attrs["class_names_source"] == "imagenet-1k"
    want = {_name(i + 1): IN1K.index(PICKED[c]) for i, c in enumerate(IMAGE_CLASS)}
    assert ds["label"].values.tolist() == [want[s] for s in ds["sample"].values]
    assert int(ds["in_folder"].sum()) == 3
    # the same folder with another label file: its cache is refused on resume, not reused
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--labels", str(sets["csv"]), "--out", str(out), "--batch-size", "4"]) == 2
    assert "computed from other inputs" in capsys.readouterr().err
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(sets["flat"]),
                 "--labels", str(sets["csv"]), "--out", str(tmp_path / "c2"),
                 "--batch-size", "4"]) == 0
    assert np.array_equal(_cache(tmp_path / "c2")["label"], ds["label"])


def test_cli_predict_imagenet_r_like_folder_and_its_tar(tmp_path, in1k_checkpoint):
    """Three WordNet ids of ImageNet-R (200 of the 1,000): labels are their indices among the
    model's 1,000 classes, logits stay 1,000 wide; the same from the tar it ships as."""
    # timm ships ImageNet-R's 200 WordNet ids and their ImageNet-1k indices (its validate.py
    # masks the 1,000 logits with them); the indices are the oracle of the labels here
    r_wnids = pkgutil.get_data("timm.data", "_info/imagenet_r_synsets.txt").decode().split()
    r_index = pkgutil.get_data("timm.data", "_info/imagenet_r_indices.txt").decode().split()
    rows = [0, 77, 199]
    picked = [r_wnids[k] for k in rows]
    root = tmp_path / "imagenet-r"
    for k, w in enumerate(picked):
        for j in range(2):
            _jpeg(root / w / f"art_{j}.jpg", 3 * k + j)
    (root / "README.txt").write_text("not an image")
    with tarfile.open(tmp_path / "imagenet-r.tar", "w") as tf:
        tf.add(root, arcname="imagenet-r")
    caches = {}
    for key, data in (("folder", root), ("tar", tmp_path / "imagenet-r.tar")):
        assert main(["predict", "--model", in1k_checkpoint, "--data", str(data),
                     "--out", str(tmp_path / key), "--batch-size", "4"]) == 0
        caches[key] = _cache(tmp_path / key)
    ds = caches["folder"]
    assert ds["logits"].shape == (6, 1000) and ds.attrs["class_mapping"] == "name"
    assert ds["label"].values.tolist() == [int(r_index[k]) for k in rows for _ in range(2)]
    assert json.loads(ds.attrs["folder_classes"]) == picked
    assert list(caches["tar"]["sample"].values) == list(ds["sample"].values)
    np.testing.assert_array_equal(caches["tar"]["label"], ds["label"])
    np.testing.assert_allclose(caches["tar"]["logits"], ds["logits"], rtol=0, atol=1e-5)
    assert caches["tar"].attrs["dataset_fingerprint"] != ds.attrs["dataset_fingerprint"]


def test_sweep_cells_read_a_flat_folder_with_its_label_file(sets, tmp_path, in1k_checkpoint):
    """A sweep of a flat folder whose label file lies elsewhere (given, not found): the cells,
    which scan the folder again on their worker, read the same label file."""
    import distributed

    from uqvision.cli import build_parser
    from uqvision.predict import PredictConfig
    from uqvision.sweep import sweep_predictions

    csv = shutil.move(sets["csv"], tmp_path / "labels.csv")
    shutil.rmtree(sets["devkit"])
    args = build_parser().parse_args(["sweep", "--models", "m", "--data", "d", "--out", "o",
                                      "--labels", str(csv)])
    assert args.labels == str(csv)
    folder = ImageFolderDataset(sets["flat"], labels=csv)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        report = sweep_predictions([in1k_checkpoint], folder, tmp_path / "caches",
                                   PredictConfig(batch_size=4), client=client, threads=1)
    assert not report.failed and len(report.computed) == 1
    ds = _cache(tmp_path / "caches")
    want = {_name(i + 1): IN1K.index(PICKED[c]) for i, c in enumerate(IMAGE_CLASS)}
    assert ds["label"].values.tolist() == [want[s] for s in ds["sample"].values]
    assert ds.attrs["dataset_fingerprint"] == folder_fingerprint(folder)


