"""ImageNet-C made locally (uqvision.data.corruptions): reference equality, severity order,
resume after a kill, refused inputs. (Motion blur, snow and elastic transform, which are the
original's code rather than imagecorruptions': test_corruptions_original.py.)"""

import io
import json
import zlib

import numpy as np
import pytest
from PIL import Image
from torchvision.transforms import functional as tf

from uqvision.cli import main
from uqvision.data import ImageFolderDataset, derive_seed, make_digits_folder
from uqvision.data.corruptions import (
    BENCHMARK_CORRUPTIONS,
    CORRUPTIONS,
    JPEG_QUALITY,
    METADATA_FILE,
    _corrupt,
    _prepare,
    _seed,
    make_corrupted_folder,
    reference_corruptions,
)
from uqvision.data.corruptions_original import IMAGEMAGICK_CORRUPTIONS, ORIGINAL_CORRUPTIONS
from uqvision.data.makers import DATASET_MAKERS

# Non-monotone by the reference parameters, at any size: glass blur (severity 2 shuffles once,
# severity 1 twice; 4 vs 3 likewise), frost (the frost texture differs per severity; weights
# 0.65/0.7 vs 0.6/0.75), saturate (severities 1-3 only rescale saturation: no change on grey
# images, 0.3 vs 0.1 vs 2 on colour ones). Only severity 5 < severity 1 is asserted for them.
NOT_MONOTONE = {"glass_blur", "frost", "saturate"}
#: The corruptions made by imagecorruptions (the others: uqvision.data.corruptions_original).
PACKAGE_CORRUPTIONS = tuple(c for c in CORRUPTIONS if c not in ORIGINAL_CORRUPTIONS)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """10 real digit images (one per class), the source folder of the tests."""
    return make_digits_folder(tmp_path_factory.mktemp("digits"), max_per_class=2) / "test"


def _jpeg(arr):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=JPEG_QUALITY, optimize=True)
    return buf.getvalue()


def test_names_match_the_package():
    ref = reference_corruptions()
    assert tuple(ref.get_corruption_names("all")) == CORRUPTIONS
    assert tuple(ref.get_corruption_names()) == BENCHMARK_CORRUPTIONS


def test_every_package_corruption_equals_the_reference(clean, tmp_path):
    out = make_corrupted_folder(clean, tmp_path / "c", corruptions=PACKAGE_CORRUPTIONS,
                                resize=32, crop=32, seed=3, progress=False)
    ds = ImageFolderDataset(clean)
    ref = reference_corruptions()
    for rel, label in ds.samples[:2]:
        img = Image.open(clean / rel).convert("RGB")
        arr = np.asarray(tf.center_crop(tf.resize(img, 32), 32))
        for i, c in enumerate(CORRUPTIONS):
            if c in ORIGINAL_CORRUPTIONS:
                continue
            for s in range(1, 6):
                np.random.seed(derive_seed(3, i, s, zlib.crc32(rel.encode())) % 2**32)
                want = ref.corrupt(arr, corruption_name=c, severity=s)
                f = out / c / str(s) / ds.classes[label] / (rel.split("/")[-1][:-4] + ".JPEG")
                assert f.read_bytes() == _jpeg(want), (c, s, rel)
    meta = json.loads((out / METADATA_FILE).read_text())
    assert meta["complete"] and meta["jpeg_quality"] == 85 and meta["crop"] == 32
    assert meta["package"].startswith("imagecorruptions 1.")
    assert meta["implementations"] == {c: meta["package"] for c in PACKAGE_CORRUPTIONS}
    # the output is the layout of the imagenet-c evaluation set: one readable folder per member
    member = ImageFolderDataset(out / "fog" / "3")
    assert member.classes == ds.classes and len(member) == len(ds)


@pytest.fixture(scope="module")
def images64(clean):
    """Five of the digit images at 64 px, with their sample ids."""
    ds = ImageFolderDataset(clean)
    return [(_prepare(ds[i][0], 64, 64), ds.samples[i][0]) for i in range(0, len(ds), 2)]


@pytest.mark.parametrize("c", CORRUPTIONS)
def test_severity_lowers_psnr(images64, c, request):
    if c in IMAGEMAGICK_CORRUPTIONS:
        request.getfixturevalue("magick")
    psnr = []
    for s in range(1, 6):
        v = []
        for a, rel in images64:
            o = _corrupt(a, c, s, _seed(0, c, s, rel)).astype(float)
            mse = np.mean((o - a.astype(float)) ** 2)
            v.append(10 * np.log10(255.0**2 / max(mse, 1e-10)))
        psnr.append(np.mean(v))
    if c == "elastic_transform":  # the original's: 1-2 a large random affine, 3-5 a local field
        assert max(psnr[:2]) < min(psnr[2:]) and (np.diff(psnr[2:]) < 0).all(), psnr
    elif c in NOT_MONOTONE:
        assert psnr[4] < psnr[0], (c, psnr)
    else:
        assert (np.diff(psnr) < 0).all(), (c, psnr)


def test_resume_after_an_interruption_is_byte_identical(clean, tmp_path):
    kw = {"corruptions": ("gaussian_noise", "glass_blur", "frost"), "severities": (1, 5),
              "resize": 40, "crop": 32, "progress": False}
    full = make_corrupted_folder(clean, tmp_path / "full", **kw)
    want = {p.relative_to(full): p.read_bytes() for p in full.rglob("*.JPEG")}
    assert len(want) == 3 * 2 * 10
    part = make_corrupted_folder(clean, tmp_path / "part", **kw)
    files = sorted(part.rglob("*.JPEG"))
    for p in files[::3]:  # a killed run: images missing, a temporary file left, not complete
        p.unlink()
    (files[1].parent / f".partial-999-{files[1].name}").write_bytes(b"\xff\xd8half")
    meta = json.loads((part / METADATA_FILE).read_text())
    (part / METADATA_FILE).write_text(json.dumps({**meta, "complete": False}))
    lines = []
    make_corrupted_folder(clean, part, **{**kw, "progress": lines.append}, workers=2)
    got = {p.relative_to(part): p.read_bytes() for p in part.rglob("*.JPEG")}
    assert got == want
    assert not list(part.rglob(".partial-*"))
    assert json.loads((part / METADATA_FILE).read_text())["complete"]
    assert "images/s" in lines[-1] and "ETA" in lines[-1]


@pytest.mark.slow
def test_killed_process_resumes(clean, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    kw = {"corruptions": ("glass_blur",), "resize": 64, "crop": 64, "progress": False}
    full = make_corrupted_folder(clean, tmp_path / "full", **kw)
    out = tmp_path / "killed"
    code = (f"from uqvision.data import make_corrupted_folder as m; "
            f"m({str(clean)!r}, {str(out)!r}, **{kw!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.rglob("*.JPEG"))) < 5:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(list(out.rglob("*.JPEG"))) < 50
    make_corrupted_folder(clean, out, **kw)
    for p in full.rglob("*.JPEG"):
        assert (out / p.relative_to(full)).read_bytes() == p.read_bytes()
    assert not list(out.rglob(".partial-*"))


@pytest.fixture
def dask_scheduler():
    """``dask_scheduler() -> address``: a thread-based Dask cluster of one worker, started in
    the test (closed at its end, or earlier by closing the context it returns); dask's global
    ``scheduler`` setting is put back as it was."""
    import contextlib

    import dask
    from dask.distributed import LocalCluster

    before = dask.config.get("scheduler", None)

    @contextlib.contextmanager
    def start():
        with LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                          dashboard_address=":0") as cluster:
            yield cluster.scheduler_address

    yield start
    if before is None:
        dask.config.config.pop("scheduler", None)
    else:
        dask.config.set(scheduler=before)


def _files(root) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*.JPEG")}


def test_generation_on_a_dask_cluster_is_byte_identical(clean, tmp_path, dask_scheduler,
                                                        capsys):
    """``scheduler`` (``uqvision data imagenet-c --scheduler``): the same work units on a Dask
    cluster (the one ``uqvision sweep --scheduler`` uses), the same files byte for byte,
    progress with images/s and an ETA."""
    kw = {"corruptions": ("gaussian_noise", "impulse_noise", "contrast"), "severities": (1, 5),
          "resize": 40, "crop": 32, "seed": 2}
    local = make_corrupted_folder(clean, tmp_path / "local", **kw, progress=False, workers=1)
    lines = []
    with dask_scheduler() as address:
        out = make_corrupted_folder(clean, tmp_path / "dask", **kw, progress=lines.append,
                                    scheduler=address)
        assert main(["data", "imagenet-c", "--src", str(clean), "--out",
                     str(tmp_path / "cli"), "--corruptions", ",".join(kw["corruptions"]),
                     "--severities", "1,5", "--resize", "40", "--crop", "32", "--seed", "2",
                     "--scheduler", address]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("imagenet-c: 10 images to corrupt on the Dask cluster at ")
    assert "images/s" in err[-1] and "ETA" in err[-1]
    assert _files(out) == _files(local) == _files(tmp_path / "cli")
    assert len(_files(out)) == 3 * 2 * 10
    assert json.loads((out / METADATA_FILE).read_text()) == json.loads(
        (local / METADATA_FILE).read_text())
    assert lines[0] == (f"imagenet-c: 10 images to corrupt on the Dask cluster at {address} "
                        "(1 worker(s))")
    assert lines[-1].startswith("imagenet-c: 10/10 images (0 done before), ")
    assert "images/s" in lines[-1] and "ETA" in lines[-1]
    assert not list(out.rglob(".partial-*"))


def test_a_dask_generation_interrupted_by_ctrl_c_resumes_byte_identical(clean, tmp_path,
                                                                        dask_scheduler):
    """Ctrl-C (SIGINT) while the cluster writes: the images not started are cancelled, no
    partial file stays, the folder is not marked complete, and a rerun writes the missing
    images only: the folder equals an uninterrupted run's."""
    import os
    import signal
    import threading
    import time

    from uqmetrics.runs.testing.signals import sigint_raises

    kw = {"corruptions": ("glass_blur",), "severities": (1, 2), "resize": 64, "crop": 64,
          "progress": False}
    full = make_corrupted_folder(clean, tmp_path / "full", **kw)
    out = tmp_path / "part"
    stop = threading.Event()

    def interrupt_after(n: int) -> None:
        while not stop.is_set():
            if len(list(out.rglob("*.JPEG"))) >= n:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=interrupt_after, args=(2,), daemon=True)
    with dask_scheduler() as address:
        watcher.start()
        try:  # the watcher's SIGINT raises here even where the tests run with it ignored (nohup)
            with sigint_raises(), pytest.raises(KeyboardInterrupt):
                make_corrupted_folder(clean, out, **kw, scheduler=address)
        finally:
            stop.set()
            watcher.join()
    # the cluster is closed: what its worker had started is written whole or not at all
    kept = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*.JPEG")}
    assert 2 <= len(kept) < 20, len(kept)
    assert not list(out.rglob(".partial-*"))
    assert json.loads((out / METADATA_FILE).read_text())["complete"] is False
    lines = []
    with dask_scheduler() as address:
        make_corrupted_folder(clean, out, **{**kw, "progress": lines.append},
                              scheduler=address)
    assert _files(out) == _files(full)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in kept} == kept
    stems = [p.relative_to(out).parts[2:] for p in kept]  # (class, file) per severity
    before = sum(stems.count(stem) == 2 for stem in set(stems))  # both severities written
    assert f"imagenet-c: {10 - before}/{10 - before} images ({before} done before), " \
        in lines[-1]
    assert json.loads((out / METADATA_FILE).read_text())["complete"]


@pytest.mark.parametrize(("kw", "match"), [
    ({"corruptions": ["fogg"]}, "corruptions: unknown corruption 'fogg'"),
    ({"severities": (0, 1)}, "severities: 0 is not a severity 1..5"),
    ({"severities": (6,)}, "severities: 6 is not a severity 1..5"),
    ({"resize": 32, "crop": 40}, "crop 40 is larger than resize 32"),
    ({"resize": 16, "crop": 16}, "crop 16 is below 32 px"),
    ({"quality": 0}, "quality must be a positive integer, got 0"),
    ({"workers": 0}, "workers must be a positive integer, got 0"),
    ({"workers": 2, "scheduler": "tcp://127.0.0.1:8786"},
     ("workers 2 and scheduler 'tcp://127.0.0.1:8786': the images run on the cluster's "
     "workers; give one of the two")),
    ({"scheduler": ""}, "scheduler: give a Dask scheduler address"),
])
def test_bad_options_refused(clean, tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        make_corrupted_folder(clean, tmp_path / "o", progress=False, **kw)
    assert not (tmp_path / "o").exists()


def test_other_options_or_foreign_folder_refused(clean, tmp_path):
    kw = {"corruptions": "brightness", "severities": (1,), "resize": 32, "crop": 32, "progress": False}
    out = make_corrupted_folder(clean, tmp_path / "o", **kw)
    with pytest.raises(FileExistsError, match="other options; pass overwrite=True"):
        make_corrupted_folder(clean, out, **{**kw, "quality": 90})
    make_corrupted_folder(clean, out, **{**kw, "quality": 90}, overwrite=True)
    assert json.loads((out / METADATA_FILE).read_text())["jpeg_quality"] == 90
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a uqvision ImageNet-C folder"):
        make_corrupted_folder(clean, tmp_path / "x", **kw)


def test_folder_of_an_earlier_uqvision_resumes_unless_a_corruption_changed(clean, tmp_path):
    """A metadata file without ``implementations`` (written before elastic transform, motion
    blur and snow were the original's) recorded imagecorruptions for every corruption: such a
    folder resumes where its corruptions are still the package's, and is refused, naming the
    difference, where one is now the original's."""
    kw = {"severities": (1,), "resize": 32, "crop": 32, "progress": False}
    for names, same in ((("brightness",), True), (("brightness", "elastic_transform"), False)):
        out = make_corrupted_folder(clean, tmp_path / names[-1], corruptions=names, **kw)
        meta = json.loads((out / METADATA_FILE).read_text())
        del meta["implementations"]
        (out / METADATA_FILE).write_text(json.dumps({**meta, "complete": False}))
        if same:
            make_corrupted_folder(clean, out, corruptions=names, **kw)
            assert json.loads((out / METADATA_FILE).read_text())["complete"]
        else:
            with pytest.raises(FileExistsError, match=r"other options; pass overwrite=True to "
                               r"replace it \(they differ in: implementations\)"):
                make_corrupted_folder(clean, out, corruptions=names, **kw)


def test_dataset_maker(clean, tmp_path):
    maker = DATASET_MAKERS.lookup("imagenet-c")
    out = maker(tmp_path / "o", src=str(clean), corruptions="contrast,fog", severities="2,4",
                resize=32, crop=32, seed=0, overwrite=False)
    assert sorted(p.name for p in out.iterdir()) == ["contrast", "fog", METADATA_FILE]
    assert sorted(p.name for p in (out / "fog").iterdir()) == ["2", "4"]
    with pytest.raises(ValueError, match="src"):
        maker(tmp_path / "p", seed=0, overwrite=False)
    with pytest.raises(ValueError, match="severities: '1,x'"):
        maker(tmp_path / "p", src=str(clean), severities="1,x", seed=0, overwrite=False)
