"""Bad input to ``uqvision data MAKER``, ``uqvision split`` and ``uqvision demo`` (the audit of
the command line): ONE line on stderr naming the option as typed and the value, exit code 2,
no traceback, and nothing written or replaced before the refusal. The makers and the demo,
called from Python, refuse the same values naming the parameter."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from uqmetrics import InputError, write_dataset

from uqvision.cache import cache_dataset
from uqvision.cli import main
from uqvision.data.makers import digits_split, make_digits_folder, make_synthetic_folder
from uqvision.demo import DemoConfig, check_config


def _listing(folder) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# ---------------------------------------------------------------------------------------------
# uqvision split

N_CLASSES, PER_CLASS = 6, 5


@pytest.fixture
def embeddings(tmp_path):
    """A cache with embeddings of 6 classes in two far-apart groups (the Ward split's in and
    out classes: 3 each)."""
    rng = np.random.default_rng(0)
    means = np.concatenate([np.full((3, 4), 0.0), np.full((3, 4), 10.0)])
    means += 0.1 * rng.standard_normal(means.shape)
    y = np.repeat(np.arange(N_CLASSES), PER_CLASS)
    emb = means[y] + 0.01 * rng.standard_normal((len(y), 4))
    ds = cache_dataset(np.zeros((len(y), N_CLASSES)), y, samples=[f"s{i}" for i in range(len(y))],
                       classes=[f"c{i}" for i in range(N_CLASSES)], embedding=emb,
                       attrs={"model": "m", "dataset_name": "train", "mode": "plain",
                              "pass_index": 0})
    return write_dataset(ds, tmp_path / "emb.nc")


def _image_folder(root, classes, per_class=PER_CLASS):
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(root / c / f"{i}.png")
    return root


@pytest.fixture
def train(tmp_path):
    """The training folder of the embeddings' classes."""
    return _image_folder(tmp_path / "train", [f"c{i}" for i in range(N_CLASSES)])


def test_split_refuses_an_existing_out_unless_overwrite(embeddings, tmp_path, capsys, refused):
    """``--out`` an existing file was silently replaced (exit 0)."""
    out = tmp_path / "mine.json"
    out.write_text("my notes")
    line = refused(["split", "--embeddings", str(embeddings), "--out", str(out)])
    assert line == (f"uqvision split: error: --out '{out}' already exists; pass --overwrite to "
                    "replace it")
    assert out.read_text() == "my notes"
    assert main(["split", "--embeddings", str(embeddings), "--out", str(out),
                 "--overwrite"]) == 0
    assert '"in_classes"' in out.read_text()


@pytest.mark.parametrize("value", ["1.5", "0", "1", "-0.1", "nan"])
def test_split_refuses_a_val_fraction_outside_0_1(embeddings, train, tmp_path, capsys, value, refused):
    """``--val-fraction 1.5`` (and 0) was accepted."""
    out, index = tmp_path / "split.json", tmp_path / "index"
    line = refused(["split", "--embeddings", str(embeddings), "--out", str(out),
                             "--train", str(train), "--index-dir", str(index),
                             "--val-fraction", value])
    assert "argument --val-fraction:" in line and repr(value) in line, line
    assert not out.exists() and not index.exists()


def test_split_checks_train_before_writing(embeddings, tmp_path, capsys, refused):
    """``--train nope``: the split file was written first, then ``image folder 'nope' does not
    exist`` (no option named)."""
    out, index = tmp_path / "split.json", tmp_path / "index"
    missing = tmp_path / "nope"
    line = refused(["split", "--embeddings", str(embeddings), "--out", str(out),
                             "--train", str(missing), "--index-dir", str(index)])
    assert line.startswith(f"uqvision split: error: --train '{missing}' does not exist"), line
    assert not out.exists() and not index.exists()
    # a folder of other classes than the embeddings': refused before the split is written
    other = _image_folder(tmp_path / "other", ["a", "b"])
    line = refused(["split", "--embeddings", str(embeddings), "--out", str(out),
                             "--train", str(other), "--index-dir", str(index)])
    assert line.startswith(f"uqvision split: error: --train '{other}' "), line
    assert not out.exists() and not index.exists()
    # a folder without images
    (tmp_path / "empty").mkdir()
    line = refused(["split", "--embeddings", str(embeddings), "--out", str(out),
                             "--train", str(tmp_path / "empty"), "--index-dir", str(index)])
    assert line.startswith(f"uqvision split: error: --train '{tmp_path / 'empty'}': "), line
    assert not out.exists() and not index.exists()


def test_split_refuses_existing_index_files_unless_overwrite(embeddings, train, tmp_path,
                                                             capsys, refused):
    out, index = tmp_path / "split.json", tmp_path / "index"
    argv = ["split", "--embeddings", str(embeddings), "--out", str(out), "--train", str(train),
            "--index-dir", str(index)]
    assert main(argv) == 0
    assert sorted(p.name for p in index.iterdir()) == ["seed0.train.json", "seed0.val.json"]
    out.unlink()
    before = {p.name: p.read_bytes() for p in index.iterdir()}
    line = refused(argv)
    assert line == (f"uqvision split: error: --index-dir '{index}': "
                    f"'{index / 'seed0.train.json'}' already exists; pass --overwrite to "
                    "replace it")
    assert not out.exists() and {p.name: p.read_bytes() for p in index.iterdir()} == before
    assert main([*argv, "--overwrite"]) == 0 and out.is_file()


# ---------------------------------------------------------------------------------------------
# uqvision data MAKER


@pytest.mark.parametrize(("argv", "flag", "value"), [
    (["synthetic", "--n-classes", "0"], "--n-classes", "0"),
    (["synthetic", "--n-per-class", "-1"], "--n-per-class", "-1"),
    (["synthetic", "--image-size", "0"], "--image-size", "0"),
    (["digits", "--max-per-class", "-3"], "--max-per-class", "-3"),
    (["digits", "--max-per-class", "0"], "--max-per-class", "0"),
    (["digits", "--test-fraction", "0"], "--test-fraction", "0"),
    (["digits", "--test-fraction", "1"], "--test-fraction", "1"),
    (["digits", "--test-fraction", "-0.2"], "--test-fraction", "-0.2"),
    (["digits", "--seed", str(2**32)], "--seed", str(2**32)),
    (["imagenet-c", "--src", "SRC", "--corruptions", "fog", "--severities", "9"],
     "--severities", "9"),
    (["imagenet-c", "--src", "SRC", "--corruptions", "fog", "--severities", "1,x"],
     "--severities", "1,x"),
    (["imagenet-c", "--src", "SRC", "--corruptions", "fog", "--severities", "1",
      "--quality", "500"], "--quality", "500"),
    (["imagenet-c", "--src", "SRC", "--corruptions", "fogg", "--severities", "1"],
     "--corruptions", "fogg"),
])
def test_data_refuses_bad_values_naming_the_option(tmp_path, capsys, argv, flag, value, refused):
    """Counts below 1 wrote an empty dataset marked complete (synthetic) or acted as a slice
    (digits); fractions outside (0, 1) and bad severities or qualities were scikit-learn's or
    the maker's messages, naming no option."""
    src = _image_folder(tmp_path / "src", ["a", "b"], per_class=1)
    out = tmp_path / "out"
    argv = [a.replace("SRC", str(src)) for a in argv]
    line = refused(["data", argv[0], "--out", str(out), *argv[1:]])
    assert line.startswith(f"uqvision data {argv[0]}: error: argument {flag}"), line
    assert value in line, line
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--per-class", "--n-per-class"])
def test_data_subset_names_per_class(tmp_path, capsys, flag, refused):
    """``per_class must be at least 1`` named the Python parameter, not the option."""
    src = _image_folder(tmp_path / "src", ["a", "b"], per_class=2)
    out = tmp_path / "out"
    line = refused(["data", "subset", "--out", str(out), "--src", str(src), flag, "0"])
    assert line.startswith("uqvision data subset: error: argument --n-per-class/--per-class: "), \
        line
    assert "got 0" in line
    line = refused(["data", "subset", "--out", str(out), "--src", str(src), flag, "3"])
    assert "(--per-class)" in line and "3 exceeds the 2 images of class 'a'" in line, line
    assert not out.exists()


@pytest.mark.parametrize("maker", ["subset", "imagenet-c"])
def test_data_checks_src_before_the_maker(tmp_path, capsys, maker, refused):
    """``--src nope`` said ``image folder 'nope' does not exist``, naming no option."""
    out, missing = tmp_path / "out", tmp_path / "nope"
    line = refused(["data", maker, "--out", str(out), "--src", str(missing)])
    assert line.startswith(f"uqvision data {maker}: error: --src '{missing}' does not exist"), \
        line
    assert not out.exists()


def test_makers_refuse_bad_values_naming_the_parameter(tmp_path):
    """From Python: the same values refused before anything is written, naming the
    parameter."""
    for kw, name in (({"n_classes": 0}, "n_classes"), ({"n_per_class": -1}, "n_per_class"),
                     ({"image_size": 0}, "image_size")):
        with pytest.raises(InputError, match=f"{name} must be an integer >= 1"):
            make_synthetic_folder(tmp_path / "syn", **kw)
    for kw, name in (({"test_fraction": 1.0}, "test_fraction"),
                     ({"test_fraction": 0}, "test_fraction"),
                     ({"max_per_class": -3}, "max_per_class"),
                     ({"max_per_class": 0}, "max_per_class"),
                     ({"seed": 2**32}, "seed")):
        with pytest.raises(InputError, match=name):
            make_digits_folder(tmp_path / "dig", **kw)
    with pytest.raises(InputError, match=r"test_fraction \(--test-fraction\) 0.5 with "
                                         r"max_per_class \(--max-per-class\) 1: "):
        make_digits_folder(tmp_path / "dig", max_per_class=1)
    assert not (tmp_path / "syn").exists() and not (tmp_path / "dig").exists()
    train, test = digits_split(0.5, 0, 4)
    assert (len(train), len(test)) == (20, 20) and not set(train) & set(test)


# ---------------------------------------------------------------------------------------------
# uqvision demo


def test_demo_checks_the_architecture_before_writing(tmp_path, capsys, refused):
    """``--arch nope``: ``OUT/data/digits`` and ``demo.json`` were written, then ``unknown
    timm model 'nope'``."""
    out = tmp_path / "demo"
    line = refused(["demo", "--out", str(out), "--arch", "nope"])
    assert line.startswith("uqvision demo: error: --arch 'nope': unknown timm model 'nope'"), line
    assert not out.exists()
    out.mkdir()
    (out / "notes.md").write_text("mine")
    for argv, start in ((["--arch", "resnet10t.c3_in1k"], "--arch 'resnet10t.c3_in1k': "),
                        (["--arch", "tv/resnet18"], "--arch 'tv/resnet18': "),
                        (["--max-per-class", "1"], "--max-per-class 1: "),
                        (["--seed", str(2**32)], f"--seed {2**32}: "),
                        (["--max-per-class", "10", "--calibration-size", "50"],
                         "--calibration-size 50.0: ")):
        line = refused(["demo", "--out", str(out), *argv])
        assert line.startswith(f"uqvision demo: error: {start}"), line
        assert _listing(out) == ["notes.md"]


def test_demo_config_check_names_the_field():
    check_config(DemoConfig())  # the defaults run
    check_config(DemoConfig(max_per_class=10, calibration_size=0.4, members=1))
    with pytest.raises(InputError, match="^arch 'nope': unknown timm model"):
        check_config(DemoConfig(arch="nope"))
    with pytest.raises(InputError, match="^members 0: must be an integer >= 1"):
        check_config(DemoConfig(members=0))
    with pytest.raises(InputError, match="^--arch 'nope': "):
        check_config(DemoConfig(arch="nope"), {"arch": "--arch"})
