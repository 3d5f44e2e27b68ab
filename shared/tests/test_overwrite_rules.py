"""What ``--overwrite`` may delete (docs/conventions.md#overwrite-rules): the shared helpers of
uqmetrics.runs.io every command uses. A folder is replaced only when the command wrote it (its
record of files, nothing else in it); files are deleted only from a record, each name checked
to stay inside the output first; an output holding an input, or inside one, is refused."""

from __future__ import annotations

import json
import os

import pytest

from uqmetrics import InputError
from uqmetrics.runs.io import (
    WRITTEN_RECORD,
    check_apart,
    folder_replaced,
    record_written,
    remove_files,
    remove_written,
    written_files,
)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _tree(folder) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_a_replaced_folder_honours_the_umask(tmp_path, mask):
    """``tempfile.mkdtemp`` made every replaced folder 0700 whatever the umask (issue 36 row
    8): it is made as ``mkdir`` makes a folder."""
    old = os.umask(mask)
    try:
        with folder_replaced(tmp_path / "out", writer="t") as tmp:
            (tmp / "sub").mkdir()
    finally:
        os.umask(old)
    for folder in (tmp_path / "out", tmp_path / "out" / "sub"):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o777 & ~mask)


def test_folder_replaced_replaces_only_a_folder_its_writer_wrote(tmp_path):
    """A folder without a record, with another writer's, or holding a file its record does
    not list is refused (before the block runs: nothing is written), and left as it was."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("mine")
    ran = []
    with pytest.raises(InputError, match=r"is not a folder t wrote .*'thesis.tex'"), \
            folder_replaced(out, writer="t") as tmp:
        ran.append(tmp)
    assert ran == [] and _tree(out) == {"thesis.tex": "mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    (out / "thesis.tex").unlink()
    with folder_replaced(out, writer="t") as tmp:
        (tmp / "a").mkdir()
        (tmp / "a" / "x.txt").write_text("1")
    assert written_files(out, "t") == ["a/x.txt"]
    with pytest.raises(InputError, match="not 'other'"), folder_replaced(out, writer="other"):
        pass
    (out / "a" / "notes.md").write_text("mine")
    (out / "run.config.toml").write_text("cfg")
    with pytest.raises(InputError, match=r"holds files t did not write \('a/notes.md', "
                                         r"'run.config.toml'\)"), \
            folder_replaced(out, writer="t"):
        pass
    (out / "a" / "notes.md").unlink()
    with folder_replaced(out, writer="t", also=["run.config.toml"]) as tmp:
        (tmp / "y.txt").write_text("2")
    assert _tree(out) == {"y.txt": "2", WRITTEN_RECORD: (out / WRITTEN_RECORD).read_text()}


def test_a_file_added_while_the_folder_is_written_is_not_deleted(tmp_path):
    out = tmp_path / "out"
    with folder_replaced(out, writer="t") as tmp:
        (tmp / "x.txt").write_text("1")
    with pytest.raises(InputError, match="'late.txt'"), folder_replaced(out, writer="t"):
        (out / "late.txt").write_text("someone else's")
    assert (out / "late.txt").read_text() == "someone else's" and (out / "x.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("name", ["../victim/keep.txt", "/abs/keep.txt", "a/../../victim",
                                  "", ".", 3, None])
def test_names_from_a_record_are_checked_before_any_path_is_built(tmp_path, name):
    """A tampered record naming a file outside the folder deletes nothing, anywhere."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("written")
    (out / WRITTEN_RECORD).write_text(json.dumps({
        "format": "uqmetrics.written", "version": 1, "writer": "t",
        "files": ["mine.txt", name]}))
    with pytest.raises(InputError, match="is not a file name inside"):
        remove_written(out, "t")
    with pytest.raises(InputError, match="is not a file name inside"):
        remove_files(out, ["mine.txt", name])
    assert (victim / "keep.txt").read_text() == "x" and (out / "mine.txt").exists()


def test_remove_files_follows_no_link_and_keeps_folders_with_other_files(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x.JPEG").write_text("theirs")
    out = tmp_path / "out"
    (out / "a" / "b").mkdir(parents=True)
    (out / "a" / "b" / "x.JPEG").write_text("ours")
    (out / "c").mkdir()
    (out / "c" / "x.JPEG").write_text("ours")
    (out / "c" / "notes.md").write_text("theirs")
    os.symlink(victim, out / "linked")
    os.symlink(victim / "x.JPEG", out / "link.JPEG")
    removed = remove_files(out, ["a/b/x.JPEG", "c/x.JPEG", "linked/x.JPEG", "link.JPEG",
                                 "missing.JPEG", "c"])
    assert sorted(p.relative_to(out).as_posix() for p in removed) == [
        "a/b/x.JPEG", "c/x.JPEG", "link.JPEG"]
    assert (victim / "x.JPEG").read_text() == "theirs"  # behind a link: not reached
    assert not (out / "a").exists()  # emptied: removed
    assert (out / "c" / "notes.md").read_text() == "theirs"


def test_record_written_and_remove_written(tmp_path):
    out = tmp_path / "out"
    (out / "m").mkdir(parents=True)
    for name in ("m/a.pt", "m/b.pt", "mine.txt"):
        (out / name).write_text(name)
    record_written(out, "run", [out / "m" / "a.pt"])
    record_written(out, "run", [out / "m" / "b.pt", out / "m" / "a.pt"])
    assert written_files(out, "run") == ["m/a.pt", "m/b.pt"]
    with pytest.raises(ValueError, match="is not inside"):
        record_written(out, "run", [tmp_path / "elsewhere.txt"])
    with pytest.raises(InputError, match="was written by 'run', not 'other'"):
        record_written(out, "other", [out / "mine.txt"])
    assert sorted(p.name for p in remove_written(out, "run")) == ["a.pt", "b.pt"]
    assert _tree(out) == {"mine.txt": "mine.txt"}  # the record and the emptied folder gone
    assert remove_written(out, "run") == []  # no record: nothing to delete


@pytest.mark.parametrize("out, inputs, match", [
    ("d", {"--src": "d"}, "--out '.*d' holds the input --src '.*d'"),
    ("d", {"--src": "d/sub"}, "holds the input --src"),
    ("d/out", {"--src": "d"}, "--out '.*d/out' lies inside the input --src '.*d'"),
    ("site", {"result file": ["r.nc", "site/r.nc"]}, "holds the input result file '.*site/r.nc'"),
    ("dlink/out", {"--src": "d"}, "lies inside the input --src"),  # through a link
])
def test_check_apart_refuses_an_output_holding_or_inside_an_input(tmp_path, out, inputs, match):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "d", tmp_path / "dlink")
    at = {k: ([tmp_path / p for p in v] if isinstance(v, list) else tmp_path / v)
          for k, v in inputs.items()}
    with pytest.raises(InputError, match=match):
        check_apart(tmp_path / out, at)


def test_check_apart_passes_siblings(tmp_path):
    check_apart(tmp_path / "out", {"--src": tmp_path / "src", "result file": [tmp_path / "r.nc"]})
    check_apart(tmp_path / "d-out", {"--src": tmp_path / "d"})  # a prefix is not a parent


def test_a_record_nested_past_the_stack_is_refused_as_not_a_record(tmp_path):
    """A tampered record of JSON nested past Python's stack (``[[[...``) raised a bare
    ``RecursionError``; it is not a record, named, with nothing deleted."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.txt").write_text("kept")
    (out / WRITTEN_RECORD).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="not a record of written files"):
        written_files(out, "t")
    assert (out / "x.txt").read_text() == "kept"
