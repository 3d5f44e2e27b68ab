"""``uqreg plot`` (and ``uqreg report``) on every result file uqreg writes, read back from disk.

One dispatch from a file to its figures (:data:`uqreg.plots.RESULT_KINDS`): a study, a
real-data study (``uqreg real``), a disentanglement study (``uqreg reproduce disentangle``) and a
reference (``uqreg reference --out``) each plot; a 2-D (E.3) study read back from netCDF plots
(its ``train_box`` attr comes back as JSON text); each figure's path is printed as it is written;
a single complexity level is a single integer tick.
"""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import pytest
import uqmetrics

from uqreg import cli, plots
from uqreg.study import StudyConfig, run_study

#: A PNG this small holds no figure (an empty canvas is ~1 kB at our sizes).
MIN_PNG_BYTES = 5_000


def _pngs(folder, names):
    """Assert ``folder`` holds exactly the PNG ``names``, each a real figure."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    for name in names:
        data = (folder / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > MIN_PNG_BYTES, name


def _plot(capsys, path, out, *extra):
    capsys.readouterr()
    code = cli.main(["plot", str(path), "--out", str(out), *extra])
    got = capsys.readouterr()
    assert code == 0, got.err
    assert "Traceback" not in got.err
    return got.out


def _study_file(tmp_path_factory, task: str, complexity: int):
    """A study of the exact reference alone (2 repetitions) written to disk."""
    path = tmp_path_factory.mktemp(task) / "study.nc"
    ds = run_study(StudyConfig(task=task, complexities=(complexity,), methods=("blr",), repetitions=2),
                   progress=False)
    uqmetrics.write_dataset(ds, path)
    return path


@pytest.fixture(scope="module")
def e3_file(tmp_path_factory):
    """An E.3 (2-D polynomial, d = 2) study written to disk and read back."""
    return _study_file(tmp_path_factory, "polynomial", 2)


@pytest.fixture(scope="module")
def e1_file(tmp_path_factory):
    """A 1-D (sinusoid, f_main = 1) study on disk."""
    return _study_file(tmp_path_factory, "sinusoid", 1)


def test_train_box_is_read_back_from_netcdf(e3_file):
    ds = uqmetrics.read_dataset(e3_file)
    assert isinstance(ds.attrs["train_box"], str)  # JSON text on disk, e.g. "[1.0, 4.0]"
    assert plots.train_box(ds) == (1.0, 4.0)
    with pytest.raises(ValueError, match="train_box attr must be two numbers"):
        plots.train_box(ds.assign_attrs(train_box="[1.0]"))


def test_plot_draws_an_e3_study_read_from_disk(e3_file, tmp_path, capsys):
    """Before: coverage_map_c2.png, then ``error: box must be (x_low, x_high, y_low, y_high),
    got ('[', '1', '.', '0', ...)``, exit code 2."""
    out = _plot(capsys, e3_file, tmp_path / "figs")
    names = ["coverage_map_c2.png", "conditional_coverage_c2.png", "conditional_vs_complexity.png"]
    _pngs(tmp_path / "figs", names)
    assert out.count("wrote ") == 3


def test_report_draws_the_figures_of_an_e3_study(e3_file, tmp_path, capsys):
    """Before: a site with no figures and a warning, exit code 0."""
    capsys.readouterr()
    assert cli.main(["report", str(e3_file), "--out", str(tmp_path / "site")]) == 0
    out = capsys.readouterr().out
    assert "3 figures" in out and "figures not drawn" not in out
    assert (tmp_path / "site" / "uqreg.html").read_text().count("data:image/svg+xml;base64,") == 3


def test_each_figure_is_printed_as_it_is_written(e1_file, tmp_path, capsys, monkeypatch):
    """The first figure's path is on stdout before the last figure is drawn (before: every path
    after the last figure); under ``--quiet`` one line for them all."""
    seen = []
    draw = plots.plot_conditional_vs_complexity

    def spy(*args, **kwargs):
        seen.append(capsys.readouterr().out)
        return draw(*args, **kwargs)

    monkeypatch.setattr(plots, "plot_conditional_vs_complexity", spy)
    rest = _plot(capsys, e1_file, tmp_path / "figs")
    assert len(seen) == 1
    assert f"wrote {tmp_path / 'figs' / 'bands_c1.png'}\n" in seen[0]
    assert f"wrote {tmp_path / 'figs' / 'conditional_coverage_c1.png'}\n" in seen[0]
    assert rest == f"wrote {tmp_path / 'figs' / 'conditional_vs_complexity.png'}\n"
    quiet = _plot(capsys, e1_file, tmp_path / "quiet", "--quiet")
    assert quiet == f"wrote 3 figures to {tmp_path / 'quiet'}\n"


def test_plot_and_report_draw_a_real_data_study(tmp_path, capsys):
    """``uqreg real``'s study.nc (here written by its library functions): before, ``is not a uqreg
    study``, exit code 2."""
    from uqreg.real import REAL_TRAIN, RealConfig, run_real, write_real

    ds = run_real(RealConfig(n_splits=2, methods=("blr",), train=replace(REAL_TRAIN, members=2, epochs=2,
                                                                          mc_samples=3)), progress=False)
    path = write_real(ds, tmp_path / "real" / "study.nc")
    out = _plot(capsys, path.parent, tmp_path / "figs")  # the folder: its study.nc
    _pngs(tmp_path / "figs", ["real_calibration.png", "real_scores.png"])
    assert out.count("wrote ") == 2
    assert plots.result_kind(uqmetrics.read_dataset(path)).name == "real"
    assert cli.main(["report", str(path), "--out", str(tmp_path / "site")]) == 0
    assert "2 figures" in capsys.readouterr().out


def test_plot_draws_a_disentanglement_study(tmp_path, capsys):
    """``uqreg reproduce disentangle``'s OUT/<task>/study.nc: its variances and leakage figures
    (before: drawn only inside the driver, ``is not a uqreg study`` from uqreg plot). ``uqreg
    report`` says in one line that it has no leaderboard and names uqreg plot."""
    from uqreg.disentangle import SCALES, run_task

    scale = replace(SCALES.lookup("smoke"), name="tiny", tasks={"sinusoid_het": (1,)}, methods=("ens+mv",),
                    repetitions=2)
    run_task(scale, "sinusoid_het", tmp_path / "sinusoid_het", progress=False)
    path = tmp_path / "sinusoid_het" / "study.nc"
    _plot(capsys, path, tmp_path / "figs")
    _pngs(tmp_path / "figs", ["disentangle_sinusoid_het_variances.png", "disentangle_sinusoid_het_leakage.png"])
    assert cli.main(["report", str(path), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "uqreg plot" in err and "Traceback" not in err


@pytest.mark.parametrize(("task", "complexity"), [("sinusoid_het", 1), ("polynomial", 2)])
def test_plot_draws_a_reference(tmp_path, capsys, task, complexity):
    """``uqreg reference --out ref.nc``: the exact posterior's predictive band and its aleatoric
    and epistemic parts against x (a 2-D grid along its diagonal); before: ``is not a uqreg
    study``."""
    path = tmp_path / "ref.nc"
    assert cli.main(["reference", "--task", task, "--complexity", str(complexity), "--repetitions", "2",
                     "--out", str(path)]) == 0
    _plot(capsys, path, tmp_path / "figs")
    _pngs(tmp_path / "figs", ["reference.png"])
    fig = plots.plot_reference(uqmetrics.read_dataset(path))
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert labels[:2] == ["aleatoric σ²(x)", "epistemic"]
    plt.close(fig)


def test_a_file_of_no_kind_is_refused_naming_it(tmp_path, capsys):
    import xarray as xr

    path = tmp_path / "other.nc"
    uqmetrics.write_dataset(xr.Dataset({"logits": (("n", "class"), [[0.0, 1.0]])}), path)
    assert cli.main(["plot", str(path), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"uqreg plot: error: {path} is not a uqreg study or result file (written by ")
    assert err.count("\n") == 1 and "uqreg real" in err and "uqreg reference --out" in err
    assert not (tmp_path / "figs").exists()


def test_a_single_complexity_level_is_one_integer_tick():
    """fig_recipes_e3: the E.3 recipe study has d = 2 only (before: ticks 1.90, 1.925, 1.95, ...)."""
    ds = run_study(StudyConfig(task="polynomial", complexities=(2,), methods=("blr",), recipes=("paper", "none"),
                               repetitions=2), progress=False)
    for fig in (plots.plot_recipes(ds), plots.plot_conditional_vs_complexity(ds)):
        fig.canvas.draw()
        for ax in fig.axes:
            if ax.get_visible() and ax.get_xlabel():
                assert [t.get_text() for t in ax.get_xticklabels()] == ["2"], ax.get_title()
        plt.close(fig)
