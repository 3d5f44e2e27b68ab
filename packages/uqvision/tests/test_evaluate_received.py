"""``uqvision evaluate`` on files and folders received from someone else (security audit F2,
F3): a file is data, so nothing in it, nor in an output folder it comes with, may have the
evaluation write or delete outside the folder the user named.

- F2: an evaluation file whose ``out`` is absolute, has a ``..`` part or leads out of the
  file's folder through a link is refused in one line naming the file, the key and the value,
  and saying to pass ``--out``; nothing is written there. ``--out`` on the command line is
  the user's, and is taken; a relative ``out`` inside the file's folder means what it did.
- F3: a symbolic link inside the output folder where the evaluation writes (``caches/``,
  ``scores/``, ``plots/NAME``, ``caches/.replaced``, the log, the lock) is refused before any
  work, naming ``--out``, the link and where it points: the files behind it are untouched
  (before, the caches, scores and figures were written there, and a state file saying a score
  was being written had the victim's score files deleted and replaced).
- F3: a state file recording a score as being written (``"file": null``) no longer vouches
  for score files it did not record: they are refused as another's, unless ``--overwrite``.
  A run of this evaluation cut short there still resumes (its record names a mark it left in
  the output folder, whose identity a copy of the folder does not carry).
- Removing an out-of-date score file that is a link removes the link, not what it points to.

Real ``uqvision evaluate`` runs (in process, the sweep on a thread-based Dask cluster as
test_evaluate.py's), on the session's digits and trained network: one model, the test set,
the selective protocol.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_evaluate import _checkpoint
from test_sweep_sets import _dask_globals_kept, client  # noqa: F401  (fixtures)
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.evaluate import plan_evaluation, read_evaluation, run_evaluation

TOML = """
root = "{root}"
out = "{out}"
models = ["test_byobnet=models/m.safetensors"]
[sets.test]
role = "test"
path = "data/test"
[protocols.selective]
calibration-size = {size}
"""
#: The files of the selective score, as the victim's folder holds them.
SCORE_FILES = ("selective.nc", "selective.csv", "selective.json", "selective.config.toml")


@pytest.fixture(scope="module")
def repo(digits, trained, tmp_path_factory) -> Path:
    """``data/test`` (the digits' test split), ``models/m.safetensors`` and ``eval.toml``."""
    repo = tmp_path_factory.mktemp("received")
    (repo / "data").mkdir()
    (repo / "data" / "test").symlink_to(digits / "test")
    _checkpoint(trained, repo / "models", "m")
    _write(repo / "eval.toml", out="mine")
    return repo


def _write(toml: Path, *, out: str, root: str = ".", size: float = 0.25) -> Path:
    toml.parent.mkdir(parents=True, exist_ok=True)
    toml.write_text(TOML.format(root=root, out=out, size=size))
    return toml


def _evaluate(toml: Path, client, *extra: str) -> int:  # noqa: F811  (the fixture's name)
    return main(["evaluate", str(toml), "--scheduler", client.scheduler.address,
                 "--no-figures", *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("uqvision evaluate: error: ") and err.count("\n") == 1, err
    return err


def _victim(folder: Path) -> dict[str, bytes]:
    """Someone's score files (and a note) in ``folder``; what it holds, by name."""
    folder.mkdir(parents=True)
    for name in (*SCORE_FILES, "notes.txt"):
        (folder / name).write_bytes(f"someone's {name}".encode())
    return _held(folder)


def _held(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# -- F2: the output folder a file names ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "link"])
def test_an_out_leaving_the_files_folder_is_refused_naming_file_key_and_value(repo, tmp_path,
                                                                              kind, capsys):
    """``recv/their_eval.toml`` with ``out = "/abs/path"`` wrote the whole evaluation there;
    ``..`` and a link out of the file's folder did too."""
    target = tmp_path / "victim_out"
    value = {"absolute": str(target), "dotdot": "../victim_out", "link": "res"}[kind]
    if kind == "link":
        (tmp_path / "recv").mkdir()
        target.mkdir()
        (tmp_path / "recv" / "res").symlink_to(target)
    toml = _write(tmp_path / "recv" / "their_eval.toml", out=value, root=str(repo))
    for argv in (["--dry-run"], ["--no-figures", "--n-workers", "1"]):
        assert main(["evaluate", str(toml), *argv]) == 2
        err = _one_line(capsys)
        assert f"{toml}: key 'out' = {json.dumps(value)}: " in err, err
        assert "pass --out on the command line" in err, err
    assert not target.exists() or not any(target.iterdir())
    assert sorted(p.name for p in (tmp_path / "recv").iterdir()) == sorted(
        ["their_eval.toml", *(["res"] if kind == "link" else [])])


def test_out_on_the_command_line_is_taken_and_a_relative_out_means_what_it_did(repo, tmp_path):
    """``--out`` is the user's choice, anywhere; ``out`` inside the file's folder (below it,
    or through a link that stays inside) is relative to the file's folder, as before."""
    toml = _write(tmp_path / "recv" / "their_eval.toml", out="/elsewhere", root=str(repo))
    assert read_evaluation(toml, out=tmp_path / "mine").out == tmp_path / "mine"
    _write(toml, out="results/run", root=str(repo))
    assert read_evaluation(toml).out == tmp_path / "recv" / "results" / "run"
    (tmp_path / "recv" / "inside").mkdir()
    (tmp_path / "recv" / "here").symlink_to(tmp_path / "recv" / "inside")
    _write(toml, out="here/run", root=str(repo))
    assert read_evaluation(toml).out == tmp_path / "recv" / "here" / "run"


# -- F3: links inside the output folder ----------------------------------------------------------


@pytest.mark.parametrize("name", ["caches", "scores", "plots", "plots/selective", "site",
                                  "caches/.replaced", "content_hashes", "sweep.log",
                                  ".evaluate.lock"])
def test_a_link_inside_the_output_folder_is_refused_before_any_work(repo, tmp_path, name,
                                                                    capsys):
    """Each place the evaluation writes into, a link there (a dry run is refused as the run
    would be): one line naming --out, the link and where it points."""
    their, outside = tmp_path / "their", tmp_path / "outside"
    outside.mkdir()
    link = their / name
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    assert main(["evaluate", str(repo / "eval.toml"), "--out", str(their), "--dry-run"]) == 2
    err = _one_line(capsys)
    assert f"--out {str(their)!r}: {str(link)!r} is a link to " in err, err
    with pytest.raises(InputError, match="is a link to"):
        read_evaluation(repo / "eval.toml", out=their)
    assert not any(outside.iterdir())


def test_caches_scores_and_plots_linked_out_of_a_received_folder_stay_unwritten(
        repo, tmp_path, client, capsys):  # noqa: F811
    """The audit's ``their/``: caches, scores and plots linked to folders outside; the run
    wrote every cache, score file and figure there."""
    their, outside = tmp_path / "their", tmp_path / "outside"
    their.mkdir()
    for name in ("caches", "scores", "plots"):
        (outside / name).mkdir(parents=True)
        (their / name).symlink_to(outside / name)
    assert _evaluate(repo / "eval.toml", client, "--out", str(their)) == 2
    err = _one_line(capsys)
    assert f"{str(their / 'caches')!r} is a link to {str(outside / 'caches')!r}" in err
    assert [p for p in outside.rglob("*") if p.is_file()] == []


def test_a_state_saying_being_written_deletes_nothing_behind_a_linked_scores_folder(
        repo, tmp_path, client, capsys):  # noqa: F811
    """The audit's ``their2/``: ``scores -> victim_scores`` and a state recording the
    selective score as being written (``"file": null``): the run deleted the victim's
    selective.csv/.json and wrote its own in their place."""
    their2, victim = tmp_path / "their2", tmp_path / "outside2" / "victim_scores"
    before = _victim(victim)
    their2.mkdir()
    (their2 / "scores").symlink_to(victim)
    state = {"scores": {"selective": {"argv": [], "inputs": {}, "file": None,
                                      "figures": None}}}
    (their2 / "evaluate.state.json").write_text(json.dumps(state))
    assert _evaluate(repo / "eval.toml", client, "--out", str(their2)) == 2
    err = _one_line(capsys)
    assert f"--out {str(their2)!r}: {str(their2 / 'scores')!r} is a link to " \
        f"{str(victim)!r}" in err, err
    assert _held(victim) == before
    assert sorted(p.name for p in their2.iterdir()) == ["evaluate.state.json", "scores"]


# -- F3: a record of a score being written ---------------------------------------------------------


def test_score_files_a_state_says_are_being_written_are_another_s_without_its_mark(
        repo, tmp_path, client, capsys):  # noqa: F811
    """No link now: the received folder's own ``scores/`` holds someone's score files, and its
    state says they are being written by a run cut short. They are not taken for this
    evaluation's: refused (dry run and run), nothing deleted; ``--overwrite`` replaces them."""
    their = tmp_path / "their3"
    before = _victim(their / "scores")
    state = {"scores": {"selective": {"argv": [], "inputs": {}, "file": None, "figures": None,
                                      "writing": {"name": ".selective.writing." + "0" * 32,
                                                  "id": [1, 2]}}}}
    (their / "evaluate.state.json").write_text(json.dumps(state))
    for extra in (["--dry-run"], []):
        assert _evaluate(repo / "eval.toml", client, "--out", str(their), *extra) == 2
        err = _one_line(capsys)
        assert f"{str(their / 'scores' / 'selective.nc')!r} exists, and evaluate.state.json " \
            "records it as being written, but by no run of this evaluation here" in err, err
        assert "pass --overwrite to replace it" in err
        assert _held(their / "scores") == before
    assert _evaluate(repo / "eval.toml", client, "--out", str(their), "--overwrite") == 0
    assert (their / "scores" / "selective.nc").read_bytes() != before["selective.nc"]
    assert (their / "scores" / "notes.txt").read_bytes() == before["notes.txt"]


class _Killed(Exception):
    """What :func:`_killed_after_writing` raises: the process died there."""


def _killed_after_writing(argv: list[str]) -> int:
    """The score command, the process killed once it has written its files (before the
    evaluation records them)."""
    assert main(argv) == 0
    raise _Killed


def test_a_run_cut_short_while_scoring_resumes_here_and_its_copy_is_refused(
        repo, tmp_path, client, capsys):  # noqa: F811
    """The evaluation's own record of a score being written names the mark it made in
    ``scores/``: a rerun finds it and rewrites the score (no mark left after); the same folder
    copied (its state, its files, a mark of another identity) is another's."""
    out = tmp_path / "cut"
    plan = plan_evaluation(read_evaluation(repo / "eval.toml", out=out))
    with pytest.raises(_Killed):
        run_evaluation(plan, command=_killed_after_writing, client=client, n_workers=1,
                       log=lambda line: None)
    record = json.loads((out / "evaluate.state.json").read_text())["scores"]["selective"]
    assert record["file"] is None and (out / record["writing"]["name"]).is_file()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, symlinks=True)
    capsys.readouterr()

    assert _evaluate(repo / "eval.toml", client, "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "score selective: the run writing it was cut short" in printed, printed
    assert not [p for p in out.rglob("*") if ".writing." in p.name]
    assert json.loads((out / "evaluate.state.json").read_text())["scores"]["selective"][
        "file"] is not None

    assert _evaluate(repo / "eval.toml", client, "--out", str(copy), "--dry-run") == 2
    assert "records it as being written, but by no run of this evaluation here" in \
        _one_line(capsys)


def test_an_out_of_date_score_file_that_is_a_link_is_removed_not_its_target(
        repo, tmp_path, client, capsys):  # noqa: F811
    """The evaluation's own score table replaced by a link to someone's file: the score
    recomputed (its options changed), the link is removed and the table written in its place;
    the file it pointed to is untouched."""
    out = tmp_path / "own"
    assert _evaluate(repo / "eval.toml", client, "--out", str(out)) == 0
    victim = tmp_path / "victim.csv"
    victim.write_text("someone's table")
    table = out / "scores" / "selective.csv"
    table.unlink()
    table.symlink_to(victim)
    toml = _write(tmp_path / "changed.toml", out="x", root=str(repo), size=0.3)
    capsys.readouterr()
    assert _evaluate(toml, client, "--out", str(out)) == 0
    assert "score selective: its options or sets changed" in capsys.readouterr().out
    assert victim.read_text() == "someone's table"
    assert not table.is_symlink() and table.read_text().startswith("model")
    assert not os.path.islink(out / "scores" / "selective.json")
