"""Every registered protocol's result files follow the result-file schema
(:mod:`uqmetrics.runs.result_schema`, docs/conventions.md#result-schema): the shared reader reads each
file its smoke reproduction wrote, as the protocol's own (attr ``protocol`` = its registry name),
with tagged metric variables and the checksums of caches it was computed from.

The smoke runs are the session's (``conftest.smoke_run``), shared with each protocol's own tests
and ``test_protocols_common.py``: this file adds the reading only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from uqmetrics import read_dataset
from uqmetrics.runs.result_schema import input_checksum, metric_variables, read_result

from uqvision.protocols import VISION_PROTOCOLS

NAMES = VISION_PROTOCOLS.names()


def _result_files(out: Path) -> list[Path]:
    """The netCDF files of a reproduction's folder that are not its inputs (``caches/``)."""
    return sorted(p for p in out.rglob("*.nc")
                  if "caches" not in p.relative_to(out).parts and not p.name.startswith("."))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_result_file_of_a_smoke_reproduction_follows_the_schema(name, smoke_run):
    out, path = smoke_run(name)
    files = _result_files(out)
    assert files and (path in files or path.suffix != ".nc"), (path, files)
    inputs = {input_checksum(read_dataset(p)) for p in (out / "caches").rglob("*.nc")
              if not p.name.startswith(".")}
    for file in files:
        ds = read_result(file, protocol=name)
        assert metric_variables(ds), file
        recorded = json.loads(ds.attrs["input_checksums"])
        assert set(recorded) <= inputs, (file, sorted(set(recorded) - inputs))
