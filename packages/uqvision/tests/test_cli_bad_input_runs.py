"""Bad input to ``uqvision evaluate``, ``predict``, ``sweep``, ``train`` and ``score`` (the audit
of the command line): ONE line on stderr naming the option as typed (or, in an evaluation file,
the file, its table and key) and the value, exit code 2, no traceback, and nothing written
before the refusal (the README's "Bad input").

- an evaluation file's protocol options are checked as their score commands will run, before
  any sweep and in ``--dry-run`` too (``calibration-size = 1.5``, or a count the test set does
  not have); a set's path, a model, the output folder are named by the file and the key (or
  ``--out``);
- ``--calibration-size`` is a count (an integer) or a fraction: ``1.5`` is the parser's error;
- ``predict`` refuses an option its ``--mode`` does not use (``--passes`` with ``plain``) and
  names ``--model`` for a checkpoint that is a folder; ``predict``, ``sweep`` and ``train``
  name ``--data``, ``--val-data``, ``--init``, ``--index-file`` and ``--classes``.

No network is built: every refusal comes before a model loads.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from uqvision.cli import main

ARCH = "test_byobnet"




# ---------------------------------------------------------------------------------------------
# uqvision evaluate FILE


def _evaluation(tmp_path: Path, digits: Path, *, selective: str = "calibration-size = 0.2",
                extra: str = "", predict: str = "", test: str | None = None,
                models: str = f'["{ARCH}"]', out: str = "out") -> Path:
    toml = tmp_path / "e.toml"
    toml.write_text(f"""
out = "{out}"
models = {models}
[predict]
random-init = true
{predict}
[sets.test]
role = "test"
path = "{test or digits / 'test'}"
{extra}
[protocols.selective]
{selective}
""")
    return toml


def test_a_protocol_option_its_scorer_refuses_is_refused_before_any_sweep(digits, tmp_path,
                                                                         capsys, refused):
    """calibration-size = 1.5 passed --dry-run, swept, then failed in scoring naming neither
    the file nor the key: refused before anything runs, dry run or not."""
    toml = _evaluation(tmp_path, digits, selective="calibration-size = 1.5")
    for dry in (["--dry-run"], []):
        line = refused(["evaluate", str(toml), "--no-figures", *dry])
        assert line.startswith(f"uqvision evaluate: error: {toml}: [protocols.selective]: "), line
        assert "--calibration-size" in line and "got 1.5" in line, line
        assert "integer" in line and "fraction in (0, 1)" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("selective", ["calibration-size = 5000",
                                       ""])  # not given: the default 5000, ImageNet's

def test_a_calibration_size_the_test_set_lacks_is_refused_at_plan_time(
        digits, tmp_path, capsys, selective, refused):
    toml = _evaluation(tmp_path, digits, selective=selective)
    n = sum(1 for p in (digits / "test").rglob("*") if p.is_file())
    for dry in (["--dry-run"], []):
        line = refused(["evaluate", str(toml), "--no-figures", *dry])
        assert line.startswith(f"uqvision evaluate: error: {toml}: [protocols.selective]: "
                               "calibration size 5000 gives"), line
        assert f"use a count in [1, {n - 1}]" in line and "--calibration-size" in line, line
        assert line.endswith(f"(the test set [sets.test] has {n} image(s))"), line
    assert not (tmp_path / "out").exists()


def test_a_set_path_that_is_a_file_names_the_file_and_the_set(digits, tmp_path, capsys, refused):
    image = next(p for p in sorted((digits / "test").rglob("*")) if p.is_file())
    toml = _evaluation(tmp_path, digits, test=str(image))
    line = refused(["evaluate", str(toml), "--dry-run"])
    assert line.startswith(f"uqvision evaluate: error: {toml}: [sets.test]: key 'path' = "
                           f'"{image}": '), line
    assert "is a file, neither an image folder" in line
    # a set other than the test set: named by its own table
    toml = _evaluation(tmp_path, digits, extra=f'[sets.fit]\nrole = "fit"\npath = "{image}"\n'
                       "[protocols.ood]\ndetectors = [\"msp\"]\n")
    line = refused(["evaluate", str(toml), "--dry-run"])
    assert line.startswith(f"uqvision evaluate: error: {toml}: [sets.fit]"), line
    assert str(image) in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("models, value", [
    ('["test_byobnett"]', "'test_byobnett': unknown timm model 'test_byobnett'; did you mean"),
    ('["no_such_model_xyz"]', "'no_such_model_xyz': unknown timm model"),
])
def test_an_unknown_model_names_the_file_and_the_models_key(digits, tmp_path, capsys, models,
                                                            value, refused):
    toml = _evaluation(tmp_path, digits, models=models)
    line = refused(["evaluate", str(toml), "--dry-run"])
    assert line.startswith(f"uqvision evaluate: error: {toml}: key 'models': {value}"), line


def test_an_output_folder_that_is_a_file_is_named_as_given(digits, tmp_path, capsys, refused):
    """It said ``.../afile.txt/sweep_failures.json: has a file where a folder is expected``."""
    afile = tmp_path / "afile.txt"
    afile.write_text("precious\n")
    toml = _evaluation(tmp_path, digits, out="afile.txt")  # relative: inside the file's folder
    line = refused(["evaluate", str(toml), "--dry-run"])
    assert line == f"uqvision evaluate: error: {toml}: key 'out' = 'afile.txt': '{afile}' is not a folder"
    line = refused(["evaluate", str(_evaluation(tmp_path, digits)), "--out",
                             str(afile / "sub"), "--dry-run"])
    assert line.startswith(f"uqvision evaluate: error: --out '{afile / 'sub'}': '{afile}' is "
                           "not a folder"), line
    assert afile.read_text() == "precious\n"


def test_a_read_only_output_folder_names_out(digits, tmp_path, capsys, monkeypatch, refused):
    """As root every folder is writable: the check sees a read-only file system here."""
    import uqvision.options

    locked = tmp_path / "locked"
    locked.mkdir()

    def check_writable(folder):
        probe = Path(folder)
        while not probe.exists():
            probe = probe.parent
        if probe == locked:
            raise PermissionError(errno.EROFS, "is on a read-only file system", str(probe))

    monkeypatch.setattr(uqvision.options, "check_writable", check_writable)
    line = refused(["evaluate", str(_evaluation(tmp_path, digits)), "--out",
                             str(locked / "run")])
    assert line.startswith(f"uqvision evaluate: error: --out '{locked / 'run'}': '{locked}' is "
                           "on a read-only file system"), line
    assert list(locked.iterdir()) == []


def test_a_prediction_option_the_mode_does_not_use_names_the_file(digits, tmp_path, capsys, refused):
    toml = _evaluation(tmp_path, digits, predict="passes = 5")
    line = refused(["evaluate", str(toml), "--dry-run"])
    assert line.startswith(f"uqvision evaluate: error: {toml}: [predict]: --passes 5: --mode "
                           "plain does not use it"), line


# ---------------------------------------------------------------------------------------------
# --calibration-size: a count or a fraction


def test_a_calibration_size_that_is_neither_a_count_nor_a_fraction_is_the_parsers_error(
        digits, tmp_path, capsys, refused):
    out = tmp_path / "s"
    line = refused(["score", "selective", "--caches", str(tmp_path), "--out",
                             str(out / "x.nc"), "--calibration-size", "1.5"])
    assert line.startswith("uqvision score selective: error: argument --calibration-size: must "
                           "be a count (an integer >= 1) or a fraction in (0, 1), got 1.5"), line
    line = refused(["sweep", "--models", ARCH, "--random-init", "--data",
                             str(digits / "test"), "--out", str(out), "--dry-run",
                             "--calibration-size", "1.5"])
    assert "argument --calibration-size: must be a count (an integer >= 1)" in line, line
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# uqvision predict / sweep


def test_an_option_the_mode_does_not_use_is_refused_naming_both(digits, tmp_path, capsys, refused):
    """--passes 5 with --mode plain was silently ignored (one pass)."""
    out = tmp_path / "c"
    base = ["predict", "--model", ARCH, "--random-init", "--data", str(digits / "test"),
            "--out", str(out)]
    for extra, option, mode in ((["--passes", "5"], "--passes 5", "plain"),
                                (["--mode", "mc_dropout", "--first-pass", "2"],
                                 "--first-pass 2", "mc_dropout"),
                                (["--mode", "mc_dropout", "--tta-policy", "crop"],
                                 "--tta-policy crop", "mc_dropout")):
        line = refused([*base, *extra])
        assert line.startswith(f"uqvision predict: error: {option}: --mode {mode} does not use "
                               "it (it is for --mode tta"), line
    line = refused(["sweep", "--models", ARCH, "--random-init", "--data",
                             str(digits / "test"), "--out", str(out), "--dry-run",
                             "--passes", "3", "--calibration-size", "0.2"])
    assert "--passes 3: --mode plain does not use it" in line, line
    assert not out.exists()


def test_a_checkpoint_that_is_a_folder_names_model(digits, tmp_path, capsys, refused):
    """It said ``checkpoint 'ck' does not exist``."""
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "m.safetensors").write_bytes(b"")
    line = refused(["predict", "--model", f"{ARCH}={folder}", "--data",
                             str(digits / "test"), "--out", str(tmp_path / "c")])
    assert line == (f"uqvision predict: error: --model '{ARCH}={folder}': checkpoint "
                    f"'{folder}' is a folder, not a checkpoint file; give the weight file (it "
                    "holds m.safetensors)")
    line = refused(["predict", "--model", f"{ARCH}={tmp_path / 'nope.pt'}", "--data",
                             str(digits / "test"), "--out", str(tmp_path / "c")])
    assert line.startswith(f"uqvision predict: error: --model '{ARCH}={tmp_path / 'nope.pt'}'"
                           ": checkpoint "), line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("command", ["predict", "sweep", "train"])
def test_a_data_folder_that_does_not_exist_names_data(tmp_path, capsys, command, refused):
    nope = tmp_path / "nope"
    out = tmp_path / "o"
    argv = {"predict": ["--model", ARCH, "--random-init", "--out", str(out)],
            "sweep": ["--models", ARCH, "--random-init", "--out", str(out), "--dry-run"],
            "train": ["--arch", ARCH, "--out", str(out / "m.safetensors"), "--epochs", "1"]}
    line = refused([command, *argv[command], "--data", str(nope)])
    assert line == f"uqvision {command}: error: --data: image folder '{nope}' does not exist"
    empty = tmp_path / "empty"
    empty.mkdir()
    line = refused([command, *argv[command], "--data", str(empty)])
    assert line.startswith(f"uqvision {command}: error: --data: image folder '{empty}' "), line
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# uqvision train


@pytest.fixture
def train(digits, tmp_path):
    out = tmp_path / "m.safetensors"
    return out, ["train", "--arch", ARCH, "--data", str(digits / "train"), "--out", str(out),
                 "--epochs", "1", "--input-size", "16"]


def test_train_names_its_input_options(train, digits, tmp_path, capsys, refused):
    out, argv = train
    nope = tmp_path / "nope"
    for extra, said in (
            (["--val-data", str(nope)], f"--val-data: image folder '{nope}' does not exist"),
            (["--init", f"{nope}.pt"], f"--init '{nope}.pt': does not exist"),
            (["--init", str(digits)], f"--init '{digits}': is a folder, not a file"),
            (["--index-file", f"{nope}.json"], f"--index-file '{nope}.json': does not exist"),
            (["--classes", "0,1,99"], (f"--classes '0,1,99': 1 class(es) not in --data "
                                       f"'{digits / 'train'}': ['99']"))):
        line = refused([*argv, *extra])
        assert line.startswith(f"uqvision train: error: {said}"), line
    assert not out.exists()


def test_train_names_a_damaged_index_file(train, tmp_path, capsys, refused):
    out, argv = train
    index = tmp_path / "index.json"
    index.write_text("{not json")
    line = refused([*argv, "--index-file", str(index)])
    assert line.startswith(f"uqvision train: error: --index-file '{index}': not a JSON file ("), line
    assert not out.exists()


def test_a_valid_train_input_still_trains(train, digits, tmp_path, capsys):
    """The checks refuse nothing valid: a class subset of --data trains."""
    out, argv = train
    classes = sorted(p.name for p in (digits / "train").iterdir() if p.is_dir())[:2]
    assert main([*argv, "--classes", ",".join(classes), "--val-data",
                 str(digits / "test")]) == 0, capsys.readouterr().err
    assert out.is_file()
