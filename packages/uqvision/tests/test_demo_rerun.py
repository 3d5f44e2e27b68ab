"""``uqvision demo`` rerun into the same ``--out``: the same options keep everything (nothing is
trained, predicted, scored or drawn again, nothing rewritten); other options are refused before
any work, naming the folder, what it holds and what was asked, unless ``--overwrite``, which
deletes what the demo recorded (and nothing else) and makes it again. Before, a rerun with
other epochs retrained the members silently, and every rerun rewrote the scores and figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from uqvision.cache import read_cache
from uqvision.cli import main
from uqvision.demo import OPTIONS_FILE, DemoConfig, run_demo
from uqvision.models import file_sha256, read_sidecar

SMALL = {"members": 1, "max_per_class": 10, "mc_passes": 2, "n_orders": 2,
         "calibration_size": 0.4}
CLI = ["--members", "1", "--max-per-class", "10", "--mc-passes", "2", "--n-orders", "2",
       "--calibration-size", "0.4"]


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and modification time (ns)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("uqvision demo: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.slow
def test_a_rerun_with_the_same_options_keeps_everything(tmp_path):
    first = run_demo(tmp_path, DemoConfig(epochs=1, **SMALL))
    before = _files(tmp_path)
    again = run_demo(tmp_path, DemoConfig(epochs=1, threads=2, **SMALL))  # threads: no option
    assert _files(tmp_path) == before  # no checkpoint, cache, score file or figure rewritten
    assert (first.trained, again.trained) == ([0], [])
    assert json.loads((tmp_path / OPTIONS_FILE).read_text())["options"]["epochs"] == 1
    assert (again.caches, again.selective, again.ensembles) == (
        first.caches, first.selective, first.ensembles)
    assert sorted(again.figures) == sorted(first.figures)


@pytest.mark.slow
def test_other_epochs_are_refused_and_overwrite_retrains(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--epochs", "1", *CLI]) == 0
    ckpt = out / "models" / "test_byobnet_m0.safetensors"
    sha = file_sha256(ckpt)
    (out / "notes.md").write_text("mine")  # files of the user's: --overwrite leaves them
    (out / "models" / "README").write_text("mine")
    capsys.readouterr()
    before = _files(out)

    assert main(["demo", "--out", str(out), "--epochs", "2", *CLI]) == 2
    err = _error(capsys)
    assert f"--out {str(out)!r}" in err
    assert "holds the demo of epochs=1; this run asks for epochs=2" in err and "--overwrite" in err
    assert _files(out) == before  # refused before any work

    assert main(["demo", "--out", str(out), "--epochs", "2", "--overwrite", *CLI]) == 0
    assert read_sidecar(ckpt)["train_config"]["epochs"] == 2
    assert file_sha256(ckpt) != sha
    caches = sorted((out / "caches").glob("*.nc"))
    assert len(caches) == 3
    for path in caches:  # every cache is of the network trained now
        assert read_cache(path).attrs["checkpoint_sha256"] == file_sha256(ckpt)
    assert json.loads((out / OPTIONS_FILE).read_text())["options"]["epochs"] == 2
    assert (out / "notes.md").read_text() == (out / "models" / "README").read_text() == "mine"

    # the options agree, but a member checkpoint was trained otherwise: refused too
    other = run_demo(tmp_path / "other", DemoConfig(epochs=1, **SMALL))
    for src in (other.checkpoints[0], other.checkpoints[0].with_suffix(".json")):
        shutil.copyfile(src, out / "models" / src.name)
    capsys.readouterr()
    assert main(["demo", "--out", str(out), "--epochs", "2", *CLI]) == 2
    err = _error(capsys)
    assert f"the member checkpoint {str(ckpt)!r}, trained with epochs=1; this run trains " \
           "epochs=2" in err


def test_a_folder_of_unrecorded_demo_files_is_refused_even_with_overwrite(tmp_path, capsys):
    """A demo of an earlier uqvision recorded neither its options nor its files: the demo
    cannot tell what made them, and ``--overwrite`` deletes only what it recorded."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "test_byobnet_m0.safetensors").write_bytes(b"earlier")
    for extra in ([], ["--overwrite"]):
        assert main(["demo", "--out", str(tmp_path), *extra, *CLI]) == 2
        err = _error(capsys)
        assert f"--out {str(tmp_path)!r}" in err and "models/test_byobnet_m0.safetensors" in err
        assert f"no {OPTIONS_FILE}" in err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "models", "models/test_byobnet_m0.safetensors"]  # nothing made, nothing deleted
    assert (tmp_path / "models" / "test_byobnet_m0.safetensors").read_bytes() == b"earlier"
