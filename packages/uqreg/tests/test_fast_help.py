"""A fast command line (issue 37, section 6): ``uqreg -h`` and every ``uqreg COMMAND -h`` import
neither torch, timm nor Dask: each command's options are built when it is parsed, from light
modules, and the names of the registries whose modules import torch come from
:mod:`uqreg.catalog`, checked here against the registries (docs/conventions.md#fast-help).
The time is the benchmark's (benchmarks/help_startup.py), not a test's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from uqreg import catalog
from uqreg.cli import COMMANDS

#: Every help of the command line in one fresh interpreter: each ``main([*path, "-h"])``, the
#: heavy modules imported so far after each (the first path that imports one is the culprit).
_EVERY_HELP = textwrap.dedent("""
    import contextlib, io, json, sys
    from uqreg.cli import COMMANDS, main

    HEAVY = ("torch", "timm", "dask", "distributed")
    helps = {}
    for path in ([], *([name] for name in COMMANDS)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main([*path, "--help"])
            except SystemExit as stop:
                code = stop.code
        helps[" ".join(path)] = {"code": code, "text": out.getvalue(), "heavy": sorted(
            {m.split(".")[0] for m in sys.modules} & set(HEAVY))}
    print(json.dumps(helps))
    """)


def test_every_help_imports_no_torch_timm_or_dask():
    out = subprocess.run([sys.executable, "-c", _EVERY_HELP], capture_output=True, text=True,
                         check=False, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    helps = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(helps) == {"", *COMMANDS}
    heavy = {path: h["heavy"] for path, h in helps.items() if h["heavy"]}
    assert heavy == {}, f"--help imported {heavy}"  # the first path named did
    assert all(h["code"] == 0 and h["text"].startswith("usage: uqreg") for h in helps.values())
    study = " ".join(helps["study"]["text"].split())  # the methods, named without torch
    assert all(name in study for name in catalog.names("method"))


def test_the_catalog_holds_the_registries_entries():
    """:data:`uqreg.catalog.BUILT_IN` is what the registries hold: a method or conformal
    score registered without its line there fails here, and ``python -m uqreg.catalog``
    prints the lines to paste."""
    assert catalog.CATALOG.from_registries() == catalog.BUILT_IN, catalog.CATALOG.source()
