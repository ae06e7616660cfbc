"""Precompute a 50-digit reference table of KMS eigenvalues with mpmath's dense solver.

Writes ``plsh_ref/data/kms_eigsy_n64.json``: for ``n = 64`` and a few ``sigma`` (binary64
values, stored exactly as ``float.hex``), the eigenvalues of ``L*_ij = exp(-|i-j|/sigma)``
computed by ``mpmath.eigsy`` (Jacobi/QL on the dense matrix) at 60 working digits and
stored as 50-digit strings. ``tests/ref/test_toeplitz.py`` checks the secular-equation solver
(``plsh_ref.toeplitz.kms_eigenvalues_mp``) against it; the dense solve takes about 15 s per
sigma, too slow for every test run (as scipy does for its mpmath references).

Usage: ``python scripts/make_kms_table.py`` (from the repository root).
"""

import json
import pathlib
import time

import mpmath

N = 64
SIGMAS = [0.5, 4.0, 64.0]
OUT = pathlib.Path(__file__).resolve().parents[1] / "plsh_ref" / "data" / "kms_eigsy_n64.json"


def eigenvalues(n: int, sigma: float) -> list[str]:
    with mpmath.workdps(60):
        rho = mpmath.exp(-1 / mpmath.mpf(sigma))
        a = mpmath.matrix(n, n)
        for i in range(n):
            for j in range(n):
                a[i, j] = rho ** abs(i - j)
        e, _ = mpmath.eigsy(a)
        vals = sorted((e[i] for i in range(n)), reverse=True)
        return [mpmath.nstr(v, 50, strip_zeros=False) for v in vals]


def main() -> None:
    table = {
        "description": "eigenvalues of the KMS matrix exp(-|i-j|/sigma), n x n, decreasing; "
        "mpmath.eigsy at 60 digits, printed to 50 significant digits",
        "generator": "scripts/make_kms_table.py",
        "mpmath": mpmath.__version__,
        "n": N,
        "entries": [],
    }
    for sigma in SIGMAS:
        t0 = time.time()
        table["entries"].append({"sigma": sigma.hex(), "eigenvalues": eigenvalues(N, sigma)})
        print(f"sigma={sigma}: {time.time() - t0:.1f} s")
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
