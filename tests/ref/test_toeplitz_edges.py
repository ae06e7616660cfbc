"""plsh_ref.toeplitz against the matrix ``L*_ij = rho^|i - j|`` itself (``rho = e^(-1/sigma)``):
symbol, secular equation, spectrum, eigenvectors, inverse and determinant, each checked
on the matrix (numpy at small ``n``, mpmath at 30 digits), and the refusals at their edges.
"""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest

from plsh_ref import toeplitz as T
from plsh_ref.partition import PartitionSample


@pytest.fixture(autouse=True)
def _digits():
    """Work at 30 digits without changing mpmath's global precision for other tests."""
    with mp.workdps(30):
        yield


def kms(n, sigma):
    idx = np.arange(n)
    return np.exp(-np.abs(idx[:, None] - idx[None, :]) / sigma)


@pytest.mark.parametrize("sigma", [0.3, 2.0, 50.0])
def test_symbol_is_the_fourier_series(sigma):
    rho = mp.e ** (-1 / mp.mpf(sigma))
    for theta in (0.0, 0.4, 2.0, math.pi):
        want = (1 - rho**2) / (1 - 2 * rho * mp.cos(theta) + rho**2)
        # (1 - rho)^2 + 4 rho sin^2: a few ulps of 1 / (1 - rho)^2 at large sigma
        assert abs(T.kms_symbol(theta, sigma) / want - 1) < 1e-12
    lo, hi = T.kms_symbol_bounds(sigma)
    assert abs(lo / ((1 - rho) / (1 + rho)) - 1) < 1e-14 and abs(hi * lo - 1) < 1e-15
    assert abs(T.kms_symbol(math.pi, sigma) / lo - 1) < 1e-12
    assert abs(T.kms_symbol(0.0, sigma) / hi - 1) < 1e-12
    assert T.kms_spectral_norm_limit(sigma) == hi
    out = T.kms_symbol(np.array([0.0, 1.0]), sigma)
    assert out.shape == (2,)
    assert type(T.kms_symbol(1.0, sigma)) is float


@pytest.mark.parametrize("n, sigma", [(1, 1.0), (2, 0.5), (5, 3.0), (12, 40.0)])
def test_spectrum_is_the_matrix_spectrum(n, sigma):
    want = np.sort(np.linalg.eigvalsh(kms(n, sigma)))[::-1]
    got = T.kms_eigenvalues(n, sigma)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    angles = T.kms_angles(n, sigma)
    k = np.arange(1, n + 1)
    assert np.all(((k - 1) * np.pi / n <= angles) & (angles <= k * np.pi / (n + 1)))
    sec = T.kms_secular(angles, n, sigma)
    assert np.all(np.abs(sec) < 1e-12)
    values, vectors = T.kms_eigenvectors(n, sigma)
    np.testing.assert_allclose(values, got, rtol=1e-15)
    np.testing.assert_allclose(kms(n, sigma) @ vectors, vectors * values, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=0), 1.0, rtol=1e-14)


def test_secular_polynomial_exact():
    n, sigma, theta = 4, 2.0, 0.7
    rho = math.exp(-0.5)
    want = math.sin(5 * theta) - 2 * rho * math.sin(4 * theta) + rho**2 * math.sin(3 * theta)
    assert T.kms_secular(theta, n, sigma) == want
    assert T.kms_secular(np.array([theta]), n, sigma).shape == (1,)


def test_spectrum_mp():
    n, sigma = 4, 1.5
    matrix = mp.matrix(
        [[mp.e ** (-abs(i - j) / mp.mpf(sigma)) for j in range(n)] for i in range(n)]
    )
    want = sorted(mp.eigsy(matrix)[0], reverse=True)
    got = T.kms_eigenvalues_mp(n, sigma, dps=30)
    assert all(abs(g / w - 1) < mp.mpf(10) ** -28 for g, w in zip(got, want))
    got_mpf = T.kms_eigenvalues_mp(n, mp.mpf(sigma), dps=30)
    assert all(abs(g / w - 1) < mp.mpf(10) ** -28 for g, w in zip(got_mpf, want))
    angles = T.kms_angles_mp(n, sigma, dps=30)
    assert len(angles) == n and all(0 < a < mp.pi for a in angles)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0, got "):
        T.kms_angles_mp(3, mp.mpf(-1))
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        T.kms_angles_mp(3, 0.0)
    with pytest.raises(ValueError, match=r"^dps: must be >= 15"):
        T.kms_angles_mp(3, 1.0, dps=10)
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        T.kms_angles_mp(0, 1.0)


@pytest.mark.parametrize("n, sigma", [(1, 2.0), (2, 2.0), (6, 0.7), (9, 30.0)])
def test_inverse_and_determinant(n, sigma):
    inv = T.kms_inverse(n, sigma)
    np.testing.assert_allclose(kms(n, sigma) @ inv, np.eye(n), atol=1e-11)
    sign, logdet = np.linalg.slogdet(kms(n, sigma))
    assert sign == 1.0
    assert abs(T.kms_log_determinant(n, sigma) - logdet) <= 1e-12 * max(1.0, abs(logdet))
    assert T.kms_determinant(n, sigma) == math.exp(T.kms_log_determinant(n, sigma))
    want = (n - 1) * mp.log(1 - mp.e ** (-2 / mp.mpf(sigma)))
    assert abs(T.kms_log_determinant(n, sigma) - float(want)) <= 1e-14 * max(1.0, abs(float(want)))


def test_inverse_entries():
    rho = math.exp(-1.0)
    d = 1 - rho**2
    inv = T.kms_inverse(3, 1.0)
    want = np.array([[1, -rho, 0], [-rho, 1 + rho**2, -rho], [0, -rho, 1]]) / d
    np.testing.assert_allclose(inv, want, rtol=1e-15)
    assert T.kms_inverse(1, 5.0).tolist() == [[1.0]]


def test_refusals():
    for fn in (T.kms_angles, T.kms_eigenvalues, T.kms_inverse, T.kms_log_determinant):
        with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
            fn(0, 1.0)
        with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
            fn(2, 0.0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        T.kms_symbol(0.0, -1.0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        T.kms_symbol_bounds(0.0)
    with pytest.raises(ValueError, match=r"^theta: contains NaN"):
        T.kms_symbol(np.nan, 1.0)


def test_mask_spectrum():
    part = PartitionSample(np.array([[2.0, 3.0], [10.0, 1.0]]), np.array([[0.5, 0.0], [0.0, 0.0]]))
    pos = [0, 1, 2, 3, 4]
    # blocks of head 0, sample 0: {0}, {1, 2}, {3, 4}: eigenvalues 2, 2, 1, 0, 0
    assert T.mask_spectrum(part, pos).tolist() == [2.0, 2.0, 1.0, 0.0, 0.0]
    assert T.mask_spectrum(part, pos, 0, 1).tolist() == [3.0, 2.0, 0.0, 0.0, 0.0]
    assert T.mask_spectrum(part, pos, head=1).tolist() == [5.0, 0.0, 0.0, 0.0, 0.0]
    assert T.mask_spectrum(part, pos, 1, 1).tolist() == [1.0] * 5
    with pytest.raises(ValueError, match=r"^head: must be < num_heads=2, got 2$"):
        T.mask_spectrum(part, pos, 2)
    with pytest.raises(ValueError, match=r"^sample: must be < num_samples=2, got 2$"):
        T.mask_spectrum(part, pos, 0, 2)
    with pytest.raises(ValueError, match=r"^head: must be >= 0"):
        T.mask_spectrum(part, pos, -1)
    with pytest.raises(ValueError, match=r"^sample: must be >= 0"):
        T.mask_spectrum(part, pos, 0, -1)
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample, got NoneType$"):
        T.mask_spectrum(None, pos)


def test_secular_returns_a_float_for_a_scalar_angle():
    assert type(T.kms_secular(0.7, 4, 2.0)) is float
    assert type(T.kms_secular(np.float64(0.7), 4, 2.0)) is float


def test_mp_spectrum_default_precision_is_50_digits():
    # the result is rounded to ``dps`` digits: the default is the dps = 50 result, bit for bit
    assert T.kms_angles_mp(3, 1.0) == T.kms_angles_mp(3, 1.0, dps=50)
    assert T.kms_angles_mp(3, 1.0) != T.kms_angles_mp(3, 1.0, dps=51)
    assert T.kms_eigenvalues_mp(3, 1.0) == T.kms_eigenvalues_mp(3, 1.0, dps=50)
    assert T.kms_eigenvalues_mp(3, 1.0) != T.kms_eigenvalues_mp(3, 1.0, dps=51)


def test_mp_spectrum_takes_an_mpf_sigma_at_full_precision():
    # mpf("1.1") is not a binary64 value: rounding it to a float moves the spectrum by ~1e-17
    n, sigma = 3, mp.mpf("1.1")
    matrix = mp.matrix([[mp.e ** (-abs(i - j) / sigma) for j in range(n)] for i in range(n)])
    want = sorted(mp.eigsy(matrix)[0], reverse=True)
    got = T.kms_eigenvalues_mp(n, sigma, dps=30)
    assert all(abs(g / w - 1) < mp.mpf(10) ** -28 for g, w in zip(got, want))


def test_mp_angles_refuse_a_zero_mpf_sigma():
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0, got 0"):
        T.kms_angles_mp(3, mp.mpf(0))


@pytest.mark.parametrize(
    "n, sigma, dps",
    [(8, 1e12, 15), (2, 1e8, 15), (8, 1e40, 50), (3, 1e40, 15), (4, 1e100, 20), (2, 1e300, 15)],
)
def test_mp_spectrum_for_a_huge_sigma_is_the_matrix_spectrum(n, sigma, dps):
    # theta_1 ~ sqrt(2 / (n sigma)) lies below the first bracket's start pi/(n+1) 2^-dps and
    # far below 1 (findroot's stopping rules are absolute); the roots k >= 2 lie within
    # ~1/sigma of (k-1) pi/n; the eigenvalues ~ 1/sigma but the largest: 1 - rho^2 cancels
    sig = mp.mpf(sigma)
    with mp.workdps(dps + 20 + int(math.log10(sigma))):
        matrix = mp.matrix([[mp.exp(-abs(i - j) / sig) for j in range(n)] for i in range(n)])
        want = sorted(mp.eigsy(matrix)[0], reverse=True)
    got = T.kms_eigenvalues_mp(n, sigma, dps=dps)
    assert all(abs(g / w - 1) < mp.mpf(10) ** (2 - dps) for g, w in zip(got, want)), (got, want)
    theta_1 = T.kms_angles_mp(n, sigma, dps=dps)[0]
    assert abs(theta_1 / mp.sqrt(2 / (n * sig)) - 1) < 1 / sig**0.5 + mp.mpf(10) ** (2 - dps)


def test_mask_spectrum_names_the_type_it_refuses():
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample, got str$"):
        T.mask_spectrum("blocks", [0, 1])


def test_angles_raise_no_floating_point_warning():
    # the first bracket starts at theta = 0, where g / sin is 0 / 0 (replaced by its limit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="warn"):
            T.kms_angles(3, 1.0)


@pytest.mark.parametrize("n, sigma", [(1, 0.5), (2, 1.0), (7, 3.0), (40, 0.2)])
def test_reduced_secular_is_continuous_at_zero(n, sigma):
    # g / sin at theta = 0 is replaced by its limit (1 - rho)(2n - (1 + rho)(n - 1))
    rho = math.exp(-1.0 / sigma)
    at_zero, near_zero = T._reduced_secular_np(np.array([0.0, 1e-7]), n, sigma)
    assert abs(at_zero / ((1 - rho) * (2 * n - (1 + rho) * (n - 1))) - 1) < 1e-14
    assert abs(near_zero / at_zero - 1) < 1e-9
