"""Hostile inputs: a user's mistake is ONE line naming the option or file, exit code 2, before
anything is computed, and no earlier file changes (hashed before and after)."""

import hashlib
import shutil

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import save_file
from uqmetrics import read_dataset

from uqvision.cli import main
from uqvision.data import ImageFolderDataset
from uqvision.protocols.selective.metadata import METADATA_ENV

ARCH = "test_byobnet"  # the architecture of conftest's trained checkpoint


def _hashes(*roots):
    """SHA-256 of every file under ``roots`` (path -> digest)."""
    files = [p for r in roots for p in ([r] if r.is_file() else sorted(r.rglob("*")))
             if p.is_file()]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _refused(capsys, argv):
    """Run the command line; assert exit code 2 and one line on stderr; return that line."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.fixture
def images(digits, tmp_path):
    """A small copy of the digits test folder: 2 images in each of the 10 classes."""
    root = tmp_path / "images"
    for c in sorted(p.name for p in (digits / "test").iterdir()):
        (root / c).mkdir(parents=True)
        for f in sorted((digits / "test" / c).iterdir())[:2]:
            shutil.copy(f, root / c / f.name)
    return root


@pytest.fixture
def checkpoint(trained, tmp_path):
    """A copy of the trained checkpoint, its sidecar and its state file (if any)."""
    folder = tmp_path / "models"
    folder.mkdir()
    for f in trained.checkpoint.parent.glob(trained.checkpoint.stem + ".*"):
        shutil.copy(f, folder / f.name)
    return folder / trained.checkpoint.name


def test_train_refuses_an_existing_checkpoint_before_training(digits, checkpoint, capsys):
    """3: ``train --out EXISTING`` replaced the checkpoint and its sidecar."""
    before = _hashes(checkpoint.parent)
    out = str(checkpoint.parent / "m{seed}.safetensors")  # m0 exists, m1 does not
    line = _refused(capsys, ["train", "--arch", ARCH, "--data", str(digits / "train"), "--out",
                             out, "--seeds", "1", "0", "--epochs", "1", "--input-size", "16"])
    assert line.startswith("uqvision train: error: --out") and str(checkpoint) in line
    assert "--overwrite" in line
    assert _hashes(checkpoint.parent) == before  # and seed 1 did not train first


def test_16_bit_png_reads_as_its_8_bit_copy(tmp_path):
    """4: a mode I;16 image was clipped to 8 bits (its mean read ~253 instead of ~83)."""
    levels = np.random.default_rng(0).integers(0, 161, (16, 16)).astype(np.uint8)
    for name, array in (("a16", levels.astype(np.uint16) * 257), ("b8", levels)):
        (tmp_path / name).mkdir()
        Image.fromarray(array).save(tmp_path / name / "x.png")
    assert Image.open(tmp_path / "a16" / "x.png").mode in ("I;16", "I")  # "I": PIL < 10.3
    ds = ImageFolderDataset(tmp_path)
    wide, narrow = (np.asarray(ds[i][0], dtype=int) for i in range(2))
    assert narrow.mean() < 100  # the 8-bit copy as it is
    np.testing.assert_allclose(wide, narrow, atol=1)  # 65535 -> 255, within rounding


def test_model_name_must_agree_with_the_checkpoint(images, checkpoint, tmp_path, capsys):
    """5: NAME was ignored when the checkpoint had a sidecar (wrong or unknown names ran)."""
    out = tmp_path / "caches"
    line = _refused(capsys, ["predict", "--model", f"test_vit={checkpoint}", "--data",
                             str(images), "--out", str(out)])
    assert "'test_vit'" in line and f"'{ARCH}'" in line and str(checkpoint) in line
    line = _refused(capsys, ["predict", "--model", f"{ARCH}z={checkpoint}", "--data",
                             str(images), "--out", str(out)])
    assert f"unknown timm model '{ARCH}z'; did you mean {ARCH}" in line
    assert not out.exists()


def test_no_ops_are_refused(digits, images, checkpoint, tmp_path, write_cache, capsys):
    """6: --passes 0 wrote nothing, --epochs 0 saved an untrained model, and a truncated cache
    was left out of the scores with a warning only."""
    line = _refused(capsys, ["predict", "--model", f"{ARCH}={checkpoint}", "--data",
                             str(images), "--out", str(tmp_path / "c"), "--mode", "tta",
                             "--passes", "0"])
    assert "argument --passes: must be >= 1, got 0" in line
    line = _refused(capsys, ["train", "--arch", ARCH, "--data", str(digits / "train"), "--out",
                             str(tmp_path / "z.safetensors"), "--epochs", "0"])
    assert "no gradient step" in line and "--epochs" in line
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob("z.*"))

    caches = tmp_path / "caches"
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 60)
    paths = [write_cache(caches, rng.normal(size=(60, 4)) + 2 * np.eye(4)[y], y, model=m)
             for m in ("a", "b", "c")]
    paths[1].write_bytes(paths[1].read_bytes()[:600])  # truncated
    before = _hashes(caches)
    score = ["score", "selective", "--caches", str(caches),
             "--calibration-size", "0.5", "--out", str(tmp_path / "s.nc")]
    line = _refused(capsys, score)
    assert "--caches" in line and paths[1].name in line and "--skip-incomplete" in line
    assert not (tmp_path / "s.nc").exists() and _hashes(caches) == before
    assert main([*score, "--skip-incomplete"]) == 0
    summary = capsys.readouterr().out.strip()
    assert "1 of 3 cache files not scored" in summary and paths[1].name in summary
    assert list(read_dataset(tmp_path / "s.nc")["model"].values) == ["a", "c"]


def test_unwritable_output_is_refused_before_any_work(images, checkpoint, tmp_path, write_cache,
                                                      capsys):
    """8: an output under a regular file (unwritable even for root) failed only after the
    computation. The up-front check is the one whose message names the option."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder\n")
    y = np.arange(20) % 4
    write_cache(tmp_path / "caches", np.eye(4)[y] * 3.0, y, model="a")
    before = _hashes(tmp_path)
    for argv in (["predict", "--model", f"{ARCH}={checkpoint}", "--data", str(images), "--out",
                  str(blocker / "caches")],
                 ["score", "selective", "--caches", str(tmp_path / "caches"),
                  "--calibration-size", "0.5", "--out", str(blocker / "s.nc")],
                 ["reproduce", "pitfalls", "--out", str(blocker / "run")]):
        line = _refused(capsys, argv)
        assert f"error: --out '{blocker}/" in line and f"'{blocker}' is not a folder" in line
    assert _hashes(tmp_path) == before


@pytest.mark.parametrize("kind", ["truncated.jpg", "empty.png", "text.jpg"])
def test_a_bad_image_is_named_before_any_work(images, checkpoint, tmp_path, capsys, kind):
    """9: a truncated JPEG (the file was not named), a zero-byte PNG, a text file named .jpg."""
    bad = images / "3" / kind
    if kind == "truncated.jpg":
        noise = np.random.default_rng(0).integers(0, 256, (48, 48, 3)).astype(np.uint8)
        Image.fromarray(noise).save(bad, quality=95)
        bad.write_bytes(bad.read_bytes()[:1500])
    elif kind == "empty.png":
        bad.write_bytes(b"")
    else:
        bad.write_text("not an image\n")
    out = tmp_path / "caches"
    line = _refused(capsys, ["predict", "--model", f"{ARCH}={checkpoint}", "--data",
                             str(images), "--out", str(out)])
    assert f"'{bad}'" in line and "--skip-bad-images" in line
    assert not out.exists()


def test_skip_bad_images_leaves_them_out_and_records_them(images, checkpoint, tmp_path, capsys):
    """9: --skip-bad-images skips them, records them in the cache and counts them in the log."""
    (images / "1" / "empty.png").write_bytes(b"")
    (images / "2" / "text.jpg").write_text("not an image\n")
    out = tmp_path / "caches"
    assert main(["predict", "--model", f"{ARCH}={checkpoint}", "--data", str(images), "--out",
                 str(out), "--skip-bad-images"]) == 0
    assert "2 unreadable image(s)" in capsys.readouterr().err
    (cache,) = (read_dataset(p) for p in out.glob("*.nc"))
    assert cache.sizes["sample"] == 20 and int(cache.attrs["n_skipped_images"]) == 2
    assert "1/empty.png" in cache.attrs["skipped_images"]
    assert "1/empty.png" not in list(cache["sample"].values)


def test_a_bad_checkpoint_is_named(images, checkpoint, tmp_path, capsys):
    """10: a text file or a truncated .safetensors (tracebacks), another architecture's weights
    without a sidecar (reported as a missing head.weight), a corrupt sidecar (not named)."""
    import timm

    text = tmp_path / "text.safetensors"
    text.write_text("not weights\n")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(checkpoint.read_bytes()[:5000])
    shutil.copy(checkpoint.with_suffix(".json"), truncated.with_suffix(".json"))
    other = tmp_path / "vit.safetensors"
    save_file(timm.create_model("test_vit", num_classes=10).state_dict(), str(other))
    sidecar = tmp_path / "bad_sidecar.safetensors"
    shutil.copy(checkpoint, sidecar)
    sidecar.with_suffix(".json").write_text('{"architecture": "test_byobnet", ')
    before = _hashes(tmp_path)
    for ckpt, problem in ((text, "not a safetensors file"), (truncated, "truncated"),
                          (other, f"does not hold '{ARCH}' weights"),
                          (sidecar, "is not valid JSON")):
        line = _refused(capsys, ["predict", "--model", f"{ARCH}={ckpt}", "--data",
                                 str(images), "--out", str(tmp_path / "out")])
        named = sidecar.with_suffix(".json") if ckpt == sidecar else ckpt
        assert f"'{named}'" in line and problem in line
    assert _hashes(tmp_path) == before


def test_threads_and_negative_indices_are_refused_naming_the_option(checkpoint, images,
                                                                   tmp_path, capsys):
    """12 and 14: --threads -1 (a RuntimeError traceback), --seed -1 and --first-pass -1
    (messages without the option)."""
    predict = ["predict", "--model", f"{ARCH}={checkpoint}", "--data", str(images), "--out",
               str(tmp_path / "c")]
    for argv, option in ((["--threads", "-1", *predict], "--threads"),
                         ([*predict, "--seed", "-1"], "--seed"),
                         ([*predict, "--mode", "tta", "--first-pass", "-1"], "--first-pass")):
        assert f"argument {option}: must be >= " in _refused(capsys, argv)
    assert not (tmp_path / "c").exists()


def test_an_existing_file_as_output_folder_is_named(images, checkpoint, tmp_path, capsys):
    """14: ``--out FILE`` where a folder is expected gave "[Errno 17] File exists"."""
    out = tmp_path / "caches"
    out.write_text("earlier notes\n")
    before = _hashes(out)
    line = _refused(capsys, ["predict", "--model", f"{ARCH}={checkpoint}", "--data",
                             str(images), "--out", str(out)])
    assert f"--out '{out}' is not a folder" in line
    assert _hashes(out) == before


def test_a_malformed_metadata_variable_is_named(tmp_path, write_cache, monkeypatch, capsys):
    """14: a malformed $UQVISION_MODEL_METADATA table was reported by file only."""
    y = np.arange(40) % 4
    write_cache(tmp_path / "caches", np.eye(4)[y] * 3.0, y, model="a")
    table = tmp_path / "mine.csv"
    table.write_text("key,family\nresnet50,ResNet\n")
    for value in (str(table), str(tmp_path / "missing.csv")):
        monkeypatch.setenv(METADATA_ENV, value)
        line = _refused(capsys, ["score", "selective", "--caches",
                                 str(tmp_path / "caches"), "--calibration-size", "0.5",
                                 "--out", str(tmp_path / "s.nc")])
        assert f"environment variable {METADATA_ENV}=" in line and value in line
    assert not (tmp_path / "s.nc").exists()


def test_commands_that_stopped_themselves_exit_2(digits, tmp_path, capsys):
    """13: train with several seeds but one --out, and plot with nothing to plot, exited with
    code 1 through SystemExit; every user mistake now exits 2 with one line."""
    line = _refused(capsys, ["train", "--arch", ARCH, "--data", str(digits / "train"), "--out",
                             str(tmp_path / "m.safetensors"), "--seeds", "0", "1"])
    assert "--out" in line and "{seed}" in line
    assert "nothing to plot" in _refused(capsys, ["plot", "--out", str(tmp_path / "fig")])
    assert not any(tmp_path.iterdir())
