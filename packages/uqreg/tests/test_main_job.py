"""The README's main job (``uqreg study --preset quick``) says what its numbers show.

The ``quick`` preset runs E.1 (sinusoid) and, beside it in ``OUT/styblinski_tang``, a companion
study of E.2 at d = 1. The summary states each method's fit to the noise-free truth: R² against
it and, where R² < 0, "fits the noise, not the function"; a closing table sets the two tasks side
by side. The tests run the preset for real at a small size (2 repetitions, 2 members, one
ensemble method, 300·c epochs): E.1's ensembles do not fit the truth, E.2's do.
"""

from __future__ import annotations

import re

import pytest
import uqmetrics

from uqreg import cli
from uqreg.diagnostics import FIT_R2, FIT_VERDICTS, fit_verdict
from uqreg.methods import Method
from uqreg.presets import PRESETS, TASK_FIELDS

#: The quick preset at a test's size: E.1 at f_main = 2 (where `sum`'s networks fit the noise)
#: and the E.2 companion at d = 1, the reference and one ensemble, recipe `sum`.
SMALL = ["--methods", "blr,ens", "--recipes", "sum", "--repetitions", "2", "--members", "2",
         "--complexities", "2", "--quiet", "--no-plots"]


@pytest.fixture
def no_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(Method, "run", fail)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """The quick preset, run small: (output folder, printed text)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("quick") / "run"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["study", "--preset", "quick", *SMALL, "--out", str(out)]) == 0
    return out, buf.getvalue()


def _row(text: str, task: str, method: str) -> str:
    """The summary row of ``method`` in ``task``'s table."""
    table = text.split(f"\n{task}: coverage in / out of distribution")[1]
    return next(line for line in table.splitlines() if line.split()[:1] == [method])


# ---------------------------------------------------------------------------------------------
# the verdicts


def test_fit_verdict_names_r2_against_the_truth():
    assert [fit_verdict(v) for v in (-0.64, -1e-9, 0.0, FIT_R2 - 1e-9, FIT_R2, 1.0)] == \
        ["noise", "noise", "poor", "poor", "fits", "fits"]
    assert FIT_VERDICTS["noise"] == "fits the noise, not the function"
    assert fit_verdict(float("nan")) == "unknown"
    assert fit_verdict(float("-inf")) == "noise"


# ---------------------------------------------------------------------------------------------
# the preset


def test_quick_preset_says_its_networks_fit_the_noise_and_has_an_e2_companion():
    quick = PRESETS.lookup("quick")
    assert "fit the noise, not the function" in quick.description
    assert "whose networks fit)" not in quick.description
    main = quick.config.resolved()
    assert (main.task, main.complexities, main.recipes) == ("sinusoid", (1, 2, 3), ("paper", "sum"))
    (comp,) = quick.companions
    cfg = comp.config.resolved()
    assert comp.folder == "styblinski_tang"
    assert (cfg.task, cfg.complexities) == ("styblinski_tang", (1,))
    # the same methods, sizes and recipes as the main study: only the task differs
    assert (cfg.methods, cfg.recipes, cfg.repetitions, cfg.train) == \
        (main.methods, main.recipes, main.repetitions, main.train)
    for name in PRESETS:
        PRESETS.lookup(name).config.resolved()
        for c in PRESETS.lookup(name).companions:
            c.config.resolved()


def test_options_apply_to_companions_except_the_task_ones(no_training):
    args = cli.build_parser().parse_args(["study", "--preset", "quick", "--complexities", "5", "--sigma", "0.1",
                                          "--n-train", "60", "--members", "4", "--repetitions", "3",
                                          "--recipes", "none"])
    (none, main), (comp, companion) = cli._studies_from_args(args)
    assert none is None and comp.folder == "styblinski_tang"
    assert (main.complexities, main.sigma, main.n_train) == ((5,), 0.1, 60)
    assert (companion.complexities, companion.sigma, companion.n_train) == ((1,), None, None)
    for cfg in (main, companion):
        assert (cfg.train.members, cfg.repetitions, cfg.recipes) == (4, 3, ("none",))
    assert set(TASK_FIELDS) == {"task", "complexities", "n_train", "sigma"}


def test_an_existing_companion_file_is_refused_before_training(tmp_path, capsys, no_training):
    out = tmp_path / "q"
    (out / "styblinski_tang").mkdir(parents=True)
    (out / "styblinski_tang" / "study.nc").write_bytes(b"old")
    assert cli.main(["study", "--preset", "quick", *SMALL, "--out", str(out)]) == 2
    assert "styblinski_tang/study.nc already exists" in capsys.readouterr().err
    assert not (out / "study.nc").exists()
    assert (out / "styblinski_tang" / "study.nc").read_bytes() == b"old"


# ---------------------------------------------------------------------------------------------
# the main job, run small


@pytest.mark.slow
def test_main_job_writes_both_studies(main_job):
    out, _ = main_job
    e1 = uqmetrics.read_dataset(out / "study.nc")
    e2 = uqmetrics.read_dataset(out / "styblinski_tang" / "study.nc")
    assert e1.attrs["task"] == "sinusoid" and list(e1.complexity.values) == [2]
    assert e2.attrs["task"] == "styblinski_tang" and list(e2.complexity.values) == [1]
    assert list(e1.method.values) == list(e2.method.values) == ["blr", "ens"]
    # the networks fit E.2's function and not E.1's (R² against the truth)
    assert float(e1.fit_r2.sel({"method": "ens"}).mean()) < 0
    assert float(e2.fit_r2.sel({"method": "ens"}).mean()) > 0.8


@pytest.mark.slow
def test_summary_states_r2_and_fits_the_noise_where_r2_is_negative(main_job):
    out, text = main_job
    e1 = uqmetrics.read_dataset(out / "study.nc")
    r2 = float(e1.fit_r2.sel({"recipe": "sum", "method": "ens"}).mean())
    row = _row(text, "sinusoid", "ens")
    assert f"R²{r2:>5.2f}" in row
    assert row.endswith("R² < 0: fits the noise, not the function")
    assert _row(text, "sinusoid", "blr").endswith(f"R² >= {FIT_R2:g}: fits the function")
    assert re.search(r"NO DEEP METHOD FITS THE TRUTH under recipe sum: R² -\d\.\d\d to -\d\.\d\d, below 0 for "
                     r"every deep method at every f_main - the networks fit the data's noise, not the function",
                     text), text
    assert "R² < 0: the prediction is further from the truth than the truth's own mean" in text


@pytest.mark.slow
def test_summary_shows_the_e2_networks_fit_beside_e1(main_job):
    out, text = main_job
    assert f"companion study styblinski_tang ({out / 'styblinski_tang' / 'study.nc'})" in text
    assert _row(text, "styblinski_tang", "ens").endswith(f"R² >= {FIT_R2:g}: fits the function")
    assert "every deep method fits the truth under recipe sum" in text
    contrast = text.split("the deep methods, per study and recipe")[1].splitlines()
    e1 = next(line for line in contrast if line.strip().startswith("sinusoid f_main=2, recipe sum:"))
    e2 = next(line for line in contrast if line.strip().startswith("styblinski_tang d=1, recipe sum:"))
    assert e1.endswith("- fits the noise, not the function") and "coverage" in e1
    assert e2.endswith("- fits the function")
