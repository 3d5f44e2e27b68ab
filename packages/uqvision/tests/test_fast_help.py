"""A fast command line (issue 37, section 6): ``uqvision -h`` and every ``uqvision COMMAND ... -h``
(each command, each protocol of ``score`` and ``reproduce``, each maker of ``data``, the
protocols' commands, the toy plugin's protocol included) import neither torch, timm nor Dask:
their parsers are built from light modules, and the names of the registries whose modules
import torch come from :mod:`uqvision.catalog`, checked here against the registries
(docs/conventions.md#fast-help). The time is the benchmark's (benchmarks/help_startup.py),
not a test's. ``uqvision data MAKER -h`` shows that maker's options only, their help read
from its docstring as plain text, whole."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from uqmetrics.metrics.detectors import DETECTORS

from uqvision import catalog
from uqvision.data import DATASET_MAKERS
from uqvision.protocols import VISION_PROTOCOLS

#: Every help of the command line, in one fresh interpreter: each ``main([*path, "-h"])``, the
#: heavy modules imported so far after each (they only accumulate: the first path that
#: imports one is the culprit), its output; the sub-commands of a path are read from its
#: parser as ``main`` builds it (lazily). Then a name only the filled registries hold: a Dask
#: worker that imported one module of uqvision still finds it.
_EVERY_HELP = textwrap.dedent("""
    import argparse, contextlib, io, json, sys
    import xarray  # some helps import it; before 2024.1 it imported dask itself: not theirs
    BY_XARRAY = set(sys.modules)
    from uqvision.cli import build_parser, main

    HEAVY = ("torch", "timm", "dask", "distributed")

    def heavy():
        return sorted({m.split(".")[0] for m in set(sys.modules) - BY_XARRAY} & set(HEAVY))

    def children(path):
        parser = build_parser(lazy=True)
        for name in path:  # each command's arguments added as parsing it adds them
            action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = action.choices[name]
            arguments = action.pending.pop(parser, None)
            if arguments is not None:
                arguments(parser)
        action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                      None)
        return [] if action is None else [a.dest for a in action._choices_actions]

    helps, todo = {}, [[]]
    while todo:
        path = todo.pop(0)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main([*path, "--help"])
            except SystemExit as stop:
                code = stop.code
        helps[" ".join(path)] = {"code": code, "text": out.getvalue(), "heavy": heavy()}
        todo += [[*path, name] for name in children(path)]
    from uqvision.predict.modes import PASS_MODES
    print(json.dumps({"helps": helps, "crop": "crop" in PASS_MODES}))
    """)


@pytest.fixture(scope="module")
def every_help() -> dict:
    out = subprocess.run([sys.executable, "-c", _EVERY_HELP], capture_output=True, text=True,
                         check=False, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_help_imports_no_torch_timm_or_dask(every_help):
    got = every_help
    helps = got["helps"]
    heavy = {path: h["heavy"] for path, h in helps.items() if h["heavy"]}
    assert heavy == {}, f"--help imported {heavy}"  # the first path named did
    assert all(h["code"] == 0 and h["text"].startswith("usage: uqvision") for h in helps.values())
    # every command and sub-command was asked for its help
    expected = {"", *(f"data {m}" for m in DATASET_MAKERS.names()),
                *(f"score {p.name}" for p in VISION_PROTOCOLS.values() if p.score is not None),
                *(f"reproduce {p.name}" for p in VISION_PROTOCOLS.values() if p.reproduce),
                *(c for p in VISION_PROTOCOLS.values() for c in p.commands)}
    assert expected <= set(helps) and "toy" in VISION_PROTOCOLS  # the plugin's protocol too
    assert {"data", "train", "predict", "sweep", "demo", "rerun", "plugins"} <= set(helps)
    # the OOD detectors are listed, the plugin's among them (its module not imported)
    ood = " ".join(helps["score ood"]["text"].split())
    assert all(name in ood for name in DETECTORS.names()) and "toy_max_logit" in ood
    # the registries a help names without importing them hold, once filled, what it said
    assert got["crop"]  # registered by a protocol: found by a lookup in a fresh interpreter


def test_a_makers_help_is_its_own_options_in_plain_words(every_help):
    helps = {path: h["text"] for path, h in every_help["helps"].items()}
    for name in DATASET_MAKERS.names():  # no Sphinx role or literal, no signature object
        text = helps[f"data {name}"]
        for marker in (":func:", ":data:", ":class:", ":mod:", "``", "inspect._empty"):
            assert marker not in text, (name, marker)
    flags = {name: {w for w in helps[f"data {name}"].split() if w.startswith("--")}
             for name in DATASET_MAKERS.names()}
    assert "--max-per-class" in flags["digits"] and not flags["digits"] & {
        "--image-size", "--src", "--scale", "--corruptions", "--scheduler"}
    assert "--src" in flags["subset"] and "--scheduler" not in flags["subset"]
    assert {"--corruptions", "--severities", "--scheduler"} <= flags["imagenet-c"]
    # the description is the docstring's first paragraph, whole (it was cut after a line)
    listing = " ".join(helps["data"].split())
    assert ("make_corrupted_folder with comma-separated corruptions (all: the 19) and "
            "severities; --scheduler ADDRESS runs it on a Dask cluster") in listing
    # an option's help is its parameter's description, whole, with its default
    digits = " ".join(helps["data digits"].split())
    assert ("--max-per-class MAX_PER_CLASS Keep only the first images of each class (before "
            "the split): small sets for tests.") in digits
    assert "Seed of the stratified split. (default: 0)" in digits


def test_the_catalog_holds_the_registries_entries():
    """:data:`uqvision.catalog.BUILT_IN` is what the filled registries hold (their plugins
    aside): a method, mode or augmentation added without its line there fails here, and
    ``python -m uqvision.catalog`` prints the lines to paste."""
    assert catalog.CATALOG.from_registries() == catalog.BUILT_IN, catalog.CATALOG.source()
    # the toy plugin's training method: listed by name, from its package's metadata
    assert catalog.names("training method")[-1] == "toy_label_smoothing"
    assert "toy_label_smoothing: plugin (uqvision_toy.method:METHOD)" in \
        catalog.describe("training method")
