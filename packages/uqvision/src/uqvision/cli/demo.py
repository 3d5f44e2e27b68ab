"""``uqvision demo``: the whole chain on digits (:mod:`uqvision.demo`, imported when the command
runs or its options are built), its options generated from :class:`~uqvision.demo.DemoConfig`.
"""

from __future__ import annotations

import argparse

from ..options import (
    COUNT,
    SEED,
    ConfigOption,
    add_config_options,
    check_output_folder,
    config_kwargs,
    device_type,
    positive_float,
)
from .base import _print, _progress


def _cmd_demo(a: argparse.Namespace) -> int:
    from ..demo import DemoConfig, check_config, run_demo, summary  # imported on use

    check_output_folder("--out", a.out)
    config = DemoConfig(**config_kwargs(a, _DEMO_OPTIONS))
    # the options, named as on the command line, before anything is written
    check_config(config, {o.field: o.flag or "--" + o.field.replace("_", "-")
                          for o in _DEMO_OPTIONS})
    # progress lines on stderr (none under uqvision --quiet), the results on stdout
    r = run_demo(a.out, config, log=_progress, overwrite=a.overwrite)
    _print(summary(r))
    _print(f"demo done in {r.wall_time_s:.0f} s: {r.selective}, {r.ensembles}")
    return 0


#: ``uqvision demo`` options generated from :class:`~uqvision.demo.DemoConfig` (defaults from
#: its fields).
_DEMO_OPTIONS = (
    ConfigOption("arch"),
    ConfigOption("members", type=COUNT),
    ConfigOption("epochs", type=COUNT),
    ConfigOption("mc_passes", type=COUNT),
    ConfigOption("max_per_class", type=COUNT),
    ConfigOption("calibration_size", type=positive_float),
    ConfigOption("n_orders", type=COUNT),
    ConfigOption("seed", type=SEED),
    ConfigOption("device", type=device_type, help="cpu | cuda | cuda:N"),
)


def _args_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true",
                   help="replace a demo of other options in --out: delete the files the demo "
                        "recorded there (.uqmetrics-written.json), nothing else, and make them "
                        "again; without it such a folder is refused before any work (the same "
                        "options resume it)")
    from ..demo import DemoConfig  # the whole chain: imported on use

    add_config_options(p, DemoConfig, _DEMO_OPTIONS)
