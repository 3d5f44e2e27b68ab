"""A sweep fingerprints each folder once, in its planning process: its cells check every
image's bytes as they read them (a shared decode checks them for the cells that read its
file), never hash the folder again; an image changed after the plan fails its cell, naming
the image, and nothing of that cell is written (docs/conventions.md#fingerprint-rules)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from uqvision.cache import read_cache
from uqvision.data import ImageFolderDataset, dataset_fingerprint, sample_digests
from uqvision.data import folders as folders_module
from uqvision.data.folders import ChangedImageError
from uqvision.predict import PredictConfig, predict
from uqvision.sweep import sweep_predictions

#: Two models of one preprocessing group (they share a decode) and one of another.
SHARED = ("test_byobnet", "test_efficientnet")
OTHER = "test_resnet"


def _client(**worker):
    """An in-process cluster of one worker (``worker``: its options) and its client."""
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                           dashboard_address=None, **worker)
    return cluster, Client(cluster)


@pytest.fixture(scope="module")
def client():
    """An in-process Dask cluster: the cells run in this process, where reads are counted."""
    cluster, c = _client()
    with cluster, c:
        yield c


@pytest.fixture
def data(digits, tmp_path):
    """A copy of the digits test folder this test may change."""
    out = tmp_path / "data" / "test"
    shutil.copytree(digits / "test", out)
    return out


def _repaint(path: Path) -> None:
    """Rewrite an image with other pixels (still a valid image, its byte size changed)."""
    with Image.open(path) as im:
        a = np.asarray(im.convert("RGB"))
    Image.fromarray(255 - a).save(path)


def _retouch_same_size(path: Path) -> None:
    """Change one pixel of a PNG and keep its byte size (the first encoding of the same
    length, or a shorter one padded by a text chunk): what a fingerprint of names and sizes
    took for the same image."""
    from PIL import PngImagePlugin

    size = path.stat().st_size
    with Image.open(path) as im:
        pixels = np.asarray(im).copy()
    for where in range(pixels.size):
        for flip in (1, 0x40, 0x80):
            a = pixels.copy()
            a.reshape(-1)[where] ^= flip
            for level in range(10):
                buf = io.BytesIO()
                Image.fromarray(a).save(buf, format="PNG", compress_level=level)
                pad = size - buf.tell() - 12 - 2  # a tEXt chunk: 12 bytes, "k", NUL, text
                if buf.tell() == size or pad >= 0:
                    info = PngImagePlugin.PngInfo()
                    if buf.tell() != size:
                        info.add_text("k", "x" * pad)
                    Image.fromarray(a).save(path, format="PNG", compress_level=level,
                                            pnginfo=info)
                    assert path.stat().st_size == size
                    return
    raise AssertionError(f"no same-size edit of {path}")


def test_a_sweep_hashes_each_image_once_and_its_cells_record_the_plans_fingerprint(
        data, tmp_path, client):
    n = sum(1 for _ in data.rglob("*.png"))
    cfg = PredictConfig(batch_size=16, allow_random_init=True, num_workers=0)
    folders_module.HASH_READS.clear()
    report = sweep_predictions([*SHARED, OTHER], data, tmp_path / "caches", cfg, client=client)
    assert report.failed == {} and len(report.computed) == 3
    reads = folders_module.HASH_READS
    # once by the plan, once by the shared decode of the group of two, once by test_resnet's
    # cell as it decodes: no cell hashes the folder up front (that was 1 + 3 per image)
    assert len(reads) == n and set(reads.values()) == {3}, sorted(set(reads.values()))
    want = dataset_fingerprint(data)
    for path in report.computed:
        assert read_cache(path).attrs["dataset_fingerprint"] == want, path.name
    assert not (tmp_path / "caches" / ".decoded").exists()  # digests files removed

    folders_module.HASH_READS.clear()
    alone = sweep_predictions(list(SHARED), data, tmp_path / "alone", cfg, client=client,
                              share_decoding=False)
    assert alone.failed == {}
    assert set(folders_module.HASH_READS.values()) == {3}  # the plan's, and each cell's read


class _ChangeOnFirstCell:
    """A Dask worker plugin that repaints an image when the first cell starts: after the
    plan (and the group's shared decode), before any cell reads its images."""

    def __init__(self, image: Path):
        self.image, self.done = image, False

    def setup(self, worker):  # Dask's WorkerPlugin protocol
        pass

    def teardown(self, worker):
        pass

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and not self.done:
            self.done = True
            _retouch_same_size(self.image)


def test_an_image_changed_after_the_plan_fails_its_cell_and_nothing_is_written(
        data, tmp_path):
    image = sorted(data.rglob("*.png"))[5]
    rel = image.relative_to(data).as_posix()
    before = dataset_fingerprint(data)
    cfg = PredictConfig(batch_size=16, allow_random_init=True, num_workers=0)
    caches = tmp_path / "caches"
    from distributed.diagnostics.plugin import WorkerPlugin

    plugin = type("ChangeOnFirstCell", (_ChangeOnFirstCell, WorkerPlugin), {})(image)
    # the worker starts with it (Client.register_plugin came with distributed 2023.9.2)
    cluster, client = _client(plugins=(plugin,))
    with cluster, client:
        report = sweep_predictions([*SHARED, OTHER], data, caches, cfg, client=client)
    # the group's cells read the decoded file, checked when it was made (before the change)
    assert sorted(p.name for p in report.computed) == [
        f"{m}.test.plain-000.nc" for m in SHARED], report.failed
    for path in report.computed:
        assert read_cache(path).attrs["dataset_fingerprint"] == before
    (key,) = report.failed
    error = report.failed[key]
    assert key.startswith(OTHER) and "\n" not in error, error
    assert "changed since the sweep planned" in error and rel in error, error
    assert not (caches / f"{OTHER}.test.plain-000.nc").exists()
    assert not list(caches.glob(f"*{OTHER}*.nc"))

    # the rerun plans again: test_resnet computed with the new content's fingerprint; the
    # group's caches, of the old content, are refused, never reused
    after = dataset_fingerprint(data)
    assert after != before
    with _client()[0] as cluster2:
        from dask.distributed import Client

        with Client(cluster2) as client2:
            again = sweep_predictions([*SHARED, OTHER], data, caches, cfg, client=client2)
    assert [p.name for p in again.computed] == [f"{OTHER}.test.plain-000.nc"]
    assert read_cache(again.computed[0]).attrs["dataset_fingerprint"] == after
    assert set(again.failed) == set(SHARED), again.failed


def test_predict_with_the_plans_digests_checks_each_image_as_it_reads_it(data):
    cfg = PredictConfig(batch_size=16, allow_random_init=True, num_workers=0)
    folder = ImageFolderDataset(data)
    planned = (dataset_fingerprint(data), sample_digests(folder))
    folders_module.HASH_READS.clear()
    (ds,) = predict(OTHER, data, cfg, planned=planned)
    assert set(folders_module.HASH_READS.values()) == {1}  # read as decoded, not up front
    (ref,) = predict(OTHER, data, cfg)
    assert ds.attrs["dataset_fingerprint"] == ref.attrs["dataset_fingerprint"] == planned[0]
    assert np.array_equal(ds["logits"].values, ref["logits"].values)
    # an image rewritten: named (whether its size moved, caught by the scan, or not, caught
    # as its bytes are read)
    image = sorted(data.rglob("*.png"))[3]
    shutil.copy(image, data.parent / "kept.png")
    _repaint(image)
    with pytest.raises(ChangedImageError, match="changed since the sweep planned") as err:
        predict(OTHER, data, cfg, planned=planned)
    assert str(image) in str(err.value) and "\n" not in str(err.value)
    # the same with its byte size kept: caught as its bytes are read for decoding
    shutil.copy(data.parent / "kept.png", image)
    _retouch_same_size(image)
    with pytest.raises(ChangedImageError, match="changed since the sweep planned") as err:
        predict(OTHER, data, cfg, planned=planned)
    assert str(image) in str(err.value) and "\n" not in str(err.value)
    # an image added since the plan
    shutil.copy(min(data.rglob("*.png")), image.parent / "zz_new.png")
    with pytest.raises(ChangedImageError, match="appeared"):
        predict(OTHER, data, cfg, planned=planned)
