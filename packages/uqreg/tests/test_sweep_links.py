"""``uqreg sweep --out THEIR`` on a folder received from someone else (security audit F3): a
symbolic link where the sweep writes inside ``--out`` (``cells/``, its lock, the log) is
refused before any work, in one line naming ``--out``, the link and where it points; nothing
is written or truncated behind it. Before, the cells were written (and stale temporaries
removed) in the folder ``cells`` pointed to, and a linked lock file had its target truncated.
"""

from __future__ import annotations

import pytest
from uqmetrics import InputError
from uqmetrics.runs.testing.filesystems import planted_link

from uqreg import cli
from uqreg.study import StudyConfig
from uqreg.sweep import run_study_sweep

#: Two cells of the closed-form reference (no training), as tests/test_sweep.py's SWEEP.
SWEEP = ["sweep", "--task", "sinusoid", "--complexities", "1", "--methods", "blr", "--recipes",
         "paper", "--repetitions", "4", "--chunk-repetitions", "2", "--quiet", "--no-plots"]


@pytest.mark.parametrize("name", ["cells", "cells/.sweep.lock", "sweep.log"])
def test_a_link_inside_out_is_refused_and_nothing_is_written_behind_it(tmp_path, capsys,
                                                                       scheduler, name):
    their, outside = tmp_path / "their", tmp_path / "outside_cells"
    link, target, victim = planted_link(their, name, outside, to_file=name != "cells")
    code = cli.main([*SWEEP, "--out", str(their), "--scheduler", scheduler])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and f"--out {str(their)!r}: {str(link)!r} is a link to " \
        f"{str(target)!r}" in err, err
    assert sorted(p.name for p in outside.iterdir()) == ["notes.txt"]
    assert victim.read_text() == "someone's"
    assert not (their / "study.nc").exists()


def test_the_library_refuses_it_too_naming_the_option_given(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cells").symlink_to(tmp_path / "outside")
    with pytest.raises(InputError, match=r"^out_dir '.*run': '.*cells' is a link to "):
        run_study_sweep(StudyConfig(task="sinusoid", complexities=(1,), methods=("blr",),
                                    repetitions=2), tmp_path / "run", progress=False,
                        option="out_dir")
    assert not any((tmp_path / "outside").iterdir())
