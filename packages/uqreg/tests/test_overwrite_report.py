"""``uqreg report FILE --out SITE --overwrite`` (issue 36 row 3, the same as uqvision's):
an ``--out`` holding the study file is refused, the file kept (it replaced the folder whole,
the study with it)."""

from __future__ import annotations

from uqreg.cli import main

TINY = ["--task", "sinusoid", "--complexities", "1", "--methods", "blr", "--repetitions", "2",
        "--quiet"]


def test_report_refuses_an_out_holding_the_study_file(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["study", *TINY, "--out", str(run)]) == 0
    study = run / "study.nc"
    before = study.read_bytes()
    capsys.readouterr()
    for target in (study, run):  # the file, or its folder (FILE may be study.nc's folder)
        assert main(["report", str(target), "--out", str(run), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err == (f"uqreg report: error: --out '{run}' holds the input result file "
                       f"'{study}': choose an --out that does not hold it\n")
    assert study.read_bytes() == before
    assert main(["report", str(study), "--out", str(tmp_path / "site")]) == 0
