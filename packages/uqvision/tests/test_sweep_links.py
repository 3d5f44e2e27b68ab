"""``uqvision sweep --out THEIR`` on a folder received from someone else (links left open after
the security audit's F3): a symbolic link where the sweep writes inside ``--out``
(``caches/``, the shared decoding's ``caches/.decoded``, ``content_hashes/``, ``sweep.log``,
``scores/``, ``plots/``) is refused before any work, ``--dry-run`` included, in one line naming
``--out``, the link and where it points; nothing is written or appended behind it. Before, the
caches, the content hashes of the OOD check and the log went where the links pointed.

Real ``uqvision sweep`` runs, in process, on test_sweep_sets.py's thread-based Dask cluster: a
random-init network on a few digits and an OOD folder of noise.
"""

from __future__ import annotations

import pytest
from test_sweep_sets import _dask_globals_kept, client  # noqa: F401  (fixtures)
from uqmetrics.runs.testing.filesystems import planted_link

from uqvision.cli import main
from uqvision.data import make_digits_folder, make_synthetic_folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``digits/test`` (15 images) and ``noise/test`` (an OOD folder)."""
    root = tmp_path_factory.mktemp("sweep_links")
    make_digits_folder(root / "digits", max_per_class=3)
    make_synthetic_folder(root / "noise", n_classes=1, n_per_class=6, image_size=16)
    return root


def _sweep(data, out, *extra: str) -> int:
    return main(["sweep", "--models", "test_byobnet", "--random-init", "--batch-size", "8",
                 "--data", str(data / "digits" / "test"), "--ood-sets",
                 f"ood-far={data / 'noise' / 'test'}", "--calibration-size", "0.3",
                 "--out", str(out), *extra])


@pytest.mark.parametrize("name", ["caches", "caches/.decoded", "content_hashes", "sweep.log",
                                  "scores", "plots"])
def test_a_link_inside_out_is_refused_before_any_work(data, tmp_path, client, capsys,  # noqa: F811
                                                      name):
    their, outside = tmp_path / "their", tmp_path / "outside"
    link, target, victim = planted_link(their, name, outside, to_file=name == "sweep.log")
    for extra in (["--scheduler", client.scheduler.address], ["--dry-run"]):
        assert _sweep(data, their, *extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err == (f"uqvision sweep: error: --out {str(their)!r}: {str(link)!r} is a link "
                       f"to {str(target)!r}: a command writes and deletes only inside its "
                       "output folder, never where a link there points; make it a folder of "
                       "its own, or choose another output folder\n"), err
        assert sorted(p.name for p in outside.iterdir()) == ["notes.txt"]
        assert victim.read_text() == "someone's"
        assert sorted(str(p.relative_to(their)) for p in their.rglob("*")) == sorted(
            {name, *(["caches"] if name == "caches/.decoded" else [])})


def test_a_received_folder_without_links_is_swept(data, tmp_path, client, capsys):  # noqa: F811
    """The check refuses links only: the same folders, real ones, are written."""
    their = tmp_path / "their"
    for name in ("caches/.decoded", "content_hashes", "scores", "plots"):
        (their / name).mkdir(parents=True)
    assert _sweep(data, their, "--scheduler", client.scheduler.address) == 0
    assert len(list((their / "caches").glob("*.nc"))) == 2
    assert list((their / "content_hashes").iterdir())
