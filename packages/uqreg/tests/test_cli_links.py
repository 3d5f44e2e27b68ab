"""``uqreg study|sweep --preset quick --out THEIR`` on a folder received from someone else: a
symbolic link where any of the studies writes inside ``--out`` (a companion study's folder
``OUT/styblinski_tang``, a study's ``plots/``, a sweep's ``cells/`` and ``sweep.log``) is refused
before any study runs, in one line naming ``--out``, the link and where it points; nothing is
written behind it, and the main study has not run. Before, the companion's folder and the
``plots/`` folders were not checked (its study file and figures went where the links pointed),
and a companion sweep's ``cells`` link was refused only once the main study's work was done.

The studies are the closed-form reference alone (``--methods blr``): seconds.
"""

from __future__ import annotations

import pytest
from uqmetrics.runs.testing.filesystems import planted_link

from uqreg import cli

#: The quick preset (a main study and its companion in OUT/styblinski_tang), at its smallest.
QUICK = ["--preset", "quick", "--methods", "blr", "--recipes", "paper", "--repetitions", "2",
         "--quiet"]


@pytest.mark.parametrize(("command", "name"), [
    ("study", "styblinski_tang"), ("study", "plots"), ("study", "styblinski_tang/plots"),
    ("sweep", "styblinski_tang"), ("sweep", "styblinski_tang/cells"),
    ("sweep", "styblinski_tang/sweep.log"), ("sweep", "styblinski_tang/cells/.sweep.lock"),
])
def test_a_link_where_any_study_writes_is_refused_before_any_study_runs(
        tmp_path, capsys, scheduler, command, name):
    their, outside = tmp_path / "their", tmp_path / "outside"
    link, target, victim = planted_link(their, name, outside,
                                        to_file=name.endswith(("sweep.log", ".lock")))
    argv = [command, *QUICK, "--out", str(their),
            *(["--scheduler", scheduler] if command == "sweep" else [])]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert sorted(p.name for p in outside.iterdir()) == ["notes.txt"]
    assert victim.read_text() == "someone's"
    # the main study has not run: only the link, and the folders made to hold it
    assert sorted(str(p.relative_to(their)) for p in their.rglob("*")) == sorted(
        str(p.relative_to(their)) for p in (link, *link.parents) if their in p.parents)
    assert err.count("\n") == 1 and f"--out {str(their)!r}: {str(link)!r} is a link to " \
        f"{str(target)!r}" in err, err


def test_with_no_plots_a_plots_link_is_not_written_and_not_refused(tmp_path, capsys):
    """The check names what the run writes: --no-plots draws no figure."""
    their, outside = tmp_path / "their", tmp_path / "outside"
    outside.mkdir()
    (their / "styblinski_tang").mkdir(parents=True)
    (their / "styblinski_tang" / "plots").symlink_to(outside)
    assert cli.main(["study", *QUICK, "--no-plots", "--out", str(their)]) == 0
    assert (their / "study.nc").is_file() and (their / "styblinski_tang" / "study.nc").is_file()
    assert not any(outside.iterdir())
