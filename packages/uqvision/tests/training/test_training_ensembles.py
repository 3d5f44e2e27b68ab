"""Which runs form an ensemble: ``uqvision train`` records it (issue 37, section 3).

One network trained alone is a ``single`` model; the K runs of ``uqvision train --members K``
are one deep ensemble whose caches share one ``ensemble`` id, which no other command's runs
have. A sidecar written before the record existed is read as before (``deep_ensemble``, no
id), with a note.
"""

from __future__ import annotations

import json
import re

import pytest
from uqmetrics import InputError

from uqvision.cache import read_cache
from uqvision.cli import main
from uqvision.training.runs import UndeclaredEnsembleWarning, load_run

#: One quick epoch of a tiny network on the 65 digits training images.
_FAST = ["--arch", "test_vit", "--input-size", "16", "--epochs", "1", "--batch-size", "32"]


def _train(digits, out, *extra) -> int:
    return main(["--threads", "1", "train", "--data", str(digits / "train"), *_FAST,
                 "--out", str(out), *extra])


def _caches(digits, tmp_path, *checkpoints) -> list:
    """Predict every checkpoint on the test folder; its caches, read back."""
    out = tmp_path / "caches"
    models = [a for c in checkpoints for a in ("--model", f"test_vit={c}")]
    assert main(["predict", *models, "--data", str(digits / "test"), "--out", str(out)]) == 0
    return [read_cache(p) for p in sorted(out.glob("*.nc"))]


def _side(path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


def test_one_trained_network_is_single_and_members_share_their_commands_id(digits, tmp_path,
                                                                           capsys):
    one = tmp_path / "one.safetensors"
    assert _train(digits, one) == 0
    assert re.search(r"one\.safetensors  single  loss=", capsys.readouterr().out)
    assert _side(one)["method"] == "deep_ensemble"  # the training method (the recipe)
    assert _side(one)["ensemble"]["size"] == 1

    pattern = tmp_path / "m{seed}.safetensors"
    assert _train(digits, pattern, "--members", "2") == 0
    printed = capsys.readouterr().out
    members = [tmp_path / "m0.safetensors", tmp_path / "m1.safetensors"]
    records = [_side(m)["ensemble"] for m in members]
    assert [r["member"] for r in records] == [0, 1] and {r["size"] for r in records} == {2}
    assert records[0]["id"] == records[1]["id"] and records[0]["id"] in printed
    assert [_side(m)["train_config"]["seed"] for m in members] == [0, 1]

    again = tmp_path / "n{seed}.safetensors"  # the same command again: another ensemble
    assert _train(digits, again, "--seeds", "0", "1") == 0
    other = _side(tmp_path / "n0.safetensors")["ensemble"]
    assert other["size"] == 2 and other["id"] != records[0]["id"]
    assert _side(one)["ensemble"]["id"] not in (records[0]["id"], other["id"])

    caches = {c.attrs["model"]: c.attrs for c in _caches(digits, tmp_path, one, *members,
                                                         tmp_path / "n1.safetensors")}
    assert caches["test_vit@one"]["method"] == "single"
    assert (caches["test_vit@one"]["ensemble"], caches["test_vit@one"]["ensemble_size"]) == (
        "", 1)
    for name, rec in (("test_vit@m0", records[0]), ("test_vit@m1", records[1]),
                      ("test_vit@n1", other)):
        assert caches[name]["method"] == "deep_ensemble"
        assert (caches[name]["ensemble"], caches[name]["ensemble_size"]) == (rec["id"], 2)


def test_members_and_seeds_must_agree(digits, tmp_path, capsys):
    assert _train(digits, tmp_path / "m{seed}", "--members", "3", "--seeds", "4", "5") == 2
    assert "--members 3 but --seeds lists 2 seed(s) [4, 5]" in capsys.readouterr().err
    assert _train(digits, tmp_path / "m.safetensors", "--members", "2") == 2
    assert "must contain '{seed}'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        _train(digits, tmp_path / "m{seed}", "--members", "0")
    assert exit_.value.code == 2
    assert "--members: must be >= 1, got 0" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_sidecar_without_the_record_reads_as_before_with_a_note(trained, tmp_path):
    """A ``deep_ensemble`` sidecar written before runs recorded their ensemble: method
    ``deep_ensemble``, no id, and a warning that says so; a run trained by a library call that
    declared none (``null``) reads the same, silently; a damaged record is refused, naming the
    sidecar; a sidecar that names no training method (written by hand for a checkpoint uqvision
    did not train) is no deep-ensemble member."""
    ckpt = tmp_path / "old.safetensors"
    ckpt.write_bytes(trained.checkpoint.read_bytes())
    side = json.loads(trained.sidecar.read_text())
    assert side["ensemble"] is None  # train_model without ensemble=
    run = load_run(f"test_byobnet={trained.checkpoint}")
    assert (run.method, run.ensemble, run.ensemble_size) == ("deep_ensemble", "", 0)

    del side["ensemble"]
    ckpt.with_suffix(".json").write_text(json.dumps(side))
    with pytest.warns(UndeclaredEnsembleWarning, match=r"old\.safetensors.*before runs recorded"):
        run = load_run(f"test_byobnet={ckpt}")
    assert (run.method, run.ensemble, run.ensemble_size) == ("deep_ensemble", "", 0)

    for bad in ({"id": "x", "size": 2, "member": 2}, {"id": "", "size": 1, "member": 0},
                "x", {"id": "x", "size": 2}):
        ckpt.with_suffix(".json").write_text(json.dumps({**side, "ensemble": bad}))
        with pytest.raises(InputError, match=r"sidecar '.*old\.json': its 'ensemble' must be"):
            load_run(f"test_byobnet={ckpt}")

    ckpt.with_suffix(".json").write_text(json.dumps({"classes": side["classes"]}))
    assert load_run(f"test_byobnet={ckpt}").method == ""
