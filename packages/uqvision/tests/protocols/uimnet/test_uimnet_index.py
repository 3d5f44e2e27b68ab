"""UIMNET's 90/10 in-domain index files (uqvision.protocols.uimnet.index, V.3)."""

import numpy as np
import pytest

from uqvision.data import ClassSubset, ImageFolderDataset, make_synthetic_folder, read_index_file
from uqvision.protocols.uimnet.index import make_index_files


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    make_synthetic_folder(root, n_classes=4, n_per_class=20, image_size=8)
    return root / "test"


def test_index_files_are_seeded_disjoint_and_cover_the_in_domain(folder, tmp_path):
    classes = ["class_002", "class_000"]
    a = make_index_files(folder, classes, tmp_path / "a", seed=0)
    b = make_index_files(folder, classes, tmp_path / "b", seed=0)
    c = make_index_files(folder, classes, tmp_path / "c", seed=1)
    read = {k: {n: read_index_file(p) for n, p in d.items()} for k, d in
            (("a", a), ("b", b), ("c", c))}
    assert read["a"]["val"]["indices"] == read["b"]["val"]["indices"]
    assert read["a"]["val"]["indices"] != read["c"]["val"]["indices"]
    tr, va = set(read["a"]["train"]["indices"]), set(read["a"]["val"]["indices"])
    assert not tr & va and tr | va == set(range(40))
    view = ClassSubset(ImageFolderDataset(folder), classes, sorted(va))
    assert np.bincount(view.targets).tolist() == [2, 2]  # 10 % of 20 per class
    assert view.sample_ids == read["a"]["val"]["samples"]
    assert all(s.startswith(("class_002", "class_000")) for s in view.sample_ids)
