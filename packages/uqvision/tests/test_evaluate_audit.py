"""``uqvision evaluate FILE`` read as docs/evaluate.md says, on a walkthrough's findings.

- A key given in both spellings (``n_cal`` and ``n-cal``) in one options table is refused,
  as ``--config`` refuses it (the last one silently won), naming the file, the table and
  both keys.
- An expanded set's caches are named ``<set>-<member>`` whatever its table's name (as
  ``uqvision sweep --sets`` names them; the shift and conformal scores hold one row per
  corruption and severity): two ImageNet-C tables with a member in common are one clear line
  naming both tables (it was a garbled line naming the file twice), a table of one folder
  named like a member's caches too; two with no member in common are planned, each member
  its set's. Checked at the plan (``--dry-run``), on ImageNet-C the project makes from its
  generated stand-in images.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from uqmetrics import InputError

from uqvision.cli import main
from uqvision.data import make_synthetic_folder
from uqvision.data.corruptions import make_corrupted_folder
from uqvision.evaluate import plan_evaluation, read_evaluation

HEAD = """
out = "out"
models = ["test_byobnet"]
[sets.test]
role = "test"
path = "data/test"
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A stand-in test split (2 classes x 3 images) and three ImageNet-C made from it:
    c1 and c2 with one member in common (brightness-1), c3 with another (contrast-1)."""
    root = tmp_path_factory.mktemp("evaluate-audit")
    make_synthetic_folder(root / "data", n_classes=2, n_per_class=3, image_size=16)
    for name, corruption in (("c1", "brightness"), ("c2", "brightness"), ("c3", "contrast")):
        make_corrupted_folder(root / "data" / "test", root / name, corruptions=(corruption,),
                              severities=(1,), resize=32, crop=32, progress=False)
    return root


def _refused(capsys, toml: Path) -> str:
    """``uqvision evaluate FILE --dry-run``: exit code 2 and one line on stderr; that line."""
    capsys.readouterr()
    assert main(["evaluate", str(toml), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("uqvision evaluate: error: ") and err.count("\n") == 1, err
    return err.strip()


# -- 1. one option, two spellings -------------------------------------------------------------


@pytest.mark.parametrize("table, keys", [
    ("protocols.conformal", ("n_cal = 50", "n-cal = 40")),
    ("protocols.selective", ("calibration-size = 0.5", "calibration_size = 0.25")),
    ("predict", ("batch_size = 8", "batch-size = 4")),
])
def test_a_key_in_both_spellings_is_refused_naming_file_table_and_both(tmp_path, capsys,
                                                                        table, keys):
    (tmp_path / "data" / "test").mkdir(parents=True)
    toml = tmp_path / "e.toml"
    protocol = "" if table.startswith("protocols.") else "[protocols.selective]\n"
    toml.write_text(HEAD + protocol + f"[{table}]\n" + "\n".join(keys) + "\n")
    first, second = (k.split(" = ")[0] for k in keys)
    with pytest.raises(InputError) as exc:
        read_evaluation(toml)
    message = str(exc.value)
    assert message == (f"{toml}: [{table}]: keys {first!r} and {second!r} are one option "
                       f"(--{first.replace('_', '-')}): give it once"), message
    assert _refused(capsys, toml).endswith(message)


def test_one_spelling_each_is_read(tmp_path):
    (tmp_path / "data" / "test").mkdir(parents=True)
    toml = tmp_path / "e.toml"
    toml.write_text(HEAD + "[protocols.conformal]\nn_cal = 50\n[predict]\nbatch-size = 4\n")
    ev = read_evaluation(toml)
    assert "--n-cal=50" in ev.protocols["conformal"] and "--batch-size=4" in ev.predict


# -- 2. the names of an expanded set's caches ---------------------------------------------------


def _sets(*tables: tuple[str, str]) -> str:
    return "".join(f'[sets.{name}]\nset = "imagenet-c"\npath = "{path}"\n'
                   for name, path in tables) + "[protocols.shift]\n"


def test_two_imagenet_c_sets_with_a_member_in_common_are_one_clear_line(root, capsys):
    toml = root / "two.toml"
    toml.write_text(HEAD + _sets(("digits-c", "c1"), ("other-c", "c2")))
    line = _refused(capsys, toml)
    assert line == (
        f"uqvision evaluate: error: {toml}: [sets.digits-c] and [sets.other-c] would both "
        "write the caches of dataset 'imagenet-c-brightness-1': an expanded set's caches are "
        "named <set>-<member> whatever its table's name, and the shift and conformal scores "
        "hold one row per corruption and severity, so two imagenet-c sets with a member in "
        "common cannot be evaluated together: evaluate one of them in another file, with "
        "another out"), line
    assert line.count(str(toml)) == 1 and "'s too" not in line
    assert not (root / "out").exists()


def test_a_table_named_like_a_members_caches_is_refused_naming_both(root, capsys):
    toml = root / "clash.toml"
    toml.write_text(HEAD.replace("[sets.test]", "[sets.imagenet-c-brightness-1]")
                    + _sets(("digits-c", "c1")))
    line = _refused(capsys, toml)
    assert (f"{toml}: [sets.imagenet-c-brightness-1] and [sets.digits-c] would both write the "
            "caches of dataset 'imagenet-c-brightness-1': [sets.digits-c]'s member caches are "
            "named <set>-<member>, [sets.imagenet-c-brightness-1]'s by its table; rename "
            "[sets.imagenet-c-brightness-1]") in line, line
    assert line.count(str(toml)) == 1 and "--data" not in line


def test_two_imagenet_c_sets_of_other_members_are_planned_each_its_own(root):
    toml = root / "apart.toml"
    toml.write_text(HEAD + _sets(("digits-c", "c1"), ("other-c", "c3")))
    plan = plan_evaluation(read_evaluation(toml))
    assert {t.dataset_name: plan.set_of[t.dataset_name] for t in plan.targets} == {
        "imagenet-c-brightness-1": "digits-c", "imagenet-c-contrast-1": "other-c"}
    assert plan.set_of["test"] == "test"
