"""ImageNet-C as shipped (uqvision.layouts ``tar_folder``): a folder inside an uncompressed tar,
``ARCHIVE.tar/<corruption>/<severity>``, read in place as its extracted folder is; the members
of ``imagenet-c`` found in the archives of a root (``blur.tar``, ``weather.tar``) as in its
extracted folders, by ``iter_member_folders``, ``resolve_member`` and ``sweep_targets``.
"""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
from layouts_support import PICKED, _cache, _jpeg

from uqvision.cli import main
from uqvision.data import ImageFolderDataset, folder_fingerprint
from uqvision.evalsets import iter_member_folders, resolve_member
from uqvision.layouts import is_folder, tars
from uqvision.predict import PredictConfig, predict

#: Two corruptions of ImageNet-C, each in the archive it ships in, at two severities.
ARCHIVE = {"defocus_blur": "blur.tar", "fog": "weather.tar"}
SEVERITIES = (1, 2)
CLASSES = PICKED[:2]
MEMBERS = [f"{c}-{s}" for c in ARCHIVE for s in SEVERITIES]


@pytest.fixture
def imagenet_c(tmp_path):
    """ImageNet-C in miniature (2 corruptions x 2 severities x 2 classes x 2 images, every
    image its own) extracted, as shipped (``blur.tar``, ``weather.tar``: one corruption each)
    and with both corruptions in one archive (``one/imagenet-c.tar``)."""
    extracted, shipped, one = tmp_path / "extracted", tmp_path / "shipped", tmp_path / "one"
    seed = 0
    for c in ARCHIVE:
        for s in SEVERITIES:
            for w in CLASSES:
                for j in range(2):
                    _jpeg(extracted / c / str(s) / w / f"ILSVRC2012_val_{j:08d}.JPEG", seed)
                    seed += 1
    shipped.mkdir()
    one.mkdir()
    for c, name in ARCHIVE.items():
        with tarfile.open(shipped / name, "w") as tf:
            tf.add(extracted / c, arcname=c)
    with tarfile.open(one / "imagenet-c.tar", "w") as tf:
        for c in ARCHIVE:
            tf.add(extracted / c, arcname=f"./{c}")  # "./" as some tar tools write it
    return {"extracted": extracted, "shipped": shipped, "one": one}


def _found(root) -> dict[str, str]:
    """Member name -> its folder relative to ``root``, of the members found there."""
    return {m.name: folder.relative_to(root).as_posix()
            for m, folder in iter_member_folders(root, "imagenet-c") if is_folder(folder)}


def test_iter_member_folders_finds_the_members_extracted_and_in_archives(imagenet_c):
    assert _found(imagenet_c["extracted"]) == {f"{c}-{s}": f"{c}/{s}"
                                               for c in ARCHIVE for s in SEVERITIES}
    assert _found(imagenet_c["shipped"]) == {f"{c}-{s}": f"{ARCHIVE[c]}/{c}/{s}"
                                             for c in ARCHIVE for s in SEVERITIES}
    assert _found(imagenet_c["one"]) == {f"{c}-{s}": f"imagenet-c.tar/{c}/{s}"
                                         for c in ARCHIVE for s in SEVERITIES}
    # an archive as the root: its folders
    tar = imagenet_c["shipped"] / "blur.tar"
    assert _found(tar) == {f"defocus_blur-{s}": f"defocus_blur/{s}" for s in SEVERITIES}
    # the member is told from a path through an archive as from a folder's
    member = resolve_member("imagenet-c", None, tar / "defocus_blur" / "2")
    assert (member.name, member.corruption, member.severity) == ("defocus_blur-2",
                                                                 "defocus_blur", 2)
    # an extracted member wins over one in an archive
    mixed = imagenet_c["shipped"]
    (mixed / "fog").mkdir()
    (mixed / "fog" / "1").symlink_to(imagenet_c["extracted"] / "fog" / "1")
    assert _found(mixed)["fog-1"] == "fog/1" and _found(mixed)["fog-2"] == "weather.tar/fog/2"
    assert not is_folder(tar) and not is_folder(tar / "defocus_blur" / "3")


def test_a_folder_in_an_archive_reads_as_its_extracted_folder(imagenet_c, monkeypatch):
    opened = []
    real_open = tarfile.open
    monkeypatch.setattr(tarfile, "open", lambda name=None, *a, **k: (
        opened.append(str(name)), real_open(name, *a, **k))[1])
    tars._TARS_LISTED.clear()
    fingerprints = set()
    for c, archive in ARCHIVE.items():
        for s in SEVERITIES:
            want = ImageFolderDataset(imagenet_c["extracted"] / c / str(s))
            got = ImageFolderDataset(imagenet_c["shipped"] / archive / c / str(s))
            assert got.layout == f"tar/class_folders:{c}/{s}"
            assert got.classes == want.classes == CLASSES
            assert got.samples == want.samples and len(got) == 4
            for rel in got.sample_ids:
                assert got.source.read(rel) == want.source.read(rel)
                assert got.source.where(rel) == (f"{imagenet_c['shipped'] / archive}:"
                                                 f"{c}/{s}/{rel}")
            fingerprints.add(folder_fingerprint(got))
    # each archive listed once (its headers), whichever of its folders are read
    assert sorted(opened) == sorted(str(imagenet_c["shipped"] / a) for a in ARCHIVE.values())
    assert len(fingerprints) == len(MEMBERS)


def test_two_folders_of_one_archive_with_the_same_images_differ_in_fingerprint(tmp_path):
    for s in (1, 2):  # the same bytes at both severities
        for w in CLASSES:
            _jpeg(tmp_path / "noise" / "gaussian_noise" / str(s) / w / "a.JPEG", 7)
    with tarfile.open(tmp_path / "noise.tar", "w") as tf:
        tf.add(tmp_path / "noise" / "gaussian_noise", arcname="gaussian_noise")
    one, two = (ImageFolderDataset(tmp_path / "noise.tar" / "gaussian_noise" / str(s))
                for s in (1, 2))
    assert one.samples == two.samples
    assert folder_fingerprint(one) != folder_fingerprint(two)
    # the archive itself is read whole: one top folder, read as that folder
    whole = ImageFolderDataset(tmp_path / "noise.tar")
    assert whole.layout == "tar/class_folders" and whole.classes == ["1", "2"]


def test_a_missing_folder_in_an_archive_is_refused_naming_it(imagenet_c, in1k_checkpoint,
                                                             capsys):
    tar = imagenet_c["shipped"] / "blur.tar"
    with pytest.raises(FileNotFoundError, match=r"has no folder 'defocus_blur/9' .*its folders "
                       r"in 'defocus_blur' are \['defocus_blur/1', 'defocus_blur/2'\]"):
        ImageFolderDataset(tar / "defocus_blur" / "9")
    with pytest.raises(FileNotFoundError, match=r"has no folder 'motion_blur/1' .*its folders "
                       r"at its top are \['defocus_blur'\]"):
        ImageFolderDataset(tar / "motion_blur" / "1")
    # below an image, there is no folder either
    with pytest.raises(FileNotFoundError, match=r"has no folder 'defocus_blur/1/.* its folders "
                       rf"in 'defocus_blur/1/{CLASSES[0]}' are \[\]"):
        ImageFolderDataset(tar / "defocus_blur" / "1" / CLASSES[0] / "ILSVRC2012_val_00000000.JPEG"
                           / "x")
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(tar / "fog" / "1"),
                 "--out", str(imagenet_c["shipped"].parent / "c")]) == 2
    err = capsys.readouterr().err
    assert "has no folder 'fog/1'" in err and len(err.strip().splitlines()) == 1


def test_predict_in_an_archive_gives_the_logits_of_the_extracted_folder(imagenet_c, tmp_path,
                                                                      in1k_checkpoint):
    config = PredictConfig(eval_set="imagenet-c", batch_size=3, num_workers=0)
    (want,) = predict(in1k_checkpoint, imagenet_c["extracted"] / "fog" / "2", config)
    data = imagenet_c["shipped"] / "weather.tar" / "fog" / "2"
    assert main(["predict", "--model", in1k_checkpoint, "--data", str(data), "--eval-set",
                 "imagenet-c", "--out", str(tmp_path / "caches"), "--batch-size", "3"]) == 0
    got = _cache(tmp_path / "caches")
    assert list(got["sample"].values) == list(want["sample"].values)
    np.testing.assert_array_equal(got["logits"].values, want["logits"].values)
    np.testing.assert_array_equal(got["label"].values, want["label"].values)
    for key in ("eval_set", "eval_member", "corruption", "severity", "dataset_name"):
        assert got.attrs[key] == want.attrs[key]
    assert got.attrs["dataset_name"] == "imagenet-c-fog-2"


def test_sweep_targets_over_a_root_of_archives_lists_the_members(imagenet_c):
    from uqvision.sweep import sweep_targets

    data = ImageFolderDataset(imagenet_c["extracted"] / "fog" / "1")
    targets = sweep_targets(data, PredictConfig(),
                            [f"imagenet-c={imagenet_c['shipped']}"], dataset_name="clean")
    assert [t.member for t in targets[1:]] == MEMBERS
    assert [t.dataset_name for t in targets[1:]] == [f"imagenet-c-{m}" for m in MEMBERS]
    for t in targets[1:]:
        c, s = t.member.rsplit("-", 1)
        assert t.folder.root == imagenet_c["shipped"] / ARCHIVE[c] / c / s
        assert t.folder.layout == f"tar/class_folders:{c}/{s}" and len(t.folder) == 4
    # one member given by its path inside the archive
    (one,) = sweep_targets(data, PredictConfig(),
                           [f"imagenet-c={imagenet_c['shipped'] / 'weather.tar' / 'fog' / '2'}"],
                           dataset_name="clean")[1:]
    assert one.member == "fog-2" and one.folder.layout == "tar/class_folders:fog/2"
