"""uqvision.data.views: class-subset views over a folder (the index files they read:
protocols/uimnet/test_uimnet_index.py; image_view with an index file: training/
test_training_loop.py)."""

import pytest

from uqvision.data import ClassSubset, ImageFolderDataset, make_synthetic_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("syn")
    make_synthetic_folder(root, n_classes=4, n_per_class=20, image_size=8)
    return root / "test"


def test_class_subset_reindexes_labels_without_copies(folder):
    base = ImageFolderDataset(folder)
    view = ClassSubset(base, ["class_003", "class_001"])
    assert len(view) == 40 and set(view.targets) == {0, 1}
    assert view.sample_ids[0].startswith("class_001")  # folder order, labels by subset order
    assert view.targets[0] == 1
    with pytest.raises(ValueError, match="classes not in"):
        ClassSubset(base, ["nope"])
