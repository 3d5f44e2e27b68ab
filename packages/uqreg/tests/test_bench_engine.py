"""benchmarks/bench_engine.py's profile of one epoch (step_profile): each op's time and calls per
epoch as the difference of two profiled runs, sorted into GEMMs, Adam and the rest."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from uqmetrics.runs.testing.scripts import load_script

from uqreg.methods import get_method
from uqreg.presets import PRESETS
from uqreg.tasks import get_task

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_engine.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


def test_one_epoch_of_the_paper_cell_is_its_six_gemms_one_adam_and_the_rest(bench):
    e1 = PRESETS.lookup("paper-e1").config
    cfg = replace(e1.train, device="cpu")
    inst = get_task(e1.task).instance(e1.complexities[0], seed=0)
    prof = bench.step_profile(get_method("ens"), inst, inst.targets([0]), cfg, chunk=4, epochs=3)
    calls = {op: n for op, (_, n) in prof["per_op"].items()}
    # widths 1-128-64-32-1: baddbmm forward of layers 2 and 3; bmm their dW and dX; the
    # first layer's outer product and the output layer are no GEMMs; ONE fused Adam call
    assert (calls["aten::baddbmm"], calls["aten::bmm"], calls["aten::_fused_adam_"]) == (2, 4, 1)
    assert calls["aten::addcmul"] == 1 and calls["aten::leaky_relu_"] == 3
    assert all(float(n).is_integer() for n in calls.values())  # whole calls per epoch: nothing of the set-up left
    # 7 float32 streams over the 4 networks' 1·128 + 128·64 + 64·32 + 32·1 weights and 225 biases
    assert prof["adam_gb"] == pytest.approx(7 * 4 * 4 * (10400 + 225) / 1e9)
    assert prof["copy_gbs"] > 0 and "aten::bmm" in prof["table"]


def test_the_op_level_levers_compute_the_step_s_values_and_are_all_timed(bench):
    rows = bench.op_variants(4, 50, (1, 128, 64, 32, 1), "cpu", l2=1e-3)  # raises where a lever differs
    assert [key for key, *_ in rows] == ["adam_one", "adam_foreach", "l2_in_adam", "output_forward",
                                         "output_grad", "first_grad", "activation"]
    assert all(kept > 0 and other > 0 for *_, kept, other in rows)


def test_the_triton_rows_report_the_best_warps_of_each_precision_and_the_failures(bench, capsys):
    steps = {("ieee", 8): 0.5, ("ieee", 16): 0.25, ("tf32x3", 8): 0.2}
    fields = bench.report_triton(steps, step=1.0, roof=0.2, flops=1e9, diffs={"ieee": 2e-6, "tf32x3": 3e-5},
                                 failed=["nosuch"])
    assert fields == (" fraction_of_gemm_roofline_triton=0.800 triton_vs_eager=4.00 triton_warps=16 "
                      "triton_max_rel_diff=2.0e-06 triton_tf32x3_vs_eager=5.00 triton_tf32x3_warps=8 "
                      "triton_tf32x3_max_rel_diff=3.0e-05 triton_failed=nosuch")
    assert capsys.readouterr().out.count("backend triton") == 3
    assert bench.report_triton({}, 1.0, 0.2, 1e9, {"ieee": float("nan")}, ["ieee"]) == " triton_failed=ieee"
