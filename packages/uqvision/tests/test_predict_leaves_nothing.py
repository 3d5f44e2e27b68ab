"""``uqvision predict --out DIR`` that fails leaves nothing behind: a refusal found once the
command had made ``DIR`` (a checkpoint's sidecar refused when the model loads, after the
caches' locks made the folder) left ``DIR`` there, empty. Now a folder the command made is
removed when it fails while it holds nothing, with the parents it made; a folder that was
there before is kept, and so is one that holds a cache written.
"""

from __future__ import annotations

import pytest

from uqvision.cli import main

ARCH = "test_byobnet"


@pytest.fixture
def refused_model(edited_run) -> str:
    """``ARCH=FILE`` of the session's trained network whose sidecar names a weight file in its
    ``pretrained_cfg``: refused when the model is loaded."""
    checkpoint, _ = edited_run({"file": "/tmp/x.pth"})
    return f"{ARCH}={checkpoint}"


def _predict(model: str, data, out) -> int:
    return main(["predict", "--model", model, "--data", str(data), "--out", str(out)])


def test_a_refused_predict_removes_the_folders_it_made(refused_model, digits, tmp_path,
                                                       capsys):
    out = tmp_path / "new" / "caches"
    assert _predict(refused_model, digits / "test", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision predict: error: ") and "pretrained_cfg" in err, err
    assert not (tmp_path / "new").exists(), sorted((tmp_path / "new").rglob("*"))


def test_a_folder_that_was_there_is_kept_with_what_it_holds(refused_model, digits, tmp_path,
                                                            capsys):
    for out in (tmp_path / "empty", tmp_path / "held"):
        out.mkdir()
    (tmp_path / "held" / "notes.txt").write_text("mine")
    for out in (tmp_path / "empty", tmp_path / "held"):
        assert _predict(refused_model, digits / "test", out) == 2
        assert out.is_dir()
    capsys.readouterr()
    assert not any((tmp_path / "empty").iterdir())
    assert [p.name for p in (tmp_path / "held").iterdir()] == ["notes.txt"]


def test_a_run_that_wrote_its_caches_keeps_its_folder(spec, digits, tmp_path):
    """Success: the folder made holds the caches and the configuration."""
    out = tmp_path / "made" / "caches"
    assert _predict(spec, digits / "test", out) == 0
    assert sorted(p.suffix for p in out.iterdir()) == [".nc", ".toml"]
