"""``uqvision evaluate`` and unreadable images (image-folder audit F6, F7).

- F6: a set holding a truncated JPEG was refused only once the run had made ``caches/`` (and,
  for an OOD set, written ``content_hashes/pixels-*.json``), and the refusal advised
  ``--skip-bad-images``, an option evaluate does not have. Now every set the models predict
  has its images checked when the plan is made, before anything is written (``--dry-run``
  too): one line naming the file and the set's table, advising ``[predict] skip-bad-images =
  true``; the output folder is never made.
- F7: with ``[predict] skip-bad-images = true`` the evaluation did not say which images it left
  out, as ``uqvision predict`` and ``sweep`` do; now it says so in their words, once per set
  (an expanded set's members together).

Real ``uqvision evaluate`` runs, in process, the sweep on test_sweep_sets.py's thread-based
Dask cluster: a random-init network on a few digits.
"""

from __future__ import annotations

import io
import json
import shutil

import pytest
import xarray as xr
from PIL import Image
from test_sweep_sets import _dask_globals_kept, client  # noqa: F401  (fixtures)

from uqvision.cli import main
from uqvision.data import make_digits_folder, make_synthetic_folder
from uqvision.data.corruptions import make_corrupted_folder

HEAD = """
out = "out"
models = ["test_byobnet"]
[predict]
random-init = true
batch-size = 8
{predict}
[sets.test]
role = "test"
path = "digits/test"
"""
SELECTIVE = "[protocols.selective]\ncalibration-size = 0.3\n"


def _truncated_jpeg(path) -> None:
    """Half of a JPEG's bytes: its header reads, its pixels do not."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buf, "JPEG")
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """``digits/test`` (15 images), ``noise`` (an OOD folder) and ``digits-c`` (two ImageNet-C
    members made from the test set), all readable."""
    root = tmp_path_factory.mktemp("images")
    digits = make_digits_folder(root / "digits", max_per_class=3)
    make_synthetic_folder(root / "noise", n_classes=1, n_per_class=6, image_size=16)
    make_corrupted_folder(digits / "test", root / "digits-c", corruptions=("brightness",),
                          severities=(1, 3), resize=32, crop=32, progress=False)
    return root


@pytest.fixture
def broken(root, tmp_path):
    """A copy of ``root`` whose folders can be damaged by a test."""
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    return copy


def _toml(root, text: str, predict: str = "") -> str:
    path = root / "eval.toml"
    path.write_text(HEAD.format(predict=predict) + text)
    return str(path)


def _err_lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(("where", "sets"), [
    ("digits/test/3", SELECTIVE),
    ("noise/test/class_000", ('[sets.far]\nrole = "ood-far"\npath = "noise/test"\n'
                              '[protocols.ood]\ndetectors = ["msp"]\n')),
])
def test_a_truncated_jpeg_is_refused_naming_the_set_before_anything_is_written(
        broken, client, capsys, where, sets):  # noqa: F811
    """The test set's, or an OOD set's (whose content hashes were written first)."""
    _truncated_jpeg(broken / where / "bad.jpg")
    toml = _toml(broken, sets)
    table = "[sets.test]" if where.startswith("digits") else "[sets.far]"
    for argv in (["--scheduler", client.scheduler.address, "--no-figures"], ["--dry-run"]):
        assert main(["evaluate", toml, *argv]) == 2
        assert not (broken / "out").exists(), sorted((broken / "out").rglob("*"))
        (line,) = _err_lines(capsys)
        assert line.startswith(f"uqvision evaluate: error: {toml}: {table}: "), line
        assert f"{str(broken / where / 'bad.jpg')!r}: truncated" in line, line
        assert "[predict] skip-bad-images = true" in line and "--skip-bad-images" not in line


def test_the_images_left_out_are_said_once_per_set_and_recorded(broken, client, capsys):  # noqa: F811
    _truncated_jpeg(broken / "digits" / "test" / "3" / "bad.jpg")
    toml = _toml(broken, SELECTIVE, "skip-bad-images = true")
    said = (f"uqvision evaluate: {toml}: [predict] skip-bad-images: 1 unreadable image(s) of "
            f"[sets.test] {str(broken / 'digits' / 'test')!r} left out: 3/bad.jpg: truncated")
    assert main(["evaluate", toml, "--dry-run"]) == 0
    left = [line for line in _err_lines(capsys) if "left out" in line]
    assert len(left) == 1 and left[0].startswith(said), left
    assert main(["evaluate", toml, "--scheduler", client.scheduler.address,
                 "--no-figures"]) == 0
    left = [line for line in _err_lines(capsys) if "left out" in line]
    assert len(left) == 1 and left[0].startswith(said), left
    (cache,) = (broken / "out" / "caches").glob("*.nc")
    with xr.open_dataset(cache) as ds:
        assert list(json.loads(ds.attrs["skipped_images"])) == ["3/bad.jpg"]
        assert ds.sizes["sample"] == 15


def test_an_expanded_sets_members_are_said_together(broken, capsys):
    """ImageNet-C's members are one set: one line, its images named from the set's path."""
    for member in ("brightness/1", "brightness/3"):
        _truncated_jpeg(broken / "digits-c" / member / "3" / "bad.jpg")
    toml = _toml(broken, '[sets.c]\nset = "imagenet-c"\npath = "digits-c"\n'
                         "[protocols.shift]\n", "skip-bad-images = true")
    assert main(["evaluate", toml, "--dry-run"]) == 0
    left = [line for line in _err_lines(capsys) if "left out" in line]
    assert len(left) == 1, left
    assert f"2 unreadable image(s) of [sets.c] {str(broken / 'digits-c')!r} left out: " \
        "brightness/1/3/bad.jpg: truncated" in left[0], left
    assert "; brightness/3/3/bad.jpg: truncated" in left[0], left
