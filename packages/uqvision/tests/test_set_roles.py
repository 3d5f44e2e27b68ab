"""Issue 37 §1 and §3: every set has a declared role and the scorers take their sets by role
and name; ensemble rows are formed only from models declared together.

The newcomer's caches: one ``results/zoo/caches`` holding the val set (the test set), an OOD
fit subset of training images (role ``fit``, ``--sets fit:fit=PATH``), ImageNet-C members
and an OOD set. Before roles, ``score shift`` and ``score conformal`` took "the second clean
dataset" and scored the training images as the test set, silently; and every model
``uqvision train`` had marked ``deep_ensemble`` was averaged into ``deep_ensemble[k]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from uqmetrics import InputError, write_dataset

from uqvision.cache import cache_dataset, cache_key, read_cache
from uqvision.cli import main
from uqvision.data import ImageFolderDataset
from uqvision.predict import PredictConfig, predict_to_files
from uqvision.predictors import MixedEnsembleWarning
from uqvision.protocols.conformal.score import ConformalConfig, score_conformal
from uqvision.protocols.ood.score import OodConfig, score_ood
from uqvision.protocols.selective.score import SelectiveConfig, score_selective
from uqvision.protocols.shift.score import ShiftConfig, score_shift
from uqvision.sweep import sweep_targets

C, N = 3, 90
CLASSES = [f"c{j}" for j in range(C)]
LABELS = np.arange(N) % C
MODELS = ("m1", "m2")


def _logits(seed: int, signal: float) -> np.ndarray:
    z = np.random.default_rng(seed).normal(size=(N, C))
    z[np.arange(N), LABELS] += signal
    return z


def _write(folder: Path, model: str, dataset: str, logits, *, labels=LABELS, roles=True,
           **attrs) -> None:
    """A cache as ``uqvision predict`` writes it; ``roles=False``: as before set roles (no
    ``set_role`` attr: read with its set's default)."""
    attrs = {"model": model, "dataset_name": dataset, "mode": "plain", "pass_index": 0,
             "eval_set": "folder", "role": "clean", "set_role": "test", **attrs}
    if not roles:
        attrs.pop("set_role")
    ds = cache_dataset(logits, labels, samples=[f"{dataset}/{i}.png" for i in range(N)],
                       classes=CLASSES, attrs=attrs)
    write_dataset(ds, folder / f"{cache_key(model, dataset, 'plain', 0)}.nc")


def _newcomer(folder: Path, *, fit: bool = True, roles: bool = True) -> Path:
    """val (test) and ImageNet-C's fog-1 for two models, an OOD set, and with ``fit`` the fit
    subset: training images, nearly all classified right."""
    folder.mkdir(parents=True)
    for j, m in enumerate(MODELS):
        _write(folder, m, "val", _logits(j, 1.0), roles=roles)
        _write(folder, m, "imagenet-c-fog-1", _logits(10 + j, 0.5), roles=roles,
               eval_set="imagenet-c", role="shifted", set_role="shift", eval_member="fog-1",
               corruption="fog", severity=1)
        _write(folder, m, "ninco", _logits(20 + j, 0.0), labels=np.full(N, -1), roles=roles,
               eval_set="ninco", role="ood", set_role="ood-near", ood_split="near")
        if fit:
            _write(folder, m, "fit", _logits(30 + j, 3.0), roles=roles, set_role="fit")
    return folder


def _same_numbers(a: xr.Dataset, b: xr.Dataset) -> None:
    xr.testing.assert_equal(a, b)  # every variable and coordinate; not the attrs (the inputs)


CONFORMAL = {"trials": 5, "temperature_size": 0.3, "alphas": (0.3,)}


def test_shift_and_conformal_score_the_test_set_never_the_fit_set(tmp_path):
    """The newcomer's case: no test set named, the caches hold val and the fit subset: val is
    the only set of role test (the fit set is never a candidate), its split calibrates, and
    the numbers are those of the caches without the fit set. Before: the clean top-1 of the fit
    subset (0.96 and 0.99 for models of about 0.6 on val)."""
    caches = _newcomer(tmp_path / "caches")
    alone = _newcomer(tmp_path / "alone", fit=False)
    shift = score_shift(caches)
    assert (shift["clean_accuracy"].sel(calibration="none") < 0.8).all()
    _same_numbers(shift, score_shift(alone))
    assert json.loads(shift.attrs["scored_sets"]) == {"test": "val", "calibration": "val"}
    _same_numbers(shift, score_shift(caches, ShiftConfig(test="val")))
    conformal = score_conformal(caches, ConformalConfig(**CONFORMAL))
    assert json.loads(conformal.attrs["pool_dataset"]) == {m: "val" for m in MODELS}
    _same_numbers(conformal, score_conformal(alone, ConformalConfig(**CONFORMAL)))


def test_ood_and_selective_take_the_test_and_fit_sets_by_role(tmp_path):
    caches = _newcomer(tmp_path / "caches")
    ood = score_ood(caches, OodConfig(detectors=("msp",)))
    assert json.loads(ood.attrs["scored_sets"]) == {"test": "val", "fit": "fit"}
    selective = score_selective([caches], SelectiveConfig(calibration_size=0.5))
    assert selective.attrs["dataset_name"] == "val"


def test_caches_before_roles_are_read_and_an_ambiguous_test_set_refused(tmp_path):
    """Caches written before roles read with their set's default: the fit subset (a clean
    folder) is then a second test set, and each scorer refuses to choose, naming both and
    the option; named, the numbers are those of the caches with roles."""
    old = _newcomer(tmp_path / "old", roles=False)
    for score, config in ((score_shift, ShiftConfig()),
                          (score_conformal, ConformalConfig(**CONFORMAL)),
                          (score_ood, OodConfig(detectors=("msp",)))):
        with pytest.raises(InputError, match=r"^the caches hold 2 sets of role 'test': 'fit', "
                                             r"'val'; name the test set \(--test NAME\)$"):
            score(old, config)
    with pytest.raises(InputError, match="2 sets of role 'test'"):
        score_selective([old])
    _same_numbers(score_shift(old, ShiftConfig(test="val")),
                  score_shift(_newcomer(tmp_path / "new")))


def test_a_fit_set_is_never_a_test_or_calibration_set(tmp_path):
    caches = _newcomer(tmp_path / "caches")
    for score, config in ((score_shift, ShiftConfig(test="fit")),
                          (score_shift, ShiftConfig(calibration="fit")),
                          (score_conformal, ConformalConfig(test="fit", **CONFORMAL)),
                          (score_ood, OodConfig(test="fit"))):
        with pytest.raises(InputError, match=r"'fit' has role 'fit' \(an ID training subset"):
            score(caches, config)
    with pytest.raises(InputError, match=r"--test 'fit': dataset 'fit' has role 'fit'"):
        score_selective([caches], SelectiveConfig(test="fit"))
    with pytest.raises(InputError, match=r"--test 'nope': no caches of dataset 'nope'; .*"
                                         r"fit \(fit\), .*val \(test\)"):
        score_shift(caches, ShiftConfig(test="nope"))


def test_the_command_line_takes_the_sets_by_role_and_refuses_in_one_line(tmp_path, capsys):
    old = _newcomer(tmp_path / "old", roles=False)
    assert main(["score", "shift", "--caches", str(old), "--out", str(tmp_path / "a.nc")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith(
        "2 sets of role 'test': 'fit', 'val'; name the test set (--test NAME)")
    assert main(["score", "shift", "--caches", str(old), "--test", "val", "--out",
                 str(tmp_path / "b.nc")]) == 0
    # the option of before names the same set
    assert main(["score", "shift", "--caches", str(old), "--dataset", "val", "--out",
                 str(tmp_path / "c.nc")]) == 0
    _same_numbers(xr.open_dataset(tmp_path / "b.nc").load(),
                  xr.open_dataset(tmp_path / "c.nc").load())


def test_a_sweep_records_each_sets_declared_role(spec, digits, tmp_path):
    """``--sets ROLE:NAME=PATH`` declares a role, a set without one plays its default; the
    caches record it (attr set_role)."""
    data = ImageFolderDataset(digits / "test")
    fit, far = sweep_targets(data, PredictConfig(), [f"fit:fit={digits / 'train'}",
                                                     f"ood-far:far={digits / 'train'}"])[1:]
    assert (fit.dataset_name, fit.config.eval_set, fit.config.role) == ("fit", "folder", "fit")
    assert (far.config.eval_set, far.config.role) == ("ood-far", None)
    with pytest.raises(InputError, match=r"--sets 'fit:ninco:x=.*': eval set 'ninco' \(of kind "
                                         r"ood\) cannot have role 'fit'; its roles: ood-near"):
        sweep_targets(data, PredictConfig(), [f"fit:ninco:x={digits / 'train'}"])
    (path,) = predict_to_files(spec, digits / "test", tmp_path, fit.config, dataset_name="fit")
    assert read_cache(path).attrs["set_role"] == "fit"


# ------------------------------------------------------------------------------ ensembles


def _zoo(folder: Path, **runs) -> Path:
    """val and fog-1 caches of models ``a``, ``b``, ``c``, each with the attrs of ``runs``."""
    folder.mkdir(parents=True)
    for j, m in enumerate("abc"):
        for dataset, extra in (("val", {}), ("imagenet-c-fog-1", {
                "eval_set": "imagenet-c", "role": "shifted", "set_role": "shift",
                "eval_member": "fog-1", "corruption": "fog", "severity": 1})):
            _write(folder, m, dataset, _logits(j + (10 if extra else 0), 1.0),
                   **runs.get(m, {}), **extra)
    return folder


def test_only_models_declared_together_form_an_ensemble_row(tmp_path):
    """Three models in one caches folder form no ensemble row: trained alone (method single),
    or trained before runs recorded their ensemble (method deep_ensemble, no id): before, the
    latter were averaged into deep_ensemble[3]. The members of one ``uqvision train --members
    K`` run form theirs; ``--ensemble NAME=M1,M2`` forms another."""
    single = _zoo(tmp_path / "single", **{m: {"method": "single", "ensemble": f"r{m}",
                                              "ensemble_size": 1} for m in "abc"})
    undeclared = _zoo(tmp_path / "undeclared", **{m: {"method": "deep_ensemble"} for m in "abc"})
    for folder in (single, undeclared):
        assert score_shift(folder)["kind"].values.tolist() == ["single"] * 3
    run = {"method": "deep_ensemble", "ensemble": "r1", "ensemble_size": 2}
    trained = score_shift(_zoo(tmp_path / "trained", a=run, b=run))
    assert trained["model"].values.tolist() == ["a", "b", "c", "deep_ensemble[2]"]
    assert json.loads(trained.attrs["ensemble_members"]) == {"deep_ensemble[2]": ["a", "b"]}
    declared = score_shift(single, ShiftConfig(ensembles=["e=a,b"]))
    assert declared["model"].values.tolist() == ["a", "b", "c", "e"]
    np.testing.assert_array_equal(declared["clean_nll"].sel(model="e"),
                                  trained["clean_nll"].sel(model="deep_ensemble[2]"))
    assert "notes" not in declared.attrs
    with pytest.raises(InputError, match=r"--ensemble\) e=a,z: no caches of model\(s\) \['z'\]"):
        score_shift(single, ShiftConfig(ensembles={"e": ("a", "z")}))


def test_an_ensemble_of_several_architectures_is_warned_and_noted(tmp_path, capsys):
    folder = _zoo(tmp_path / "zoo", a={"architecture": "resnet18"},
                  b={"architecture": "vit_tiny_patch16_224"})
    note = "ensemble e averages models of different architectures: a (resnet18), b (vit_tiny"
    with pytest.warns(MixedEnsembleWarning, match=r"^ensemble e averages") as caught:
        ds = score_conformal(folder, ConformalConfig(ensembles={"e": ("a", "b")}, **CONFORMAL))
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert note in ds.attrs["notes"]
    assert main(["score", "shift", "--caches", str(folder), "--ensemble", "e=a,b", "--out",
                 str(tmp_path / "s.nc")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert err == [f"uqvision score shift: warning: {note_line}" for note_line in
                   [xr.open_dataset(tmp_path / "s.nc").attrs["notes"]]]
