"""Tests of plsh_ref.toeplitz: KMS spectra of L* and the spectrum of one mask."""

import json
import math
from importlib import resources

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plsh_ref import toeplitz as tp
from plsh_ref.alibi import kernel_matrix
from plsh_ref.partition import PartitionSample, draw_partition, masks

EPS = np.finfo(np.float64).eps


def _kms(n, sigma):
    pos = np.arange(n)
    return kernel_matrix(sigma, pos, pos)


def _kms_mp(n, sigma):
    rho = mpmath.exp(-1 / mpmath.mpf(sigma))
    return mpmath.matrix([[rho ** abs(i - j) for j in range(n)] for i in range(n)])


@settings(max_examples=15)
@given(n=st.integers(1, 200), sigma=st.floats(0.05, 2000.0))
def test_secular_eigenvalues_match_eigvalsh(n, sigma):
    # Backward-stable eigvalsh is within c n eps ||L*|| of the truth (Weyl); so is the
    # bisection root (tests below bound it against 50-digit values).
    lstar = _kms(n, sigma)
    dense = np.sort(np.linalg.eigvalsh(lstar))[::-1]
    mine = tp.kms_eigenvalues(n, sigma)
    assert np.all(np.diff(mine) < 0) or n == 1
    np.testing.assert_allclose(mine, dense, rtol=0, atol=32 * n * EPS * dense[0])
    lo, hi = tp.kms_symbol_bounds(sigma)
    assert np.all(mine >= lo * (1 - 4 * EPS)) and np.all(mine <= hi * (1 + 4 * EPS))


@pytest.mark.parametrize("n, sigma", [(1, 1.0), (2, 0.5), (7, 3.0), (12, 40.0), (12, 0.2)])
def test_secular_matches_mpmath_eigsy_at_50_digits(n, sigma):
    before = mpmath.mp.dps
    mine = tp.kms_eigenvalues_mp(n, sigma, dps=50)
    assert mpmath.mp.dps == before
    with mpmath.workdps(50):
        e, _ = mpmath.eigsy(_kms_mp(n, sigma))
        dense = sorted((e[i] for i in range(n)), reverse=True)
        # eigsy is backward stable at 50 digits: |error| <~ n 10^-50 ||L*||.
        tol = mpmath.mpf(10) ** -47 * dense[0]
        assert all(abs(a - b) <= tol for a, b in zip(mine, dense))


def _table():
    text = resources.files("plsh_ref.data").joinpath("kms_eigsy_n64.json").read_text()
    return json.loads(text)


def test_secular_matches_precomputed_eigsy_table_n64():
    # Table from scripts/make_kms_table.py (mpmath.eigsy at 60 digits, n = 64).
    table = _table()
    n = table["n"]
    for entry in table["entries"]:
        sigma = float.fromhex(entry["sigma"])
        mine = tp.kms_eigenvalues_mp(n, sigma, dps=50)
        with mpmath.workdps(50):
            ref = [mpmath.mpf(x) for x in entry["eigenvalues"]]
            tol = mpmath.mpf(10) ** -46 * ref[0]
            assert all(abs(a - b) <= tol for a, b in zip(mine, ref)), sigma
        ref64 = np.array([float(x) for x in entry["eigenvalues"]])
        np.testing.assert_allclose(
            tp.kms_eigenvalues(n, sigma), ref64, rtol=0, atol=32 * n * EPS * ref64[0]
        )


@pytest.mark.parametrize("n, sigma", [(1, 2.0), (5, 0.7), (33, 16.0)])
def test_angles_interlace_and_solve_secular(n, sigma):
    theta = tp.kms_angles(n, sigma)
    k = np.arange(1, n + 1)
    assert np.all((k - 1) * np.pi / n <= theta) and np.all(theta <= k * np.pi / (n + 1))
    with mpmath.workdps(40):
        th = tp.kms_angles_mp(n, sigma, dps=40)
        rho = mpmath.exp(-1 / mpmath.mpf(sigma))
        for t in th:
            g = (
                mpmath.sin((n + 1) * t)
                - 2 * rho * mpmath.sin(n * t)
                + rho**2 * mpmath.sin((n - 1) * t)
            )
            assert abs(g) < mpmath.mpf(10) ** -35
    assert np.max(np.abs(theta - np.array([float(t) for t in th]))) < 1e-13


@pytest.mark.parametrize("n, sigma", [(1, 2.0), (2, 0.3), (7, 3.0), (40, 0.05), (64, 500.0)])
def test_kms_secular_vanishes_at_the_angles_and_changes_sign_between_them(n, sigma):
    theta = tp.kms_angles(n, sigma)
    g = tp.kms_secular(theta, n, sigma)
    assert isinstance(g, np.ndarray) and g.shape == (n,)
    # |g'| <= (n + 1) + 2n + (n - 1) = 4n and theta carries a few ulps of pi; the three
    # sines are evaluated at arguments <= (n + 1) pi, each good to a few ulps of that.
    np.testing.assert_allclose(g, 0.0, rtol=0, atol=64 * n * EPS)
    # g = sin(theta) D_n(cos theta), D_n a polynomial of degree n with D_n(1) > 0: exactly
    # n roots in (0, pi), so g alternates in sign at the midpoints between the angles.
    mids = np.concatenate([[theta[0] / 2], (theta[1:] + theta[:-1]) / 2, [(theta[-1] + np.pi) / 2]])
    signs = np.sign(tp.kms_secular(mids, n, sigma))
    np.testing.assert_array_equal(signs, (-1.0) ** np.arange(n + 1))
    assert isinstance(tp.kms_secular(float(theta[0]), n, sigma), float)


@pytest.mark.parametrize("n, sigma", [(1, 1.5), (3, 0.4), (8, 2.0), (12, 30.0)])
def test_kms_secular_is_the_characteristic_determinant(n, sigma):
    # Independent of the formula for g: with lambda = f(theta) (the symbol) and the
    # tridiagonal inverse, det(L* - lambda I) = det L* (-lambda)^n (rho / (1 - rho^2))^n
    # U_n-type determinant = det L* (-lambda)^n (rho / (1 - rho^2))^n g(theta) / sin(theta)
    # (proofs_notes/kms_spectrum.md). The left side is mpmath's determinant at 50 digits.
    theta = np.linspace(0.05, np.pi - 0.05, 23)
    mine = tp.kms_secular(theta, n, sigma)
    with mpmath.workdps(50):
        lstar = _kms_mp(n, sigma)
        rho = mpmath.exp(-1 / mpmath.mpf(sigma))
        ref = []
        for t in theta:
            t = mpmath.mpf(float(t))
            lam = (1 - rho**2) / (1 - 2 * rho * mpmath.cos(t) + rho**2)
            det = mpmath.det(lstar - lam * mpmath.eye(n))
            scale = mpmath.det(lstar) * (-lam) ** n * (rho / (1 - rho**2)) ** n
            ref.append(float(mpmath.sin(t) * det / scale))
    np.testing.assert_allclose(mine, ref, rtol=0, atol=64 * n * EPS)


@pytest.mark.parametrize("n, sigma", [(1, 3.0), (9, 0.4), (50, 8.0)])
def test_eigenvectors(n, sigma):
    lam, vec = tp.kms_eigenvectors(n, sigma)
    lstar = _kms(n, sigma)
    np.testing.assert_allclose(lstar @ vec, vec * lam, atol=64 * n * EPS * lam[0])
    np.testing.assert_allclose(vec.T @ vec, np.eye(n), atol=64 * n * EPS * lam[0] / lam[-1])


@pytest.mark.parametrize("n, sigma", [(1, 3.0), (2, 0.3), (40, 5.0), (300, 50.0)])
def test_inverse_and_determinant(n, sigma):
    lstar = _kms(n, sigma)
    inv = tp.kms_inverse(n, sigma)
    cond = tp.kms_symbol_bounds(sigma)[1] / tp.kms_symbol_bounds(sigma)[0]
    np.testing.assert_allclose(inv @ lstar, np.eye(n), atol=16 * n * EPS * cond)
    sign, logdet = np.linalg.slogdet(lstar)
    assert sign == 1
    assert tp.kms_log_determinant(n, sigma) == pytest.approx(logdet, rel=1e-9, abs=1e-9)
    if n < 50:
        assert tp.kms_determinant(n, sigma) == pytest.approx(np.linalg.det(lstar), rel=1e-9)


def test_spectral_norm_increases_to_limit():
    for sigma in (0.5, 4.0, 32.0):
        norms = [tp.kms_eigenvalues(n, sigma)[0] for n in (1, 2, 8, 64, 512, 4096)]
        lim = tp.kms_spectral_norm_limit(sigma)
        assert all(a < b for a, b in zip(norms, norms[1:]))
        assert norms[-1] < lim
        assert lim == pytest.approx(1 / math.tanh(0.5 / sigma))
        assert (
            lim - norms[-1] < 20 * sigma**3 / 4096**2 + 1e-9
        )  # f(0) - f(pi/(n+1)) = O(sigma^3/n^2)


def test_symbol_is_the_fourier_series():
    sigma = 3.0
    rho = math.exp(-1 / sigma)
    theta = np.linspace(0, np.pi, 9)
    kk = np.arange(-400, 401)
    series = np.real(
        np.sum(rho ** np.abs(kk)[None, :] * np.exp(1j * kk[None, :] * theta[:, None]), axis=1)
    )
    np.testing.assert_allclose(tp.kms_symbol(theta, sigma), series, rtol=1e-12)
    lo, hi = tp.kms_symbol_bounds(sigma)
    assert tp.kms_symbol(np.pi, sigma) == pytest.approx(lo) and tp.kms_symbol(
        0.0, sigma
    ) == pytest.approx(hi)


@settings(max_examples=10)
@given(
    sigma=st.floats(0.3, 30.0),
    seed=st.integers(0, 2**32 - 1),
    pos=st.lists(st.integers(-50, 200), min_size=1, max_size=40),
)
def test_mask_spectrum_is_block_sizes(sigma, seed, pos):
    part = draw_partition([sigma], 3, seed)
    pos = np.array(pos)
    for t in range(3):
        m = masks(part, pos, pos)[0, t].astype(float)
        dense = np.sort(np.linalg.eigvalsh(m))[::-1]
        spec = tp.mask_spectrum(part, pos, 0, t)
        np.testing.assert_allclose(spec, dense, atol=1e-10 * len(pos))
        assert spec[0] == np.linalg.norm(m, 2).round()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: tp.kms_eigenvalues(0, 1.0), "n"),
        (lambda: tp.kms_eigenvalues(4, 0.0), "sigma"),
        (lambda: tp.kms_eigenvalues(4, -2.0), "sigma"),
        (lambda: tp.kms_eigenvalues_mp(4, 1.0, dps=10), "dps"),
        (lambda: tp.kms_eigenvalues_mp(0, 1.0), "n"),
        (lambda: tp.kms_inverse(0, 1.0), "n"),
        (lambda: tp.kms_symbol(0.1, -1.0), "sigma"),
        (lambda: tp.kms_secular(0.1, 0, 1.0), "n"),
        (lambda: tp.kms_secular(0.1, 3, 0.0), "sigma"),
        (lambda: tp.kms_secular(float("nan"), 3, 1.0), "theta"),
        (lambda: tp.kms_log_determinant(3, float("inf")), "sigma"),
        (lambda: tp.mask_spectrum(PartitionSample([[2.0]], [[0.5]]), [0, 1], 1, 0), "head"),
        (lambda: tp.mask_spectrum(PartitionSample([[2.0]], [[0.5]]), [0, 1], 0, 1), "sample"),
    ],
)
def test_bad_input(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


def test_mpmath_precision_restored_after_error():
    before = mpmath.mp.dps
    with pytest.raises(ValueError):
        tp.kms_eigenvalues_mp(3, -1.0, dps=30)
    tp.kms_eigenvalues_mp(3, 1.0, dps=30)
    assert mpmath.mp.dps == before


def test_plsh_spectrum_command(tmp_path, capsys):
    from plsh_ref.cli import main

    assert (
        main(
            [
                "spectrum",
                "--n",
                "24",
                "--sigma",
                "3",
                "--num-samples",
                "4",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "lambda_max (secular equation)" in text
    assert text.strip().splitlines()[-1] == f"output folder: {tmp_path / 'out'}"
    assert (tmp_path / "out" / "kms_spectrum.png").stat().st_size > 0
    assert (tmp_path / "out" / "mask_spectra.png").stat().st_size > 0
    from plsh_ref.experiments.spectrum import compute

    res = compute(24, 3.0, 4, 0)
    np.testing.assert_allclose(res["kms"], res["dense"], atol=32 * 24 * EPS * res["dense"][0])
    with pytest.raises(ValueError, match="^n"):
        compute(0, 3.0, 4, 0)


def test_plsh_spectrum_plots_are_labelled(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from plsh_ref.experiments import spectrum

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    spectrum._plot(spectrum.compute(24, 3.0, 4, 0), 24, 3.0, 4, tmp_path)
    assert len(figures) == 2
    for fig in figures:
        (ax,) = fig.axes
        assert "$" in ax.get_xlabel() and "$" in ax.get_ylabel() and "$" in ax.get_title()
        labels = [ln.get_label() for ln in ax.lines if not ln.get_label().startswith("_")]
        assert labels and all("$" in label for label in labels), labels


@pytest.mark.parametrize("sigma", [1e120, 1e200])
def test_eigenvalues_for_a_huge_sigma_match_eigvalsh(sigma):
    # theta_1 ~ sqrt(2 / sigma) lies below 2^-200: the bisection stopped at a fixed 200
    # halvings and gave lambda_max 1.7e-78 instead of n (plsh spectrum --sigma 1e200)
    n = 8
    dense = np.linalg.eigvalsh(_kms(n, sigma))
    np.testing.assert_allclose(np.sort(tp.kms_eigenvalues(n, sigma)), dense, atol=1e-12)
