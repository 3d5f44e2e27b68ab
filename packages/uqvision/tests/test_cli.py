"""The command line end to end: the demo chain (small configuration) and the other commands."""

import numpy as np
import pytest
import xarray as xr
from uqmetrics import read_dataset

from uqvision.cli import COMMANDS, build_parser, main
from uqvision.data import DATASET_MAKERS, TTA_POLICIES
from uqvision.predict import PASS_MODES
from uqvision.protocols import VISION_PROTOCOLS

SELECTIVE_VARS = ("accuracy", "auroc", "aurc", "eaurc", "sac_99", "sac_95", "ece", "nll",
                  "brier", "temperature")


def _subparser(name):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[name]


def _choices(parser, dest):
    return list(next(a for a in parser._actions if a.dest == dest).choices)


def test_every_command_has_a_subparser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == COMMANDS.names()
    general = ["data", "train", "predict", "score", "sweep", "evaluate", "plot", "reproduce",
               "rerun", "verify", "report", "compare", "plugins", "demo"]
    brought = [c for p in VISION_PROTOCOLS.values() for c in p.commands]  # metadata, split, ...
    assert COMMANDS.names() == general + brought


def test_score_and_reproduce_take_the_protocol_as_a_sub_command(capsys):
    """``uqvision score PROTOCOL`` (its score name an alias) and ``uqvision reproduce NAME``: one
    sub-parser per protocol of the registry; the former ``score --protocol X`` is refused in
    one line that says what to write (exit code 2), wherever it stands."""
    parse = build_parser().parse_args
    for proto in VISION_PROTOCOLS.values():
        for alias in proto.score_names:
            args = parse(["score", alias, "--caches", "c", "--out", "o.nc"])
            assert args.protocol == alias and (args.caches, args.seed) == (["c"], 0)
        assert parse(["reproduce", proto.name, "--out", "o"]).name == proto.name
    name = VISION_PROTOCOLS.names()[-1]
    for argv in (["score", "--protocol", name, "--caches", "c", "--out", "o.nc"],
                 ["score", "--caches", "c", f"--protocol={name}", "--out", "o.nc"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"write 'uqvision score {name} --caches ...'" in err
    with pytest.raises(SystemExit) as stop:
        main(["score", "--caches", "c"])
    assert stop.value.code == 2 and "PROTOCOL" in capsys.readouterr().err


def test_given_options_are_told_from_defaults():
    """Issue 26, item 7: the parsed line says which typed-config options were given, a value
    equal to the default included (the ground for configuration files under the command
    line)."""
    from uqvision import cli
    from uqvision.options import config_kwargs, given_options
    from uqvision.predict import PredictConfig

    parse = build_parser().parse_args
    base = ["predict", "--model", "m", "--data", "d", "--out", "o"]
    assert given_options(parse(base)) == frozenset()
    default = PredictConfig().batch_size
    args = parse([*base, "--batch-size", str(default), "--no-channels-last", "--workers", "0"])
    assert given_options(args) == {"batch_size", "channels_last", "num_workers"}
    assert config_kwargs(args, cli._PREDICT_OPTIONS, given_only=True) == {
        "batch_size": default, "channels_last": False, "num_workers": 0}
    assert given_options(parse(["reproduce", VISION_PROTOCOLS.names()[0], "--out", "o",
                                "--seed", "0"])) == {"seed"}


def test_no_command_takes_an_abbreviated_option(capsys):
    """Issue 24, J: argparse took ``--dataset`` as ``--dataset-name`` (a prefix), which renames
    a sweep's caches; every parser refuses abbreviations."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert parser.allow_abbrev is False
    assert [n for n, p in sub.choices.items() if p.allow_abbrev is not False] == []
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["sweep", "--models", "m", "--data", "d", "--out", "o", "--dataset",
                           "x"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --dataset x" in err and err.count("\n") == 1


def test_choices_and_help_come_from_the_registries():
    predict, score = _subparser("predict"), _subparser("score")
    assert _choices(_subparser("data"), "kind") == DATASET_MAKERS.names()
    assert _choices(predict, "mode") == PASS_MODES.names()
    assert _choices(predict, "tta_policy") == TTA_POLICIES.names()
    assert _choices(_subparser("train"), "augment") == [*TTA_POLICIES.names(), "none"]
    # a protocol's own options and their choices: tests/test_protocols_common.py
    assert _choices(score, "protocol") == [n for p in VISION_PROTOCOLS.values()
                                           for n in p.score_names]
    assert _choices(_subparser("reproduce"), "name") == VISION_PROTOCOLS.names()
    text = predict.format_help()
    for line in PASS_MODES.describe().splitlines():  # one help line per registered mode
        assert line.split(":")[0] + ":" in text


def test_a_registered_dataset_maker_is_a_data_command_with_its_options(tmp_path, monkeypatch,
                                                                      capsys):
    calls = []

    def make_tiles(root, *, n_tiles: int = 3, seed: int = 0, overwrite: bool = False):
        """Tiles (a maker registered by a test)."""
        calls.append((root, n_tiles, seed, overwrite))
        return root

    monkeypatch.setitem(DATASET_MAKERS, "tiles", make_tiles)
    tiles = _subparser("data")._subparsers._group_actions[0].choices["tiles"]
    assert tiles.description == "Tiles (a maker registered by a test)."
    assert "--n-tiles" in tiles.format_help() and "--image-size" not in tiles.format_help()
    assert main(["data", "tiles", "--out", str(tmp_path), "--n-tiles", "5", "--seed", "2"]) == 0
    assert calls == [(str(tmp_path), 5, 2, False)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:  # another maker's option: not one of its own
        main(["data", "tiles", "--out", str(tmp_path), "--image-size", "8"])
    assert stop.value.code == 2
    assert "uqvision data tiles: error: unrecognized arguments: --image-size 8" in \
        capsys.readouterr().err


def test_data_command_writes_a_synthetic_folder(tmp_path):
    assert main(["data", "synthetic", "--out", str(tmp_path / "s"), "--classes", "2",
                 "--n-per-class", "1", "--image-size", "8"]) == 0
    assert sorted(p.name for p in (tmp_path / "s" / "test").iterdir()) == ["class_000",
                                                                          "class_001"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    assert main(["--threads", "1", "demo", "--out", str(out), "--members", "2", "--epochs", "1",
                 "--max-per-class", "10", "--mc-passes", "2", "--n-orders", "2",
                 "--calibration-size", "0.4"]) == 0
    return out


@pytest.mark.slow
def test_demo_runs_end_to_end_and_leaves_checkable_files(demo_dir):
    caches = sorted((demo_dir / "caches").glob("*.nc"))
    # 2 members x (plain + own TTA pass) + member 0's second TTA pass + MC dropout
    assert len(caches) == 6
    for path in caches:  # the file contract, with plain xarray
        with xr.open_dataset(path) as c:
            assert c["label"].dims == ("sample",)
            assert c["logits"].dims[-2:] == ("sample", "class") and c.sizes["class"] == 10
            assert int(c.attrs["complete"]) == 1
    with xr.open_dataset(demo_dir / "scores" / "selective.nc") as s:
        for v in SELECTIVE_VARS:
            assert s[v].dims == ("model", "calibration"), v
        assert set(s["model"].values) == {"test_byobnet_m0", "test_byobnet_m0+mc_dropout",
                                          "test_byobnet_m1"}
        assert np.isfinite(s["auroc"].values).all()
    with xr.open_dataset(demo_dir / "scores" / "ensembles.nc") as e:
        assert set(e["method"].values) == {"deep_ensemble", "deep_ensemble_tta", "single_tta",
                                           "mc_dropout"}
        assert e["dee"].dims == ("method", "size")
        dee = e["dee"].values[np.isfinite(e["dee"].values)]
        assert dee.size and (dee >= 1).all() and (dee <= e.attrs["dee_cap"]).all()
    figures = {p.name for p in (demo_dir / "figures").glob("*.png")}
    assert {"risk_coverage.png", "ensemble_cll.png", "ensemble_dee.png",
            "reliability_test_byobnet_m0.png"} <= figures


@pytest.mark.slow
def test_score_and_plot_commands_reproduce_the_demo(demo_dir, tmp_path, capsys):
    out = tmp_path / "sel.nc"
    # the demo's MC-dropout cache has 2 passes: scoring it needs --mc-passes 2 (30 by default)
    assert main(["score", "selective", "--caches", str(demo_dir / "caches"),
                 "--out", str(out), "--calibration-size", "0.4"]) == 2
    assert "has 2 passes; the +mc_dropout row needs 30" in capsys.readouterr().err
    assert main(["score", "selective", "--caches", str(demo_dir / "caches"),
                 "--out", str(out), "--calibration-size", "0.4", "--mc-passes", "2"]) == 0
    with xr.open_dataset(out) as a, xr.open_dataset(demo_dir / "scores" / "selective.nc") as b:
        for v in SELECTIVE_VARS:
            np.testing.assert_array_equal(a[v].values, b[v].values)
    assert main(["score", "pitfalls", "--caches", str(demo_dir / "caches"),
                 "--out", str(tmp_path / "ens.nc"), "--n-orders", "2"]) == 0
    assert main(["plot", "--caches", str(demo_dir / "caches"), "--ensembles",
                 str(tmp_path / "ens.nc"), "--selective", str(out), "--out",
                 str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "ensemble_nll.png").is_file()
    assert (tmp_path / "fig" / "selective_auroc_vs_ece_none.png").is_file()
    # a second score run refuses to clobber without --overwrite
    assert main(["score", "selective", "--caches", str(demo_dir / "caches"),
                 "--out", str(out), "--calibration-size", "0.4", "--mc-passes", "2"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_cli_train_predict_and_clear_errors(digits, tmp_path, capsys):
    ckpt = tmp_path / "m{seed}.safetensors"
    assert main(["--threads", "1", "train", "--arch", "test_vit", "--data",
                 str(digits / "train"), "--out", str(ckpt), "--seeds", "0", "1",
                 "--epochs", "1", "--input-size", "16", "--drop-rate", "0.1"]) == 0
    assert (tmp_path / "m0.safetensors").is_file() and (tmp_path / "m1.json").is_file()
    assert main(["predict", "--model", f"test_vit={tmp_path / 'm1.safetensors'}", "--data",
                 str(digits / "test"), "--out", str(tmp_path / "c"), "--mode", "mc_dropout",
                 "--passes", "2"]) == 0
    assert len(list((tmp_path / "c").glob("*mc_dropout-000.nc"))) == 1
    # --zero-shot: embeddings of a folder of classes the 10-class head never saw, no logits
    three = tmp_path / "three"
    three.mkdir()
    for c in ("0", "1", "2"):
        (three / f"new{c}").symlink_to(digits / "test" / c, target_is_directory=True)
    assert main(["predict", "--model", f"test_vit={tmp_path / 'm1.safetensors'}", "--data",
                 str(three), "--out", str(tmp_path / "z"), "--zero-shot"]) == 0
    (zs,) = (read_dataset(p) for p in (tmp_path / "z").glob("*.nc"))
    assert "logits" not in zs and zs.sizes["class"] == 3 and zs["embedding"].shape[0] > 0
    capsys.readouterr()
    assert main(["predict", "--model", "test_vitt", "--data", str(digits / "test"),
                 "--out", str(tmp_path / "c")]) == 2
    assert "did you mean" in capsys.readouterr().err
    assert main(["predict", "--model", f"test_vit={tmp_path / 'm1.safetensors'}", "--data",
                 str(tmp_path / "missing"), "--out", str(tmp_path / "c")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_data_hierarchy_command(tmp_path, capsys):
    """``uqvision data hierarchy`` writes the V.0 stand-in (read back by its reader), refuses an
    option of another maker, and never overwrites without --overwrite."""
    from uqvision.hierarchy import read_hierarchy

    out = tmp_path / "h"
    assert main(["data", "hierarchy", "--scale", "smoke", "--seed", "3", "--out", str(out)]) == 0
    info = read_hierarchy(out)
    assert len(info.classes) == 18 and len(info.downstream_groups) >= 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:  # an option of another maker: not one of its own
        main(["data", "hierarchy", "--scale", "smoke", "--out", str(out), "--image-size", "8"])
    assert stop.value.code == 2
    assert "uqvision data hierarchy: error: unrecognized arguments: --image-size 8" in \
        capsys.readouterr().err
    assert main(["data", "hierarchy", "--scale", "smoke", "--out", str(out)]) != 0
    assert "overwrite" in capsys.readouterr().err


def test_reproduce_passes_one_device_to_every_driver(tmp_path, capsys):
    """``uqvision reproduce NAME --device D`` reaches every driver's ``run(..., device=D)`` (the
    registry's contract, default cpu); a device that is not here is refused at the command
    line, naming it, for every driver and for train/predict."""
    import inspect

    import torch

    drivers = {n: p.reproduce for n, p in VISION_PROTOCOLS.items_ordered()}
    for name in drivers:
        assert inspect.signature(drivers[name].run).parameters["device"].default == "cpu"
        assert _subparser("reproduce").parse_args([name, "--out", "o"]).device == "cpu"
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last CUDA device, or none
    for argv in ([["reproduce", name, "--out", str(tmp_path), "--device", missing]
                  for name in drivers]
                 + [["train", "--arch", "x", "--data", "d", "--out", "o", "--device", "tpu"],
                    ["predict", "--model", "m", "--data", "d", "--out", "o", "--device", "gpu"]]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert f"argument --device: {argv[-1]!r}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything ran


def test_generated_options_take_their_defaults_from_the_typed_configs():
    """predict, train, reproduce and demo options are generated from their dataclasses
    (uqvision.options.add_config_options): parsed without them, they give the configs' own
    defaults, so no default is written twice (a protocol's score options: its own tests)."""
    from uqvision import cli
    from uqvision.demo import DemoConfig
    from uqvision.options import config_defaults, config_kwargs
    from uqvision.predict import PredictConfig
    from uqvision.protocols import ReproduceOptions
    from uqvision.training.loop import ImageTrainConfig

    parse = build_parser().parse_args
    predict = parse(["predict", "--model", "m", "--data", "d", "--out", "o"])
    assert cli._predict_config(predict) == PredictConfig()
    train = parse(["train", "--arch", "a", "--data", "d", "--out", "o"])
    defaults = config_defaults(ImageTrainConfig)
    assert config_kwargs(train, cli._TRAIN_OPTIONS) == {o.field: defaults[o.field]
                                                        for o in cli._TRAIN_OPTIONS}
    for name in VISION_PROTOCOLS.names():
        reproduce = parse(["reproduce", name, "--out", "o"])
        assert ReproduceOptions(**config_kwargs(reproduce, cli._REPRODUCE_OPTIONS)) == \
            ReproduceOptions()
    demo = parse(["demo", "--out", "o"])
    assert DemoConfig(**config_kwargs(demo, cli._DEMO_OPTIONS)) == DemoConfig()
    # the flags keep their documented spelling
    assert parse(["predict", "--model", "m", "--data", "d", "--out", "o", "--workers", "2",
                  "--random-init"]).num_workers == 2
    assert parse(["train", "--arch", "a", "--data", "d", "--out", "o", "--init", "c",
                  "--augment", "none"]).init_checkpoint == "c"
