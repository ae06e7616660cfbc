"""`plsh reproduce --kernel`: the convergence experiment for KERPLE biases."""

import json

import numpy as np
import pytest

from plsh_ref.cli import main
from plsh_ref.data import load_qkv
from plsh_ref.experiments.reproduce import (
    kernel_heads,
    matrix_error_experiment,
    output_error_experiment,
    stratified_rate_line,
)
from plsh_ref.kernels import Exponential, KerpleLog, kernel_matrix

ARGS = ["--n", "64", "--sigma", "2,8", "--num-samples", "1,4,16", "--reps", "2",
        "--output-reps", "1", "--max-tokens", "48", "--quiet", "--no-plots"]  # fmt: skip


def test_kernel_heads_keep_the_length_scale():
    pos = np.arange(30)
    assert kernel_heads("alibi", [4.0]) is None
    (log,) = kernel_heads("kerple-log", [4.0], r1=0.7)
    assert log == KerpleLog(0.7, 0.25)
    # p = 1 is ALiBi: exp(-(r / sigma)^1)
    (power,) = kernel_heads("kerple-power", [4.0], p=1.0)
    np.testing.assert_allclose(
        kernel_matrix(power, pos, pos), kernel_matrix(Exponential(4.0), pos, pos), rtol=1e-15
    )
    with pytest.raises(ValueError, match="^--kernel"):
        kernel_heads("gaussian", [4.0])


def test_exponential_kernels_reproduce_the_alibi_experiment_bit_for_bit():
    a = matrix_error_experiment(64, [2.0, 8.0], [1, 4], 2, 0, sampler="stratified")
    b = matrix_error_experiment(
        64,
        [2.0, 8.0],
        [1, 4],
        2,
        0,
        sampler="stratified",
        kernels=[Exponential(2.0), Exponential(8.0)],
    )
    for key in ("spectral", "max", "frobenius", "window"):
        assert np.array_equal(a[key], b[key])
    np.testing.assert_allclose(a["frobenius_square_exact"], b["frobenius_square_exact"], rtol=1e-9)


def test_kerple_output_reference_is_exact_kerple_attention():
    data = load_qkv(None)
    q, k, v = (data[x][:1, :, :32] for x in ("query", "key", "value"))
    heads = kernel_heads("kerple-log", np.full(q.shape[1], 8.0), r1=0.7)
    res = output_error_experiment(q, k, v, [4, 64], reps=1, seed=0, kernels=heads)
    alibi = output_error_experiment(q, k, v, [4, 64], reps=1, seed=0)
    # converges to its own reference, and that reference is not ALiBi's
    assert res["plsh_rel_fro"][1, 0] < res["plsh_rel_fro"][0, 0]
    assert not np.array_equal(res["no_bias"]["rel_fro"], alibi["no_bias"]["rel_fro"])


def test_cli_kerple_log_run(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["reproduce", "--kernel", "kerple-log", "--r1", "0.7", *ARGS, "--out", str(out)])
    assert code == 0
    record = json.loads((out / "results.json").read_text())
    assert record["config"]["kernel"] == "kerple-log"
    assert record["config"]["kernels"][0] == repr(KerpleLog(0.7, 0.5))
    assert set(record["stratified_exact_rms_slopes"]) == {"2", "8"}
    printed = capsys.readouterr().out
    assert "KERPLE-log (r1=0.7)" in printed and "stratified sampler, exact Frobenius" in printed


def test_cli_kerple_power_bad_p_is_one_line_exit_2(tmp_path, capsys):
    code = main(
        ["reproduce", "--kernel", "kerple-power", "--p", "2", *ARGS, "--out", str(tmp_path)]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("plsh reproduce: error: --p: must be in (0, 1]")


def _rate_line(printed):
    (line,) = [x for x in printed.splitlines() if x.startswith("stratified sampler, exact")]
    return line


def test_stratified_rate_line_names_the_kernel_and_states_the_range_for_alibi_only(
    tmp_path, capsys
):
    code = main(["reproduce", "--kernel", "kerple-log", "--r1", "0.7", *ARGS,
                 "--out", str(tmp_path / "log")])  # fmt: skip
    assert code == 0
    line = _rate_line(capsys.readouterr().out)
    assert "kernel=KERPLE-log (r1=0.7)" in line
    assert "(r1=0.7, r2=0.5)" in line and "(r1=0.7, r2=0.125)" in line  # sigma 2, 8
    assert "sigma=" not in line and "-3/4, offsets" not in line
    assert "No range is derived for this kernel" in line
    code = main(["reproduce", *ARGS, "--out", str(tmp_path / "alibi")])
    assert code == 0
    line = _rate_line(capsys.readouterr().out)  # ALiBi: labelled by sigma, with the range
    assert "kernel=ALiBi" in line and "(sigma=2)" in line and "(sigma=8)" in line
    assert "between -3/4, offsets dominating, and -2/3" in line


def test_stratified_rate_line_labels_kerple_power_by_its_parameters():
    heads = kernel_heads("kerple-power", [4.0, 16.0], p=0.5)
    line = stratified_rate_line({"4": -0.7, "16": None}, heads, 1024, "KERPLE-power (p=0.5)")
    assert "-0.700 (r1=0.5, p=0.5), n/a (r1=0.25, p=0.5)" in line
    assert "kernel=KERPLE-power (p=0.5), n=1024" in line and "sigma" not in line
    with pytest.raises(ValueError, match="^kernels: 2 kernels for 1 slopes"):
        stratified_rate_line({"4": -0.7}, heads, 1024, "KERPLE-power (p=0.5)")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--r1", "0.5"], "--r1: applies to --kernel kerple-log only, got --kernel alibi"),
        (["--kernel", "kerple-power", "--r1", "0.5"], "--r1: applies to --kernel kerple-log"),
        (["--p", "0.5"], "--p: applies to --kernel kerple-power only, got --kernel alibi"),
        (["--kernel", "kerple-log", "--p", "0.5"], "--p: applies to --kernel kerple-power"),
    ],
)
def test_a_kernel_option_for_another_kernel_is_refused(argv, message, tmp_path, capsys):
    # the option would be ignored: one line naming it, exit 2, no output folder
    out = tmp_path / "out"
    code = main(["reproduce", *ARGS, *argv, "--out", str(out)])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()
