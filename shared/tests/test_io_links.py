"""Writes and deletes inside an output folder never follow a symbolic link there (security
audit F3): :func:`uqmetrics.runs.io.refuse_links`, the one check the commands make before any
work on what they create inside their output folder, and :func:`exclusive_lock`, which never
opens its lock file through a link (it truncates and writes it: through a link, the file it
points to)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from uqmetrics import InputError
from uqmetrics.runs.io import exclusive_lock, refuse_links, remove_files


@pytest.fixture
def tree(tmp_path) -> tuple[Path, Path]:
    """``out/`` (the user's output folder) and ``elsewhere/``, holding someone's file."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("someone's")
    return out, elsewhere


@pytest.mark.parametrize("link, names", [
    ("scores", ["caches", "scores"]),                  # a subfolder the command writes into
    ("plots", ["plots/selective"]),                    # a folder on the way
    ("plots/selective", ["plots/selective"]),          # a folder below a real one
    ("cells/.sweep.lock", ["cells", "cells/.sweep.lock"]),  # a file opened in place
])
def test_a_link_at_or_on_the_way_to_a_name_is_refused_naming_option_link_and_target(
        tree, link, names):
    out, elsewhere = tree
    at = out / link
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(elsewhere)
    with pytest.raises(InputError) as exc:
        refuse_links("--out", out, names)
    assert str(exc.value) == (
        f"--out {str(out)!r}: {str(at)!r} is a link to {str(elsewhere)!r}: a command writes "
        "and deletes only inside its output folder, never where a link there points; make "
        "it a folder of its own, or choose another output folder")


def test_missing_names_real_folders_and_a_linked_root_are_fine(tree, tmp_path):
    """What is missing is made by the command; ``--out`` itself is the user's choice."""
    out, _ = tree
    (out / "caches").mkdir()
    (out / "sweep.log").write_text("")
    refuse_links("--out", out, ["caches", "caches/.replaced", "scores", "sweep.log",
                                "sweep.log/x"])
    (tmp_path / "mine").symlink_to(out)
    refuse_links("--out", tmp_path / "mine", ["caches", "scores"])
    refuse_links("--out", tmp_path / "missing", ["caches"])


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tree):
    """The lock was opened through the link, truncated, written with its holder and then
    the link removed: the file it pointed to lost its content."""
    out, elsewhere = tree
    lock = out / ".evaluate.lock"
    lock.symlink_to(elsewhere / "precious.txt")
    with pytest.raises(InputError, match=r"\.evaluate\.lock' is a link to .*precious\.txt'"), \
            exclusive_lock(lock):
        pass
    assert (elsewhere / "precious.txt").read_text() == "someone's"
    assert os.path.islink(lock)


def test_unlinking_a_link_removes_the_link_not_its_target(tree):
    """What the commands rely on when they remove their own out-of-date files."""
    out, elsewhere = tree
    (out / "table.csv").symlink_to(elsewhere / "precious.txt")
    remove_files(out, ["table.csv"])  # how the commands remove their own files
    assert not os.path.lexists(out / "table.csv")
    assert (elsewhere / "precious.txt").read_text() == "someone's"
