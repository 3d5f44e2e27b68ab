"""``uqvision sweep --gpus``: one local Dask worker per GPU (uqmetrics.runs.sweep.ClusterSpec),
checked before anything runs. The GPUs are faked here (their count); nothing is started."""

from uqmetrics.runs.sweep import options

from uqvision.cli import main


def _sweep(tmp_path, *extra: str) -> list[str]:
    return ["sweep", "--models", "test_resnet", "--data", str(tmp_path / "none"),
            "--out", str(tmp_path / "out"), *extra]


def test_gpus_needs_cells_on_cuda_and_enough_gpus(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(options, "_gpu_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(_sweep(tmp_path, "--gpus", "2", "--device", "cpu")) == 2
    assert ("--device cpu: with --gpus each worker sees its own GPU alone, as cuda"
            in capsys.readouterr().err)
    assert main(_sweep(tmp_path, "--gpus", "3")) == 2
    assert "--gpus 3: asks for 3 GPUs, 2 GPU(s) visible here" in capsys.readouterr().err


def test_evaluate_dry_run_checks_gpus_as_the_run_does(tmp_path, monkeypatch, capsys):
    """``uqvision evaluate --dry-run --gpus`` refuses what the run would refuse (here cells
    not on cuda) instead of estimating a run that cannot start. (With cells on cuda, the
    estimate counts one worker per GPU; CUDA itself is checked when the file is read.)"""
    from PIL import Image

    monkeypatch.setattr(options, "_gpu_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "data" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "data" / "a" / "x.png")
    toml = tmp_path / "e.toml"
    base = 'out = "out"\nmodels = ["test_resnet"]\n[sets.test]\nrole = "test"\npath = "data"\n' \
           '[protocols.selective]\n'
    toml.write_text(base)
    assert main(["evaluate", str(toml), "--dry-run", "--gpus", "2"]) == 2
    assert "--device cpu: with --gpus each worker sees its own GPU alone" in capsys.readouterr().err
