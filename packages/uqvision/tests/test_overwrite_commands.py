"""``--overwrite`` of the commands that write a folder of results (issue 36 row 3 and
docs/conventions.md#overwrite-rules): ``uqvision report`` refuses an ``--out`` that holds one
of its result files, and replaces only a site it wrote."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from uqmetrics import stamp_result, write_dataset

from uqvision.cli import main


def _result(path):
    ds = xr.Dataset({"auroc": ("model", np.array([0.7, 0.8]))}, coords={"model": ["a", "b"]})
    return write_dataset(stamp_result(ds, "toy", input_checksums=["ab" * 32],
                                      metrics={"auroc": "auroc"}), path)


def test_report_refuses_an_out_holding_its_result_file(tmp_path, capsys):
    """``uqvision report RESULT --out DIR --overwrite`` with DIR holding RESULT deleted the
    input (and ``verify`` then disagreed); refused in one line, the file as it was."""
    site = tmp_path / "site"
    assert main(["report", str(_result(tmp_path / "first.nc")), "--out", str(site)]) == 0
    result = _result(site / "toy.nc")
    before = result.read_bytes()
    capsys.readouterr()
    assert main(["report", str(result), "--out", str(site), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err == (f"uqvision report: error: --out '{site}' holds the input result file "
                   f"'{result}': choose an --out that does not hold it\n")
    assert result.read_bytes() == before and (site / "index.html").is_file()


def test_report_overwrite_replaces_only_a_site_it_wrote(tmp_path, capsys):
    result = _result(tmp_path / "r.nc")
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "thesis.tex").write_text("mine")
    assert main(["report", str(result), "--out", str(folder), "--overwrite"]) == 2
    assert "is not a folder uqmetrics report wrote" in capsys.readouterr().err
    assert (folder / "thesis.tex").read_text() == "mine"
    site = tmp_path / "site"
    assert main(["report", str(result), "--out", str(site)]) == 0
    assert main(["report", str(result), "--out", str(site), "--overwrite"]) == 0
    assert (site / "index.html").is_file()


@pytest.mark.parametrize("protocol", ["conformal", "ood", "pitfalls", "selective", "shift",
                                      "uimnet"])
def test_reproduce_overwrite_deletes_nothing_it_did_not_write(tmp_path, capsys, protocol):
    """``uqvision reproduce NAME --out DIR --overwrite`` where DIR holds the user's own
    ``data/``, ``models/`` and ``caches/`` files: the stand-in data set replaced the user's
    ``data/`` folder whole, pitfalls deleted every file of ``models/`` and ``caches/``,
    selective removed those folders whole. Refused before any work (the stand-in is written
    only into a folder that is empty or the makers wrote), and every file stays."""
    out = tmp_path / "run"
    mine = {"data/thesis.tex": "mine", "models/notes.md": "mine", "caches/notes.md": "mine",
            "summary.md": "mine"}
    for name, text in mine.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    assert main(["--threads", "1", "reproduce", protocol, "--scale", "smoke", "--out",
                 str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / 'data'}' is not a folder uqvision data wrote" in err
    assert {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*")
            if p.is_file()} == mine


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["pitfalls", "selective"])
def test_a_reproduction_records_every_file_it_wrote(smoke_run, protocol):
    """What ``--overwrite`` deletes in a reproduction folder is its record: it lists every
    file the run wrote beside its stand-in data set (which has its own record). The session's
    smoke run, which the protocol's own tests may be rerunning in place in another process:
    a rerun rewrites the same files and records them, each through a temporary file beside it
    (:func:`uqmetrics.runs.io.temporary_beside`: ``.NAME.<32 hex digits>.tmp``), which is not
    a file of the run."""
    import re

    from uqmetrics.runs.io import WRITTEN_RECORD, written_files

    out, _ = smoke_run(protocol)
    temporary = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*")
               if p.is_file() and p.relative_to(out).parts[0] != "data"
               and not temporary.match(p.name)}
    recorded = set(written_files(out, f"uqvision reproduce {protocol}"))
    assert on_disk - {WRITTEN_RECORD} <= recorded
    assert any(f.startswith("caches/") for f in recorded)
    assert any(f.startswith("models/") for f in recorded)


@pytest.mark.parametrize("where", ["the cache itself", "inside the caches folder"])
def test_score_refuses_an_out_that_is_or_lies_in_its_caches(tmp_path, capsys, where):
    """``uqvision score NAME --caches C --out C --overwrite`` replaced the input cache with the
    score file; an ``--out`` inside a ``--caches`` folder would be read as a cache by the next
    score. Both refused before any work, in one line naming both, the cache as it was."""
    caches = tmp_path / "caches"
    caches.mkdir()
    cache = _result(caches / "m__val.nc")
    before = cache.read_bytes()
    given, out = ((str(cache), cache) if where == "the cache itself"
                  else (str(caches), caches / "selective.nc"))
    assert main(["score", "selective", "--caches", given, "--out", str(out),
                 "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the input --caches {given!r}" in err, err
    assert cache.read_bytes() == before and sorted(caches.iterdir()) == [cache]
