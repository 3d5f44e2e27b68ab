"""Each option's help says its default (or that it is required) and its own meaning.

A walkthrough read ``-h`` literally and found: ``uqvision reproduce NAME --scale`` said "cpu (2
cores, under an hour)" though docs/reproduction-vision.md reports cpu runs over an hour, and
not its default; ``uqvision data imagenet-c`` showed one help for ``--corruptions`` and
``--severities`` and one for ``--resize`` and ``--crop``, and ``--src``, which the maker needs,
as optional; ``--calibration-size`` and ``--sac-rule`` (``score selective``, ``sweep``) did not
say their defaults. Each help is parsed here, option by option.
"""

from __future__ import annotations

import re

import pytest

from uqvision.cli import main
from uqvision.protocols import VISION_PROTOCOLS


def _help(capsys, monkeypatch, *path: str) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([*path, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def _usage(text: str) -> str:
    return " ".join(text.split("\n\n")[0].split())


def _options(text: str) -> dict[str, str]:
    """``{--flag: its help, whitespace folded}`` of every option of a help text."""
    out: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        m = re.match(r"  (-{1,2}[\w-]+)", line)
        if m:
            flag = m.group(1)
            out[flag] = line
        elif flag is not None and line.startswith("   "):
            out[flag] += " " + line
        else:
            flag = None
    for flag, body in out.items():  # the help: what follows the flags and metavars
        words = " ".join(body.split())
        out[flag] = re.sub(r"^(-{1,2}[\w-]+( [A-Z_{][\w,{}.-]*)?(, )?)+", "", words).strip()
    return out


@pytest.mark.parametrize("path", [("score", "selective"), ("sweep",)])
@pytest.mark.parametrize("flag, default", [
    ("--calibration-size", "5000"), ("--sac-rule", "largest")])
def test_selective_options_show_their_defaults(capsys, monkeypatch, path, flag, default):
    helps = _options(_help(capsys, monkeypatch, *path))
    assert f"default: {default}" in helps[flag], helps[flag]


@pytest.mark.parametrize("name", [n for n, p in VISION_PROTOCOLS.items_ordered()
                                  if p.reproduce is not None])
def test_reproduce_scale_shows_its_default_and_no_promised_time(capsys, monkeypatch, name):
    scale = _options(_help(capsys, monkeypatch, "reproduce", name))["--scale"]
    assert "(default: smoke)" in scale, scale
    assert "under an hour" not in scale and "docs/reproduction-vision.md" in scale, scale


def test_imagenet_c_maker_options_each_their_own_help_default_or_required(capsys, monkeypatch):
    text = _help(capsys, monkeypatch, "data", "imagenet-c")
    usage, helps = _usage(text), _options(text)
    # --src is required: shown so in the usage line and in its help
    assert " --src SRC " in usage and "[--src SRC]" not in usage, usage
    assert "required" in helps["--src"], helps["--src"]
    for flag, default in (("--corruptions", "default: the 15 benchmark corruptions"),
                          ("--severities", "default: 1,2,3,4,5"),
                          ("--resize", "(default: 256)"), ("--crop", "(default: 224)"),
                          ("--quality", "(default: 85)"), ("--seed", "(default: 0)")):
        assert default in helps[flag], (flag, helps[flag])
    # each option of a pair says its own meaning
    assert helps["--corruptions"] != helps["--severities"]
    assert helps["--resize"] != helps["--crop"]
    assert "severit" not in helps["--corruptions"] and "corruption" not in helps["--severities"]
    assert "resized" in helps["--resize"] and "crop" in helps["--crop"]


def test_imagenet_c_without_src_is_the_parsers_one_line_error(tmp_path, refused):
    line = refused(["data", "imagenet-c", "--out", tmp_path / "c"])
    assert line.startswith("uqvision data imagenet-c: error: ") and "--src" in line, line
    assert "required" in line and not (tmp_path / "c").exists(), line
