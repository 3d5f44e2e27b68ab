"""Cross-package: the installed ``uqvision`` and ``uqreg`` CLIs build a report site of a smoke
reproduction (the session's, ``conftest.selective_smoke``) and of a small swept study, and ``verify`` checks the site (every entry) and one
entry of it (``SITE#ENTRY_ID``); a result file changed after the site was built disagrees with
the manifest."""

from __future__ import annotations

import json
import shutil
import subprocess

import uqmetrics


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    exe = shutil.which(args[0])
    assert exe, f"the {args[0]} console script must be installed"
    return subprocess.run([exe, *args[1:]], check=False, capture_output=True, text=True,
                          timeout=timeout)


def test_uqvision_verify_a_site_and_one_entry(selective_smoke, tmp_path):
    # the shared smoke reproduction's score file, copied: this test changes it below
    site, scores = tmp_path / "site", tmp_path / "selective.nc"
    shutil.copyfile(selective_smoke / "scores" / "selective.nc", scores)
    res = _run("uqvision", "report", str(scores), "--out", str(site))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    manifest = json.loads((site / "manifest.json").read_text())
    ids = [e["id"] for e in manifest["entries"]]

    res = _run("uqvision", "verify", str(site))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"summary: {len(ids)} entries: {len(ids)} agree, 0 disagree" in res.stdout
    assert res.stdout.count("agree     manifest metrics:") == len(ids)

    res = _run("uqvision", "verify", f"{site}#{ids[-1]}")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert res.stdout.count("\nentry ") + res.stdout.startswith("entry ") == 1
    assert f"entry {ids[-1]} " in res.stdout

    # the result file rewritten with one value changed: its checksum is no longer the
    # manifest's, and that entry's recorded value no longer the recomputed one
    ds = uqmetrics.read_dataset(scores)
    row = manifest["entries"][-1]["row"]
    ds["auroc"].loc[{"model": row, "calibration": "none"}] += 1e-3
    uqmetrics.write_dataset(ds, scores, overwrite=True)
    res = _run("uqvision", "verify", f"{site}#{ids[-1]}")
    assert res.returncode == 1, res.stdout[-4000:]
    assert "disagree  result_checksum  manifest=" in res.stdout
    assert "disagree  manifest metrics: 1 of" in res.stdout
    assert "disagree  auroc[calibration=none]" in res.stdout

    res = _run("uqvision", "verify", f"{site}#no-such-entry")
    assert res.returncode == 2 and "no entry 'no-such-entry'" in res.stderr


def test_uqreg_verify_a_site_entry(tmp_path):
    out, site = tmp_path / "sweep", tmp_path / "site"
    res = _run("uqreg", "sweep", "--task", "sinusoid", "--complexities", "1", "--methods", "blr",
               "--recipes", "paper", "--repetitions", "4", "--chunk-repetitions", "2", "--quiet",
               "--no-plots", "--workers", "1", "--out", str(out))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = _run("uqreg", "report", str(out / "study.nc"), "--out", str(site))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ids = [e["id"] for e in json.loads((site / "manifest.json").read_text())["entries"]]
    assert ids == ["uqreg:blr"]
    res = _run("uqreg", "verify", f"{site}#uqreg:blr")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "summary: 1 entry: 1 agree, 0 disagree" in res.stdout
    assert res.stdout.count("cache ok  ") == 2
    # a study is uqreg's to verify: uqvision says so, in one line
    res = _run("uqvision", "verify", f"{site}#uqreg:blr")
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stderr.strip().endswith("is a result of uqreg, not of uqvision: verify it with "
                                       "uqreg verify")


def test_each_verify_refuses_what_is_not_its_own_in_one_line(tmp_path):
    """A file that is not netCDF is bad input (exit 2) for both CLIs; a uqvision site entry
    given to ``uqreg verify`` names the CLI that verifies it, with no internal error."""
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for tool in ("uqvision", "uqreg"):
        res = _run(tool, "verify", str(text))
        assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
        assert res.stderr == (f"{tool} verify: error: target {str(text)!r} is not a netCDF file "
                              "(a result .nc, a report site folder, or SITE#ENTRY_ID)\n")

    digits, caches, site = tmp_path / "digits", tmp_path / "caches", tmp_path / "site"
    scores = tmp_path / "sel.nc"
    for args in (("data", "digits", "--out", str(digits), "--max-per-class", "2"),
                 ("--threads", "1", "predict", "--model", "test_vit", "--random-init",
                  "--data", str(digits / "test"), "--out", str(caches)),
                 ("score", "selective", "--caches", str(caches), "--out", str(scores),
                  "--calibration-size", "0.5"),
                 ("report", str(scores), "--out", str(site), "--no-figures")):
        res = _run("uqvision", *args)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    entry = json.loads((site / "manifest.json").read_text())["entries"][0]["id"]
    for target in (f"{site}#{entry}", str(site), str(scores)):
        res = _run("uqreg", "verify", target)
        assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
        (line,) = res.stderr.splitlines()
        assert line.endswith("is a result of uqvision, not of uqreg: verify it with uqvision "
                             "verify")
        assert "TypeError" not in res.stdout + res.stderr
