"""The package imports, and what each command imports: ``uqvision train`` and ``uqvision
predict`` load no scoring code (uqmetrics' metric modules, the protocols' scorers, drivers and
figures), no scipy, statsmodels, scikit-learn, matplotlib or Dask; ``train`` not even xarray;
``predict``'s results table only ``uqmetrics.metrics.classification``'s accuracy functions.
Checked in fresh interpreters, on real commands (docs/conventions.md#v-predict-speed). Every
protocol of the registry is covered: its scorer, driver, figures and analyses are the modules of
:data:`PROTOCOL_SCORING` in its folder."""

import argparse
import functools
import json
import subprocess
import sys
import textwrap

import pytest

from uqvision.protocols import VISION_PROTOCOLS

#: A protocol's modules that a training or prediction command must not import: its scorer
#: (``score.py``), its driver (``reproduce.py``), its figures, analyses, metadata tables,
#: measures and splits (imported on use; a protocol's ``__init__`` and what it imports to
#: register its training methods and prediction modes are loaded by ``import uqvision``).
PROTOCOL_SCORING = ("score", "reproduce", "plots", "analysis", "metadata", "measures", "split")

#: Modules a training or prediction command must not import (prefixes). (uqmetrics.runs.sweep is
#: not among them: the command line builds every subcommand's parser, and the sweep options,
#: defined once there, come with it; that module imports no Dask: "dask" and "distributed"
#: below keep it so.)
SCORING = (
    *(f"uqmetrics.{m}" for m in ("calibration", "classification", "confidence", "selective",
                                 "scoring", "ensembles", "ood", "retrieval", "regression",
                                 "plotting")),
    *(f"uqvision.protocols.{name}.{m}" for name in VISION_PROTOCOLS.names()
      for m in PROTOCOL_SCORING),
    "uqvision.demo", "uqvision.plots", "uqvision.sweep", "uqvision.zoo",
    "scipy", "statsmodels", "sklearn", "matplotlib", "dask", "distributed",
)


def test_package_imports_with_declared_dependencies():
    import timm
    import torchvision
    import uqmetrics

    import uqvision

    assert uqvision.__version__
    assert timm.list_models("resnet10t")
    assert torchvision.__version__
    assert callable(uqmetrics.expected_calibration_error)


def _fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, check=False, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _imported(modules: list[str], prefixes) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@functools.cache
def _by_xarray() -> frozenset[str]:
    """The modules ``import xarray`` loads by itself (xarray before 2024.1 imported dask)."""
    return frozenset(_fresh("import json, sys, xarray; print(json.dumps(list(sys.modules)))"))


@pytest.mark.slow
def test_train_and_predict_import_no_scoring_code(spec, digits, tmp_path):
    """One interpreter: ``train`` (then its modules are listed), then ``predict`` with the
    checkpoint of the conftest, every mode that the registries fill from the protocols
    (``crop``) included in its choices."""
    got = _fresh(f"""
        import json, sys
        from uqvision.cli import main
        assert main(["--threads", "1", "train", "--arch", "test_byobnet", "--data",
                     {str(digits / "train")!r}, "--input-size", "16", "--epochs", "1",
                     "--workers", "0", "--out", {str(tmp_path / "m.safetensors")!r}]) == 0
        after_train = list(sys.modules)
        assert main(["--threads", "1", "predict", "--model", {spec!r}, "--data",
                     {str(digits / "test")!r}, "--out", {str(tmp_path / "caches")!r},
                     "--workers", "0"]) == 0
        from uqvision.predict import PASS_MODES
        print(json.dumps({{"train": after_train, "predict": list(sys.modules),
                          "modes": PASS_MODES.names()}}))
        """)
    assert _imported(got["train"], (*SCORING, "xarray", "pandas")) == []
    # predict's results table computes top-1/top-5 with uqmetrics.metrics.classification (numpy only)
    assert _imported(set(got["predict"]) - _by_xarray(),
                     [m for m in SCORING if m != "uqmetrics.metrics.classification"]) == []
    assert "crop" in got["modes"]  # the protocols' registrations are there
    assert "uqvision.protocols.url.crop" in got["predict"]
    assert len(list((tmp_path / "caches").glob("*.nc"))) == 1


def test_uqmetrics_loads_its_metrics_on_first_use_and_xarray_writes_without_dask(tmp_path):
    got = _fresh(f"""
        import json, sys
        import uqmetrics
        light = list(sys.modules)
        from uqmetrics.runs.io import xarray_module
        xr = xarray_module()
        import numpy as np
        ds = xr.Dataset({{"x": ("i", np.arange(3.0))}})
        path = uqmetrics.write_dataset(ds, {str(tmp_path / "a.nc")!r})
        back = uqmetrics.read_dataset(path)
        written = list(sys.modules)
        names = sorted(uqmetrics.__all__)  # the metric modules load here
        import dask.array as da
        lazy = xr.Dataset({{"y": ("i", da.ones(4, chunks=2))}})
        uqmetrics.write_dataset(lazy, {str(tmp_path / "b.nc")!r})
        print(json.dumps({{"light": light, "written": written, "names": names,
                          "sum": float(back.x.sum()), "chunks": list(lazy.y.chunks[0]),
                          "dask_sum": float(uqmetrics.read_dataset({str(tmp_path / "b.nc")!r}).y.sum()),
                          "auroc": callable(uqmetrics.auroc_score),
                          "metrics": len(uqmetrics.metrics.registry.list_metrics())}}))
        """)
    assert _imported(got["light"], (*SCORING, "xarray")) == []
    # no dask for a Dataset of numpy arrays
    assert _imported(set(got["written"]) - _by_xarray(), SCORING) == []
    assert got["sum"] == 3.0
    # once loaded, the names are those uqmetrics always exported, and dask arrays still work
    assert {"auroc_score", "expected_calibration_error", "write_dataset", "InputError",
            "CONVENTIONS", "COVERAGE_Z"} <= set(got["names"])
    assert got["auroc"] and got["metrics"] > 20
    assert got["chunks"] == [2, 2] and got["dask_sum"] == 4.0


def test_help_lists_every_command_and_every_option(capsys):
    from uqvision.cli import COMMANDS, main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(name in text for name in COMMANDS.names())
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = capsys.readouterr().out
    for flag in ("--mode", "--workers", "--amp", "--channels-last", "--no-channels-last",
                 "--labels", "--skip-bad-images", "crop"):
        assert flag in text, flag
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    text = capsys.readouterr().out
    assert all(n in text for p in VISION_PROTOCOLS.values() for n in p.score_names)
    for proto in VISION_PROTOCOLS.values():  # each protocol's own options in its help
        with pytest.raises(SystemExit):
            main(["score", proto.name, "--help"])
        text = capsys.readouterr().out
        own = argparse.ArgumentParser(add_help=False)
        if proto.add_options is not None:
            proto.add_options(own)
        for flag in ("--caches", "--out", *(s for a in own._actions for s in a.option_strings)):
            assert flag in text, (proto.name, flag)
