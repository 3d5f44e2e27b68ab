"""A fast command line (issue 37, section 6): ``uqreg -h`` and every ``uqreg COMMAND -h`` import
neither torch, timm nor Dask: each command's options are built when it is parsed, from light
modules, and the names of the registries whose modules import torch come from
:mod:`uqreg.catalog`, checked here against the registries (docs/conventions.md#fast-help).
The time is the benchmark's (benchmarks/help_startup.py), not a test's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

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


def test_the_catalogs_versions_are_the_registries():
    """:data:`uqreg.catalog.VERSIONS` (the ``+mv``, ``+qr``, ``+cqr`` versions the help names
    without torch) is what :mod:`uqreg.methods` has; ``python -m uqreg.catalog`` prints it."""
    from uqreg.methods import method_versions

    assert method_versions() == catalog.VERSIONS


def _methods_help(capsys, command: str) -> str:
    """The ``--methods`` paragraph of ``uqreg COMMAND --help``, on one line."""
    from uqreg.cli import main

    capsys.readouterr()
    try:
        main([command, "--help"])
    except SystemExit as stop:
        assert stop.code == 0
    text = capsys.readouterr().out
    start = text.index("  --methods METHODS")
    end = re.search(r"^  --", text[start + 3:], flags=re.MULTILINE).start() + start + 3
    return " ".join(text[start:end].split())


@pytest.mark.parametrize("command", ["study", "sweep", "real"])
def test_the_methods_help_names_every_version_and_only_accepted_names(capsys, command):
    """The help of ``--methods`` of ``study``, ``sweep`` and ``real`` (one text, from the
    registries): every name it lists is accepted, and every family of names accepted appears,
    the conformal versions (``+<score>``, ``+mv+<score>``, ``+cqr``) and the quantile one
    (``+qr``) included (uqreg methods and the README list them)."""
    from uqreg.methods import (
        conformal_method_names,
        get_method,
        list_methods,
        mean_variance_method_names,
        quantile_method_names,
    )

    text = _methods_help(capsys, command)
    listed = set(re.findall(r"(?<![\w<>+])[a-z][a-z_]*(?:\+[a-z_]+)+", text))
    listed |= {n for n in list_methods() if re.search(rf"[ (]{n}[,;]", text)}
    for name in sorted(listed):
        get_method(name)  # accepted (an unknown one raises)
    assert set(list_methods()) <= listed
    assert set(mean_variance_method_names()) <= listed
    assert set(quantile_method_names()) <= listed  # +qr and +cqr, each base
    assert listed & set(conformal_method_names())  # <method>+<score>
    assert any(n.count("+") == 2 and n.split("+")[1] == "mv" for n in listed)  # <method>+mv+<score>
    for family in ("<method>+<score>", "<method>+mv", "<method>+qr", "<method>+cqr", "+<score>"):
        assert family in text, family
    scores = catalog.names("conformal score")
    assert all(s in text for s in scores)
    assert set(catalog.method_names()) >= listed
    for name in catalog.method_names():
        get_method(name)
