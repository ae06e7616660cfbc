"""The public torch API :func:`plsh_fast.plsh_attention`: defaults, partition handling,
dtypes and layouts, and bad input (a ValueError/TypeError naming the argument, raised
before any kernel runs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plsh_fast._autograd as fast_autograd
from plsh_fast import plsh_attention
from plsh_ref.alibi import alibi_slopes
from plsh_ref.partition import draw_partition

torch.set_num_threads(1)


def qkv(batch=1, heads=4, kv_heads=4, n_q=33, n_k=33, d=8, dv=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, heads, n_q, d, generator=g).to(dtype),
        torch.randn(batch, kv_heads, n_k, d, generator=g).to(dtype),
        torch.randn(batch, kv_heads, n_k, dv, generator=g).to(dtype),
    )


def test_seeded_draw_equals_explicit_partition_with_default_slopes():
    q, k, v = qkv()
    partition = draw_partition(1.0 / alibi_slopes(4), 5, seed=42)
    drawn = plsh_attention(q, k, v, num_samples=5, seed=42)
    given = plsh_attention(q, k, v, partition=partition)
    assert torch.equal(drawn, given)
    slopes = torch.tensor([0.5, 0.25, 0.1, 0.01], dtype=torch.float64)
    custom = plsh_attention(q, k, v, num_samples=5, seed=42, slopes=slopes)
    partition = draw_partition(1.0 / slopes.numpy(), 5, seed=42)
    assert torch.equal(custom, plsh_attention(q, k, v, partition=partition))


def test_default_num_samples_is_16():
    q, k, v = qkv()
    partition = draw_partition(1.0 / alibi_slopes(4), 16, seed=1)
    assert torch.equal(
        plsh_attention(q, k, v, seed=1), plsh_attention(q, k, v, partition=partition)
    )


def test_default_positions_are_end_aligned():
    q, k, v = qkv(n_q=10, n_k=30)
    partition = draw_partition(1.0 / alibi_slopes(4), 4, seed=0)
    implicit = plsh_attention(q, k, v, partition=partition)
    explicit = plsh_attention(
        q,
        k,
        v,
        partition=partition,
        query_positions=torch.arange(20, 30),
        key_positions=np.arange(30),
    )
    assert torch.equal(implicit, explicit)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_output_dtype_shape_and_lse(dtype):
    q, k, v = qkv(batch=2, heads=4, kv_heads=2, n_q=9, n_k=17, d=5, dv=3, dtype=dtype)
    out, lse = plsh_attention(q, k, v, seed=0, num_samples=3, return_lse=True)
    assert out.dtype == dtype and out.shape == (2, 4, 9, 3)
    assert lse.shape == (2, 4, 9)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


def test_strided_inputs_give_the_same_result():
    q, k, v = qkv(n_q=40, n_k=40)
    views = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    assert not views[0].is_contiguous()
    a = plsh_attention(q, k, v, seed=3, num_samples=4)
    b = plsh_attention(*views, seed=3, num_samples=4)
    assert torch.equal(a, b)


def test_check_finite_is_default_and_can_be_disabled():
    """NaN input used to pass silently by default; now refused unless check_finite=False."""
    q, k, v = qkv()
    q[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="^query: contains NaN"):
        plsh_attention(q, k, v, seed=0)
    k2 = k.clone()
    k2[0, 0, 1, 0] = float("inf")
    with pytest.raises(ValueError, match="^key"):
        plsh_attention(q.nan_to_num(), k2, v, seed=0)
    out = plsh_attention(q, k, v, seed=0, check_finite=False)  # NaN stays in rows that see it
    assert torch.isnan(out[0, 0, 0]).all()


@pytest.fixture
def no_kernel(monkeypatch):
    """Fail if any kernel is looked up: errors must come before a launch."""

    def forbidden(backend):
        raise AssertionError(f"kernel {backend!r} reached with bad input")

    monkeypatch.setattr(fast_autograd, "kernels", forbidden)


def _meta(x):
    return torch.empty(x.shape, dtype=x.dtype, device="meta")


BAD_INPUTS = [
    ("key", ValueError, lambda q, k, v: ((q, _meta(k), v), {})),
    ("value", TypeError, lambda q, k, v: ((q, k, v.double()), {})),
    ("query", TypeError, lambda q, k, v: ((q.numpy(), k, v), {})),
    ("query", ValueError, lambda q, k, v: ((q[0], k, v), {})),
    ("key", ValueError, lambda q, k, v: ((q, k[:, :3], v[:, :3]), {})),
    ("key", ValueError, lambda q, k, v: ((q, k[..., :4], v), {})),
    ("value", ValueError, lambda q, k, v: ((q, k, v[:, :, :5]), {})),
    ("key", ValueError, lambda q, k, v: ((q, torch.cat([k, k]), torch.cat([v, v])), {})),
    ("query", TypeError, lambda q, k, v: ((q.int(), k.int(), v.int()), {})),
    (
        "query",
        TypeError,
        lambda q, k, v: ((_meta(q).double(), _meta(k).double(), _meta(v).double()), {}),
    ),
    ("num_samples", ValueError, lambda q, k, v: ((q, k, v), {"num_samples": 0})),
    ("num_samples", TypeError, lambda q, k, v: ((q, k, v), {"num_samples": 2.0})),
    ("slopes", ValueError, lambda q, k, v: ((q, k, v), {"slopes": [0.5, 0.25]})),
    ("slopes", ValueError, lambda q, k, v: ((q, k, v), {"slopes": [0.5, 0.25, 0.0, 0.1]})),
    ("slopes", ValueError, lambda q, k, v: ((q, k, v), {"slopes": [0.5, -1, 0.2, 0.1]})),
    (
        "partition",
        ValueError,
        lambda q, k, v: ((q, k, v), {"partition": draw_partition(np.ones(2), 4, seed=0)}),
    ),
    ("partition", TypeError, lambda q, k, v: ((q, k, v), {"partition": (1, 2)})),
    (
        "seed",
        ValueError,
        lambda q, k, v: (
            (q, k, v),
            {"partition": draw_partition(np.ones(4), 4, seed=0), "seed": 1},
        ),
    ),
    (
        "num_samples",
        ValueError,
        lambda q, k, v: (
            (q, k, v),
            {"partition": draw_partition(np.ones(4), 4, seed=0), "num_samples": 8},
        ),
    ),
    (
        "slopes",
        ValueError,
        lambda q, k, v: (
            (q, k, v),
            {"partition": draw_partition(np.ones(4), 4, seed=0), "slopes": [0.5, -1, 0.2, 0.1]},
        ),
    ),
    ("seed", ValueError, lambda q, k, v: ((q, k, v), {"seed": -1})),
    ("scale", ValueError, lambda q, k, v: ((q, k, v), {"scale": 0.0})),
    ("query_positions", ValueError, lambda q, k, v: ((q, k, v), {"query_positions": np.arange(3)})),
    (
        "key_positions",
        TypeError,
        lambda q, k, v: ((q, k, v), {"key_positions": np.arange(33) + 0.5}),
    ),
    (
        "key_positions",
        ValueError,
        lambda q, k, v: ((q, k, v), {"key_positions": np.full(33, 2.0**60)}),
    ),
    ("backend", ValueError, lambda q, k, v: ((q, k, v), {"backend": "cuda"})),
]


@pytest.mark.parametrize(
    "name,error,make", BAD_INPUTS, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD_INPUTS)]
)
def test_bad_input_names_the_argument(no_kernel, name, error, make):
    args, kwargs = make(*qkv())
    kwargs = {"seed": 0, **kwargs} if "partition" not in kwargs else kwargs
    with pytest.raises(error, match=f"^{name}:"):
        plsh_attention(*args, **kwargs)


def test_slopes_too_large_for_the_positions_are_named():
    """``slopes=1e30`` draws pitches of about ``1e-30``, whose bins leave the int64 range:
    the error named ``partition``, which the caller never passed; a given partition is
    still named ``partition`` (negative control)."""
    q = k = v = torch.zeros(1, 4, 8, 8)
    with pytest.raises(ValueError, match=r"^slopes: the partition drawn from them has a bin"):
        plsh_attention(q, k, v, slopes=torch.full((4,), 1e30), num_samples=2, seed=0)
    partition = draw_partition(1 / np.full(4, 1e30), 2, 0)
    with pytest.raises(ValueError, match=r"^partition: bin index"):
        plsh_attention(q, k, v, partition=partition)


def test_logits_overflowing_the_working_dtype(monkeypatch):
    """The documented behaviour (``check_finite`` in ``plsh_attention``) at finite float32
    inputs whose logits overflow: query row 10 is ``1e20`` and every key ``-1e20 |k|``, so
    the row's logits are all ``-inf``. Its output is 0 on the dense and CPU paths; its LSE
    ``-inf`` on the dense path and 0 on the CPU path (torch's fused CPU operator). The
    gradients of such inputs overflow: NaN in the query's and key's gradients on both
    paths, and on the CPU path in every key's and value's gradient of the head."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 8, generator=gen) for _ in range(3))
    q[0, 0, 10] = 1e20
    k = k.abs() * -1e20
    from plsh_fast import dense

    monkeypatch.setitem(dense.DENSE_CROSSOVER, "cpu", 64)  # "auto" is dense at n = 64
    lse_of_row = {}
    for backend in ("auto", "cpu"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = plsh_attention(*leaves, num_samples=4, seed=0, return_lse=True, backend=backend)
        assert torch.all(out[0, 0, 10] == 0) and torch.isfinite(out).all()
        others = torch.cat([lse[0, 0, :10], lse[0, 0, 11:]])
        assert torch.isfinite(others).all()
        lse_of_row[backend] = lse[0, 0, 10].item()
        out.sum().backward()
        nan = [bool(torch.isnan(t.grad).any()) for t in leaves]
        assert nan[0] and nan[1]
        if backend == "cpu":
            assert torch.isnan(leaves[1].grad).all() and torch.isnan(leaves[2].grad).all()
    assert lse_of_row == {"auto": -np.inf, "cpu": 0.0}


def test_triton_backend_on_cpu_needs_the_interpreter(no_kernel, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="^backend:"):
        plsh_attention(*qkv(), seed=0, backend="triton")


def test_triton_backend_refuses_more_samples_than_float16_weights_hold(no_kernel, monkeypatch):
    # num_samples = 40000 reached a bare `assert` in the Triton launch code
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # backend="triton" on CPU tensors passes
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="^num_samples: at most 32768 on the Triton path"):
        plsh_attention(q, q, q, num_samples=32769, seed=0, backend="triton")
    partition = draw_partition(np.array([2.0]), 32769, seed=0)
    with pytest.raises(ValueError, match="^num_samples: at most 32768"):
        plsh_attention(q, q, q, partition=partition, backend="triton")


def test_cpu_backend_takes_more_than_32768_samples():
    q = torch.randn(1, 1, 2, 4, dtype=torch.float64)
    out = plsh_attention(q, q, q, num_samples=32769, seed=0, backend="cpu")
    assert out.shape == q.shape and bool(torch.isfinite(out).all())


def test_cpu_backend_refuses_other_devices(no_kernel):
    q, k, v = (_meta(x) for x in qkv())
    with pytest.raises(ValueError, match="^backend:"):
        plsh_attention(q, k, v, seed=0, backend="cpu")


def test_partition_is_a_function_of_absolute_positions():
    """A partition drawn once serves any length: a prefix gives the same rows."""
    q, k, v = qkv(n_q=64, n_k=64)
    partition = draw_partition(1.0 / alibi_slopes(4), 8, seed=5)
    full = plsh_attention(q, k, v, partition=partition)
    prefix = plsh_attention(
        q[:, :, :40],
        k[:, :, :40],
        v[:, :, :40],
        partition=partition,
        query_positions=np.arange(40),
        key_positions=np.arange(40),
    )
    torch.testing.assert_close(prefix, full[:, :, :40])


@pytest.mark.triton
def test_triton_backend_through_the_api_agrees_with_the_cpu_path():
    """Dispatch of backend="triton" (interpreter on CPU), forward and backward."""
    import _triton_interp  # sets TRITON_INTERPRET=1 and reloads the kernels interpreted

    _triton_interp.load("triton")
    q, k, v = qkv(batch=1, heads=2, kv_heads=1, n_q=21, n_k=21, d=8, dv=8)
    partition = draw_partition(np.array([2.0, 9.0]), 4, seed=3)
    results = []
    for backend in ("cpu", "triton"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = plsh_attention(*leaves, partition=partition, return_lse=True, backend=backend)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        results.append((out, lse, *(x.grad for x in leaves)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["causal", "return_lse", "check_finite"])
def test_flags_must_be_bool(name):
    """`causal="no"` used to be coerced to True by bool(); now a TypeError naming it."""
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(TypeError, match=f"^{name}"):
        plsh_attention(q, q, q, seed=0, **{name: "no"})


def test_meta_tensors_are_bad_input():
    """Meta positions/slopes/inputs crashed deep inside (NotImplementedError); now ValueError."""
    q = torch.randn(1, 2, 8, 4)
    meta = torch.arange(8, device="meta")
    with pytest.raises(ValueError, match="^query_positions"):
        plsh_attention(q, q, q, seed=0, query_positions=meta)
    with pytest.raises(ValueError, match="^slopes"):
        plsh_attention(q, q, q, seed=0, slopes=torch.ones(2, device="meta"))
    qm = q.to("meta")
    with pytest.raises(ValueError, match="^query"):
        plsh_attention(qm, qm, qm, seed=0)


def test_review_bad_inputs_are_refused_naming_the_argument():
    """Regressions from the second review: a float num_samples next to a partition was
    accepted, a string one gave a confusing ValueError, a subnormal slope failed naming
    'sigma', and sparse tensors crashed inside the kernel."""
    from plsh_ref.partition import draw_partition

    q = torch.randn(1, 2, 8, 4)
    part = draw_partition(np.array([4.0, 8.0]), 3, seed=0)
    for bad in (3.0, "3"):
        with pytest.raises(TypeError, match="num_samples"):
            plsh_attention(q, q, q, partition=part, num_samples=bad)
    with pytest.raises(ValueError, match="slopes"):
        plsh_attention(q, q, q, slopes=[1e-320, 0.5], seed=0)
    with pytest.raises(TypeError, match="query: must be a dense"):
        plsh_attention(q.to_sparse(), q, q, seed=0)


def test_without_torch_the_import_says_how_to_install_it():
    """``from plsh_fast import plsh_attention`` without torch was a bare traceback from
    ``plsh_fast/api.py``; it names torch and the CPU wheel index. Run in a child whose
    ``torch`` import is blocked (``sys.modules['torch'] = None``)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    from plsh_fast import plsh_attention\n"
        "except ModuleNotFoundError as e:\n    print(e.name, '|', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    name, message = done.stdout.strip().split(" | ")
    assert name == "torch"
    assert message.startswith("plsh_fast needs torch, which is not installed")
    assert "https://download.pytorch.org/whl/cpu" in message
