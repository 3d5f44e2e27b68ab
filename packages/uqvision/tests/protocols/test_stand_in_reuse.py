"""A reproduction rerun into the same ``--out`` with another scale, seed or ambiguity never
trains and scores on the earlier run's stand-in (``ensure_hierarchy``): the set it holds is
kept when it is the one asked for, replaced with ``--overwrite``, and refused otherwise, naming
the folder, what it holds and what the run needs. Before, every driver but selective's kept
``OUT/data`` whatever it held, while recording the new options in its results."""

from __future__ import annotations

import json

import pytest

from uqvision.hierarchy import ensure_hierarchy, make_hierarchy, read_hierarchy
from uqvision.protocols import VISION_PROTOCOLS

#: Where a driver keeps its stand-in below ``--out`` (default ``data``).
DATA = {"url": "data/hierarchy"}
#: Every protocol with a reproduction driver (a new driver must be added here).
DRIVERS = ("selective", "pitfalls", "uimnet", "url", "shift", "ood", "conformal", "disentangle")


def test_every_reproduction_driver_is_checked():
    import importlib.util

    assert {name for name, p in VISION_PROTOCOLS.items_ordered()  # built in: no plugin's
            if p.reproduce is not None
            and importlib.util.find_spec(f"uqvision.protocols.{name}")} == set(DRIVERS)


@pytest.fixture(scope="module")
def seed1(tmp_path_factory):
    """The smoke stand-in of seed 1, made once (copied into each test's --out)."""
    return make_hierarchy(tmp_path_factory.mktemp("seed1") / "data", scale="smoke", seed=1)


def _copy(src, dst):
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("name", DRIVERS)
def test_a_rerun_with_another_seed_is_refused_before_any_work(name, seed1, tmp_path):
    out = tmp_path / "out"
    data = _copy(seed1, out / DATA.get(name, "data"))
    driver = VISION_PROTOCOLS.lookup(name).reproduce
    with pytest.raises(ValueError) as err:
        driver.run(out, scale="smoke", seed=0, options={}, log=lambda *a, **k: None)
    msg = str(err.value)
    assert str(data) in msg and "seed 1" in msg and "seed 0" in msg and "--overwrite" in msg, msg
    assert read_hierarchy(data).seed == 1  # nothing replaced
    assert not (out / "models").exists() and not (out / "runs").exists()  # nothing trained


def test_the_set_asked_for_is_kept_and_another_replaced_only_with_overwrite(seed1, tmp_path):
    root = _copy(seed1, tmp_path / "data")
    stamp = (root / "classes.json").stat().st_mtime_ns
    assert ensure_hierarchy(root, scale="smoke", seed=1).seed == 1
    assert (root / "classes.json").stat().st_mtime_ns == stamp  # kept, not made again
    with pytest.raises(ValueError, match="holds the hierarchy set of scale 'smoke', seed 1, "
                                         "ambiguity 0; this run needs scale 'smoke', seed 2"):
        ensure_hierarchy(root, scale="smoke", seed=2)
    assert ensure_hierarchy(root, scale="smoke", seed=2, overwrite=True).seed == 2
    assert json.loads((root / "classes.json").read_text())["seed"] == 2
    fresh = ensure_hierarchy(tmp_path / "new", scale="smoke", seed=3)  # none there: made
    assert (fresh.scale, fresh.seed) == ("smoke", 3)


def test_ambiguity_and_its_weight_law_are_part_of_what_is_asked_for(seed1, tmp_path):
    root = _copy(seed1, tmp_path / "data")
    with pytest.raises(ValueError, match="ambiguity 0; this run needs .* ambiguity 0.5"):
        ensure_hierarchy(root, scale="smoke", seed=1, ambiguity=0.5)
    ensure_hierarchy(root, scale="smoke", seed=1, ambiguity=0.5, overwrite=True)
    assert read_hierarchy(root).ambiguity == 0.5
    assert ensure_hierarchy(root, scale="smoke", seed=1, ambiguity=0.5,
                            weight_law="uniform").ambiguity == 0.5
    with pytest.raises(ValueError, match=r"weight law uniform; this run needs .* weight law "
                                         r"beta\(2.0, 5.0\)"):
        ensure_hierarchy(root, scale="smoke", seed=1, ambiguity=0.5, weight_law="beta(2, 5)")
