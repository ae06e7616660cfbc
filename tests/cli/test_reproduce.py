"""The main job `plsh reproduce` and the torch-free promise of plsh_ref."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from plsh_ref.cli import main
from plsh_ref.experiments.reproduce import (
    fit_loglog_slope,
    matrix_error_experiment,
    output_error_experiment,
)


def test_fit_loglog_slope_recovers_exponent():
    s = np.array([1, 2, 4, 8, 16])
    assert fit_loglog_slope(s, 3.0 * s**-0.5) == pytest.approx(-0.5, abs=1e-12)
    assert fit_loglog_slope(s, 0.1 * s**-1.0) == pytest.approx(-1.0, abs=1e-12)


@pytest.mark.parametrize("errors", [[1.0, 0.0], [1.0, -1.0], [1.0, np.nan]])
def test_fit_loglog_slope_rejects_nonpositive(errors):
    with pytest.raises(ValueError, match="errors"):
        fit_loglog_slope([1, 2], errors)


def test_matrix_errors_decrease_with_samples():
    # n=128, sigma=8: the mean spectral/Frobenius error over 4 reps at s=64 is about 8x
    # smaller than at s=1 (ratio sqrt(64)); the max norm saturates near 1 at s=1 and is
    # about 0.2 at s=64 (DKW). Factors 3 and 2 leave wide margins; the seeds are fixed.
    err = matrix_error_experiment(128, [8.0], [1, 64], reps=4, seed=3)
    for norm, factor in (("spectral", 3), ("frobenius", 3), ("max", 2)):
        assert err[norm][0, 1].mean() * factor < err[norm][0, 0].mean()


def test_output_error_baselines_and_convergence():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 4, 48, 8)) for _ in range(3))
    res = output_error_experiment(q, k, v, [2, 256], reps=2, seed=0)
    assert res["plsh_rel_fro"].shape == (2, 2)
    # More samples, smaller error (deterministic given the seeds).
    assert res["plsh_rel_fro"][1].mean() < res["plsh_rel_fro"][0].mean()
    assert res["no_bias"]["rel_fro"] > 0 and res["fixed_blocks"]["rel_fro"] > 0


def test_output_error_with_a_given_reference_is_the_same():
    """``plsh reproduce`` computes the exact output once and passes it to every sampler."""
    from plsh_ref.alibi import alibi_slopes
    from plsh_ref.attention import alibi_attention

    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(1, 2, 24, 4)) for _ in range(3))
    ref = alibi_attention(q, k, v, slopes=alibi_slopes(2), causal=True, return_lse=False)
    a = output_error_experiment(q, k, v, [2, 8], reps=1, seed=0)
    b = output_error_experiment(q, k, v, [2, 8], reps=1, seed=0, reference=ref)
    assert np.array_equal(a["plsh_rel_fro"], b["plsh_rel_fro"])
    assert a["no_bias"] == b["no_bias"] and a["fixed_blocks"] == b["fixed_blocks"]
    # a wrong reference changes the errors: the argument is really used
    c = output_error_experiment(q, k, v, [2, 8], reps=1, seed=0, reference=2 * ref)
    assert not np.array_equal(a["plsh_rel_fro"], c["plsh_rel_fro"])
    with pytest.raises(ValueError, match="^reference: must have shape"):
        output_error_experiment(q, k, v, [2, 8], reps=1, seed=0, reference=ref[:, :1])


def test_cli_small_run_writes_outputs(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "reproduce",
            "--n",
            "64",
            "--sigma",
            "2,8",
            "--num-samples",
            "1,4,16",
            "--reps",
            "2",
            "--output-reps",
            "1",
            "--max-tokens",
            "64",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    record = json.loads((out / "results.json").read_text())
    assert set(record["matrix_error_slopes"]) == {"spectral", "max", "frobenius"}
    assert np.array(record["matrix_error"]["frobenius"]).shape == (2, 3, 2)
    assert (out / "matrix_error.png").stat().st_size > 1000
    assert (out / "output_error.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "slope" in printed and str(out) in printed


def test_cli_user_qkv_and_bad_file(tmp_path, capsys):
    rng = np.random.default_rng(1)
    path = tmp_path / "mine.npz"
    np.savez(
        path,
        query=rng.normal(size=(1, 2, 40, 4)),
        key=rng.normal(size=(1, 1, 40, 4)),
        value=rng.normal(size=(1, 1, 40, 4)),
    )
    code = main(
        [
            "reproduce",
            "--n",
            "32",
            "--sigma",
            "4",
            "--num-samples",
            "1,8",
            "--fit-min-samples",
            "1",
            "--reps",
            "1",
            "--output-reps",
            "1",
            "--qkv",
            str(path),
            "--out",
            str(tmp_path / "o"),
            "--no-plots",
            "--quiet",
        ]
    )
    assert code == 0
    record = json.loads((tmp_path / "o" / "results.json").read_text())
    assert record["config"]["qkv_shape"]["key"] == [1, 1, 40, 4]
    bad = tmp_path / "bad.npz"
    np.savez(bad, query=rng.normal(size=(1, 2, 40, 4)))
    assert main(["reproduce", "--qkv", str(bad), "--out", str(tmp_path / "b"), "--quiet"]) == 2
    assert "key" in capsys.readouterr().err


@pytest.mark.parametrize("nonzero", [(), ("query", "key")])
def test_cli_refuses_qkv_whose_reference_output_is_zero(tmp_path, capsys, nonzero):
    # all-zero arrays (or a zero value) printed "nan ± 0" and exited 0
    rng = np.random.default_rng(2)
    arrays = {name: np.zeros((1, 1, 40, 4)) for name in ("query", "key", "value")}
    arrays.update({name: rng.normal(size=(1, 1, 40, 4)) for name in nonzero})
    path = tmp_path / "zeros.npz"
    np.savez(path, **arrays)
    out = tmp_path / "o"
    argv = ["reproduce", "--qkv", str(path), "--n", "32", "--out", str(out), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error: --qkv:" in err and "all zero" in err
    assert not out.exists()  # refused before any work


def test_plsh_ref_runs_without_torch(tmp_path):
    """Import every torch-free module and run the main job with torch/triton made unimportable."""
    code = textwrap.dedent(f"""
        import sys, importlib, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split('.')[0] in ('torch', 'triton'):
                    raise ImportError('blocked ' + name)
        sys.meta_path.insert(0, Block())
        import pkgutil, plsh_ref
        for mod in pkgutil.walk_packages(plsh_ref.__path__, 'plsh_ref.'):
            importlib.import_module(mod.name)
        from plsh_ref.cli import main
        assert main(['reproduce', '--n', '32', '--sigma', '4', '--num-samples', '1,2', '--fit-min-samples', '1',
                     '--reps', '1', '--output-reps', '1', '--max-tokens', '32',
                     '--no-plots', '--quiet', '--out', {str(tmp_path / "x")!r}]) == 0
        assert 'torch' not in sys.modules
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "argv",
    [
        ["spectrum", "--n", "0"],
        ["bounds", "--eps", "0"],
        ["reproduce", "--num-samples", "1", "--quiet"],
        ["reproduce", "--num-samples", "1,2", "--fit-min-samples", "100", "--quiet"],
        # -3 was accepted (it fitted over every s)
        ["reproduce", "--num-samples", "1,2", "--fit-min-samples", "-3", "--quiet"],
        ["reproduce", "--fixed-block-size", "0", "--n", "16", "--num-samples", "1,2", "--quiet"],
    ],
)
def test_cli_bad_options_one_line_exit_2(argv, capsys, tmp_path):
    """Bad options used to end in a traceback (exit 1); now one line and exit status 2."""
    code = main(argv + ["--out", str(tmp_path / "o")] if argv[0] != "bounds" else argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"plsh {argv[0]}: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_plots_label_axes_state_error_bars_and_anchor_the_reference_at_the_largest_s(
    tmp_path, monkeypatch
):
    # The figures of `plsh reproduce`: every axis has a y label, the figure says what the
    # markers and bars are, and the s^-1/2 line passes through the curves' mean at the
    # largest s (where they are asymptotic), not at s = 1.
    from matplotlib.figure import Figure

    from plsh_ref.experiments import reproduce

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    rng = np.random.default_rng(0)
    samples = [1, 4, 16, 64]
    s = np.array(samples, dtype=np.float64)
    decay = (1 + 3 / s)[None, :, None] * s[None, :, None] ** -0.5  # not yet s^-1/2 at s=1
    matrix = {
        norm: decay * rng.uniform(0.9, 1.1, size=(2, 4, 3)) * scale
        for norm, scale in zip(reproduce.NORMS, (4.0, 0.5, 10.0))
    }
    matrix["n"] = 32
    output = {
        "plsh_max_abs": decay[0] * rng.uniform(0.9, 1.1, size=(4, 2)),
        "plsh_rel_fro": 0.1 * decay[0] * rng.uniform(0.9, 1.1, size=(4, 2)),
        "no_bias": {"max_abs": 1.0, "rel_fro": 0.5},
        "fixed_blocks": {"max_abs": 0.8, "rel_fro": 0.4},
    }
    reproduce._plot(
        tmp_path, samples, [4.0, 16.0], matrix, output, {"stratified": (matrix, output)}
    )
    assert len(figures) == 2
    expected = [
        [np.exp(np.log(matrix[norm][:, -1].mean(axis=1)).mean()) for norm in reproduce.NORMS],
        [output["plsh_max_abs"][-1].mean(), output["plsh_rel_fro"][-1].mean()],
    ]
    for fig, anchors, reps in zip(figures, expected, (3, 2)):
        assert f"mean of {reps} independent repetitions" in fig._suptitle.get_text()
        assert "standard deviation" in fig._suptitle.get_text()
        assert "crosses: stratified sampler (mean only)" in fig._suptitle.get_text()
        for ax, anchor in zip(fig.axes, anchors):
            assert "$" in ax.get_ylabel() and ax.get_xlabel().startswith("number of samples $s$")
            (line,) = [ln for ln in ax.lines if "s^{-1/2}" in ln.get_label()]
            x, y = line.get_data()
            np.testing.assert_allclose(y, anchor * (x / x[-1]) ** -0.5, rtol=1e-12)
            assert y[0] != pytest.approx(anchor) and y[-1] == pytest.approx(anchor)


def _captured_figures(tmp_path, monkeypatch, others: bool):
    from matplotlib.figure import Figure

    from plsh_ref.experiments import reproduce

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    rng = np.random.default_rng(1)
    samples = [1, 4, 16, 64, 256]
    s = np.array(samples, dtype=np.float64)
    # sigma = 4 has the largest errors, at the top left where an inside legend sat
    matrix = {
        norm: (s[None, :, None] ** -0.5) * rng.uniform(0.9, 1.1, size=(3, 5, 3)) * scale
        * np.array([4.0, 2.0, 1.0])[:, None, None]
        for norm, scale in zip(reproduce.NORMS, (4.0, 0.5, 10.0))
    }  # fmt: skip
    matrix["n"] = 64
    output = {
        "plsh_max_abs": (s**-0.5)[:, None] * rng.uniform(0.9, 1.1, size=(5, 2)),
        "plsh_rel_fro": 0.1 * (s**-0.5)[:, None] * rng.uniform(0.9, 1.1, size=(5, 2)),
        "no_bias": {"max_abs": 1.0, "rel_fro": 0.5},
        "fixed_blocks": {"max_abs": 0.8, "rel_fro": 0.4},
    }
    extra = {"stratified": (matrix, output)} if others else None
    reproduce._plot(tmp_path, samples, [4.0, 16.0, 64.0], matrix, output, extra)
    return figures


@pytest.mark.parametrize("others", [False, True])
def test_plots_have_one_legend_outside_the_data(tmp_path, monkeypatch, others):
    """``matrix_error.png`` repeated a 7-entry legend in all three panels, over the
    sigma = 4 curves; now one figure legend, outside every panel, naming every curve once;
    titles at body size."""
    import matplotlib

    figures = _captured_figures(tmp_path, monkeypatch, others)
    assert len(figures) == 2
    body = matplotlib.rcParams["font.size"]
    for fig in figures:
        fig.draw_without_rendering()  # runs the layout (the closed figure has no canvas)
        assert all(ax.get_legend() is None for ax in fig.axes)  # no legend per panel
        assert len(fig.legends) == 1
        legend = fig.legends[0].get_window_extent()
        for ax in fig.axes:
            assert not legend.overlaps(ax.get_window_extent()), "legend over a panel"
            for line in ax.lines:  # and, a fortiori, over no curve
                xy = ax.transData.transform(np.column_stack(line.get_data()))
                inside = (
                    (xy[:, 0] >= legend.x0) & (xy[:, 0] <= legend.x1)
                    & (xy[:, 1] >= legend.y0) & (xy[:, 1] <= legend.y1)
                )  # fmt: skip
                assert not inside.any(), line.get_label()
            assert ax.title.get_fontsize() == body
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert fig._suptitle.get_fontsize() == body
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        curves = {ln.get_label() for ln in fig.axes[0].lines if not ln.get_label().startswith("_")}
        curves |= {c.get_label() for c in fig.axes[0].containers}
        assert sorted(labels) == sorted(curves) and len(set(labels)) == len(labels)
    # the negative control of the bounding-box check: the old inside legend is caught
    fig = figures[0]
    old = fig.axes[0].legend(loc="upper right")
    fig.draw_without_rendering()
    assert old.get_window_extent().overlaps(fig.axes[0].get_window_extent())


def test_sampler_table_header_names_its_columns(tmp_path, capsys):
    """The stratified/iid table packed 'ratio ± se (exact); window' into one cell under a
    'sigma=4' header; now one column each, explained above the table."""
    common = ["--n", "32", "--num-samples", "4,8", "--reps", "2", "--output-reps", "1"]
    common += ["--max-tokens", "16", "--no-plots", "--quiet", "--sigma", "4"]
    assert main(["reproduce", *common, "--out", str(tmp_path / "a")]) == 0
    lines = capsys.readouterr().out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("Sampler stratified"))
    assert [lines[top + k].split("=")[0].strip() for k in (1, 2, 3)] == [
        "error",
        "exact",
        "window",
    ]
    assert lines[top + 4].split() == [
        "s",
        "group",
        "size",
        "s'",
        "sigma=4:",
        "error",
        "exact",
        "window",
    ]
