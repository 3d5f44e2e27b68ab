"""``uqvision reproduce pitfalls`` at the smoke scale (issue 10, item 5): every Pitfalls
method trained, predicted plain and with TTA, scored, drawn; a rerun resumes."""

import json

import numpy as np
import pytest
import xarray as xr

from uqvision.cli import main
from uqvision.protocols import VISION_PROTOCOLS
from uqvision.protocols.pitfalls.reproduce import PITFALLS_METHODS, PITFALLS_SCALES, _scale


@pytest.fixture(scope="module")
def run_dir(smoke_run):
    return smoke_run("pitfalls")[0]


@pytest.mark.slow
def test_smoke_run_trains_predicts_and_scores_every_method(run_dir):
    with xr.open_dataset(run_dir / "ensembles.nc") as ds:
        ds = ds.load()
    names = list(ds["method"].values)
    assert names == [m + t for m in PITFALLS_METHODS for t in ("", "_tta")] + ["single_tta"]
    sc = PITFALLS_SCALES["smoke"]
    k = ds["n_members"].sel({"method": "deep_ensemble"})
    assert k == sc.members and ds.attrs["dee_cap"] == sc.members and ds.attrs["device"] == "cpu"
    for m in PITFALLS_METHODS[1:]:
        assert int(ds["n_members"].sel({"method": m})) == sc.samples[m]
        assert int(ds["n_draws"].sel({"method": m + "_tta"})) == sc.draws
    # DEE: within [1, cap] where measured; the deep ensemble against itself ends at its size
    dee = ds["dee"].values
    assert np.all((dee[np.isfinite(dee)] >= 1) & (dee[np.isfinite(dee)] <= sc.members))
    assert float(ds["dee"].sel({"method": "deep_ensemble"})[sc.members - 1]) == pytest.approx(
        sc.members, abs=0.1)
    # hyper-parameters and cost of every run are in the attrs
    runs = json.loads(ds.attrs["runs"])
    assert {r["method"] for r in runs.values()} == set(PITFALLS_METHODS)
    fge = next(r for r in runs.values() if r["method"] == "fge")
    assert fge["hparams"]["cycles"] == 3 and fge["init_checkpoint"].startswith("deep_ensemble")
    assert fge["cost"]["total_epochs"] == pytest.approx(sc.epochs + 3 * 0.5, abs=0.2)
    caches = list((run_dir / "caches").glob("*.nc"))
    expected = sc.members * (1 + sc.draws) + sum(
        sc.samples[m] * (1 + sc.draws) for m in PITFALLS_METHODS[1:])
    assert len(caches) == expected
    figures = {p.name for p in (run_dir / "figures").glob("*.png")}
    assert figures == {"cll_vs_samples.png", "dee_vs_samples.png", "dee_other_metrics.png"}
    assert "| deep_ensemble + TTA |" in (run_dir / "summary.md").read_text()


@pytest.mark.slow
def test_a_rerun_reuses_every_run_and_cache(run_dir, capsys):
    mtimes = {p: p.stat().st_mtime_ns for p in (run_dir / "caches").glob("*.nc")}
    mtimes.update({p: p.stat().st_mtime_ns for p in (run_dir / "models").glob("*")})
    mtimes[run_dir / "ensembles.nc"] = (run_dir / "ensembles.nc").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["--threads", "1", "reproduce", "pitfalls", "--scale", "smoke", "--out",
                 str(run_dir)]) == 0
    steps = capsys.readouterr().err  # the driver's steps: stderr
    assert steps.count("reused") == len(list((run_dir / "models").glob("*.json")))
    assert "trained" not in steps.replace("reused", "")
    assert "scores up to date" in steps  # same caches (checksums), same config: not rescored
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items())


def test_registered_with_its_scales_and_options_checked(tmp_path, capsys):
    assert VISION_PROTOCOLS["pitfalls"].scales == ("smoke", "cpu")
    assert main(["reproduce", "pitfalls", "--out", str(tmp_path), "--set", "cycles=3"]) == 2
    assert "unknown options ['cycles']" in capsys.readouterr().err
    assert main(["reproduce", "pitfalls", "--out", str(tmp_path), "--data", "x"]) == 2
    assert "--data needs --arch" in capsys.readouterr().err
    assert main(["reproduce", "pitfalls", "--out", str(tmp_path), "--data",
                 str(tmp_path / "none"), "--arch", "resnet18"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_real_folder_runs_the_same_plan_with_the_named_arch(tmp_path):
    """--data ROOT --arch NAME: the same runs, hyper-parameters and code path; only the data
    folder and the architecture change."""
    from uqvision.protocols.pitfalls.reproduce import plan_runs

    sc = _scale("cpu", "resnet18", "ROOT", {"input_size": "224", "augment": "imagenet"})
    assert (sc.arch, sc.model_kwargs, sc.input_size, sc.augment) == ("resnet18", {}, 224,
                                                                     "imagenet")
    jobs = plan_runs(sc, seed=0, models=tmp_path, train=tmp_path / "train",
                     val=tmp_path / "val")
    stand_in = plan_runs(PITFALLS_SCALES["cpu"], seed=0, models=tmp_path,
                         train=tmp_path / "train", val=tmp_path / "val")
    assert [(j.name, j.method, j.samples) for j in jobs] == [
        (j.name, j.method, j.samples) for j in stand_in]
    assert {j.config.arch for j in jobs} == {"resnet18"}
    assert {j.config.augment for j in jobs} == {"imagenet"}
    laplace = next(j for j in jobs if j.method == "kfac_laplace")
    assert laplace.config.val_data == str(tmp_path / "val")
    assert laplace.config.init_checkpoint.endswith("deep_ensemble_s0.safetensors")


def test_pitfalls_compares_the_general_methods_and_scores_with_its_config_defaults():
    """The Pitfalls protocol compares the general methods; ``uqvision score pitfalls`` (alias
    ``ensembles``) options are generated from :class:`EnsembleConfig`: parsed without them,
    they give its defaults."""
    from uqvision.cli import build_parser
    from uqvision.methods import GENERAL_METHODS
    from uqvision.options import config_defaults, config_kwargs
    from uqvision.protocols.pitfalls import ENSEMBLE_OPTIONS
    from uqvision.protocols.pitfalls.score import EnsembleConfig

    assert VISION_PROTOCOLS.lookup("pitfalls").methods == GENERAL_METHODS
    defaults = config_defaults(EnsembleConfig)
    for name in ("pitfalls", "ensembles"):
        args = build_parser().parse_args(["score", name, "--caches", "c", "--out", "o.nc"])
        assert config_kwargs(args, ENSEMBLE_OPTIONS) == {o.field: defaults[o.field]
                                                         for o in ENSEMBLE_OPTIONS}
