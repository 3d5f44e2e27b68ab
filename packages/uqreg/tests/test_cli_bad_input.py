"""Bad names on the ``uqreg`` command line: an unknown task, method or recipe is one line on
stderr naming the option (``--task``, ``--methods``, ``--recipes``) and the value, exit code 2,
before anything is trained or written; a bad name that ``--config FILE`` gave names the file
and its key (the README's "Bad input")."""

from __future__ import annotations

import pytest

from uqreg import cli
from uqreg.methods import Method


@pytest.fixture
def no_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(Method, "run", fail)


def _refused(args: list[str], capsys) -> str:
    """``uqreg ARGS``'s exit code 2 and its one line on stderr."""
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command, option, value, valid", [
    ("study", "--task", "nosuch", "valid tasks: polynomial"),
    ("sweep", "--task", "nosuch", "valid tasks: polynomial"),
    ("study", "--methods", "ens,foo", "valid methods: blr"),
    ("study", "--methods", "ens+cp_nope", "a conformal version is <method>+<score>"),
    ("study", "--recipes", "paper,foo", "valid recipes: paper"),
    ("real", "--methods", "ens,foo", "valid methods: blr"),
])
def test_an_unknown_name_names_its_option_and_value(command, option, value, valid, tmp_path,
                                                      capsys, no_training):
    out = tmp_path / "out"
    err = _refused([command, option, value, "--out", str(out), "--quiet"], capsys)
    assert err.startswith(f"uqreg {command}: error: {option} must name ") and valid in err, err
    assert err.rstrip().endswith(f"got {value}"), err
    assert not out.exists()


@pytest.mark.parametrize("command", ["study", "sweep", "real"])
def test_backend_triton_on_the_cpu_is_refused_before_any_work(command, tmp_path, capsys, no_training):
    out = tmp_path / "out"
    err = _refused([command, "--backend", "triton", "--out", str(out), "--quiet"], capsys)
    assert err == (f"uqreg {command}: error: --backend triton runs on a CUDA device (pass --device cuda), "
                   "got --device cpu\n"), err
    assert not out.exists()


def test_reference_names_task(capsys):
    err = _refused(["reference", "--task", "nope"], capsys)
    assert err.startswith("uqreg reference: error: --task must name a registered task (unknown "
                          "task 'nope'; valid tasks: "), err
    assert err.rstrip().endswith("got nope")


@pytest.mark.parametrize("key, text, option", [
    ("task", '"nosuch"', "--task"),
    ("methods", '["ens", "foo"]', "--methods"),
    ("recipes", '"foo"', "--recipes"),
    ("n_cal", "0", "--n-cal"),  # any field the file gives: named by the file and its key
])
def test_a_bad_name_from_a_config_file_names_the_file_and_key(key, text, option, tmp_path,
                                                               capsys, no_training):
    config = tmp_path / "bad.toml"
    extra = 'methods = "ens+cp_abs"\n' if key == "n_cal" else ""
    config.write_text(f'command = "uqreg study"\n[options]\n{key} = {text}\n{extra}')
    out = tmp_path / "out"
    err = _refused(["study", "--config", str(config), "--out", str(out), "--quiet"], capsys)
    assert err.startswith(f"uqreg study: error: --config {str(config)!r}: key {key!r} "
                          f"({option}) must "), err
    assert not out.exists()


def test_an_option_on_the_line_is_named_as_the_option_not_the_file(tmp_path, capsys,
                                                                   no_training):
    """The command line overrides the file: its bad value is the option's."""
    config = tmp_path / "ok.toml"
    config.write_text('command = "uqreg study"\n[options]\ntask = "sinusoid"\n')
    out = tmp_path / "out"
    err = _refused(["study", "--config", str(config), "--methods", "ens,foo", "--out",
                    str(out), "--quiet"], capsys)
    assert err.startswith("uqreg study: error: --methods must name registered methods "), err
    assert str(config) not in err
    assert not out.exists()
