"""torch.compile of PLSH attention: custom operators plsh::attention & co.

Compiled and eager results agree on the same partition (forward and backward),
``fullgraph=True`` raises no graph break, one compiled graph serves three sequence lengths
(frames counted by a custom backend), padded batches and bad input behave as in eager.
The tests compile with AOTAutograd's eager backend: the operators' registration, fake
implementations and autograd are what is tested, and an Inductor compile costs about
20 s on the 2-core CPU. Inductor itself is exercised by ``benchmarks/compile_bench.py``
(which checks the compiled loss against eager).
"""

import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.backends.debugging import aot_eager  # noqa: E402

import plsh_fast._ops as ops  # noqa: E402
from plsh_fast import plsh_attention  # noqa: E402
from plsh_fast.nn import PLSHAttention, PLSHSelfAttention  # noqa: E402

LENGTHS = (16, 23, 40)


class Counting:
    """A torch.compile backend that counts the graphs it is given (one per compile)."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return aot_eager(gm, example_inputs)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _grads(fn, x):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return y.detach(), x.grad


def _stack():
    """One model with every kind of core, so that one compile covers them all: fast
    (resampled every forward), fast on the CPU backend with a fixed partition, dense
    (resampled), exact ALiBi."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        PLSHSelfAttention(32, 4, num_samples=4),
        PLSHSelfAttention(32, 4, num_samples=3, backend="cpu", resample="fixed"),
        PLSHSelfAttention(32, 4, num_samples=4, backend="dense"),
        PLSHSelfAttention(32, 4, method="exact"),
    )


def test_model_compiles_fullgraph_once_for_three_lengths_and_matches_eager():
    model = _stack().train()
    resampled = [
        m.attention
        for m in model
        if m.attention.resample == "every_forward" and not m.attention.exact
    ]
    backend = Counting()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    for n in LENGTHS:
        x = torch.randn(2, n, 32)
        draws = [core.num_draws for core in resampled]
        y, gx = _grads(compiled, x)
        for core, d in zip(resampled, draws):
            assert core.num_draws == d + 1  # the compiled forward drew one partition
            core.num_draws = d  # eager replays the same draw
        y_eager, gx_eager = _grads(model, x)
        torch.testing.assert_close(y, y_eager, rtol=0, atol=0)
        torch.testing.assert_close(gx, gx_eager, rtol=0, atol=0)
    assert backend.graphs == 1
    # negative control: the next draw (another partition) changes the output, so the
    # equalities above could fail
    y_next, _ = _grads(model, x)
    assert not torch.equal(y_next, y_eager)


def test_bare_plsh_attention_with_lse_gradient_compiles():
    core = PLSHAttention(4, 6, seed=2)

    def fn(q, k, v, pitch, offset):
        return plsh_attention(q, k, v, partition=(pitch, offset), return_lse=True)

    backend = Counting()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=backend)
    for n in LENGTHS:
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, 4, n, 8, generator=g) for _ in range(3))
        results = []
        for f in (compiled, fn):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out, lse = f(*leaves, core.pitch, core.offset)
            (out * out.detach() + lse[..., None]).sum().backward()  # gradient into the LSE too
            results.append([out.detach(), lse.detach(), *(t.grad for t in leaves)])
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert backend.graphs == 1


def test_padded_batch_compiles_and_matches_eager():
    layer = PLSHSelfAttention(16, 4, num_samples=4, seed=3).eval()
    mask = torch.ones(3, 12, dtype=torch.int64)
    mask[1, :5] = 0
    mask[2, :11] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    compiled = torch.compile(layer, fullgraph=True, backend=Counting())
    x = torch.randn(3, 12, 16)
    y, gx = _grads(lambda t: compiled(t, query_positions=positions, attention_mask=mask), x)
    y_eager, gx_eager = _grads(
        lambda t: layer(t, query_positions=positions, attention_mask=mask), x
    )
    torch.testing.assert_close(y, y_eager, rtol=0, atol=0)
    torch.testing.assert_close(gx, gx_eager, rtol=0, atol=0)


@pytest.mark.parametrize(
    "name,error,kwargs",
    [
        ("query_positions", ValueError, dict(query_positions=torch.arange(7))),
        ("key_positions", TypeError, dict(key_positions=torch.arange(12.0))),
        ("attention_mask", TypeError, dict(attention_mask=torch.ones(2, 12))),
        ("attention_mask", ValueError, dict(attention_mask=torch.ones(3, 12, dtype=torch.bool))),
        ("attention_mask", ValueError, dict(attention_mask=torch.full((2, 12), 2))),
    ],
)
def test_bad_input_under_compile_names_the_argument(name, error, kwargs):
    core = PLSHAttention(4, 4, seed=0)

    def fn(q):
        return plsh_attention(q, q, q, partition=(core.pitch, core.offset), **kwargs)

    q = torch.randn(2, 4, 12, 8)
    compiled = torch.compile(fn, backend=Counting())
    with pytest.raises(error, match=f"^{name}:"):
        compiled(q)


def test_bad_input_under_fullgraph_quotes_the_argument():
    """With fullgraph=True Dynamo reports an exception raised while tracing as
    torch._dynamo.exc.Unsupported ("Observed exception") quoting our message; errors
    raised at run time inside the operator (mask values) propagate as they are."""
    core = PLSHAttention(4, 4, seed=0)
    q = torch.randn(2, 4, 12, 8)
    for kwargs, error, name in (
        (dict(query_positions=torch.arange(7)), torch._dynamo.exc.Unsupported, "query_positions"),
        (dict(attention_mask=torch.full((2, 12), 2)), ValueError, "attention_mask"),
    ):
        torch._dynamo.reset()
        strict = torch.compile(
            lambda q, kwargs=kwargs: plsh_attention(
                q, q, q, partition=(core.pitch, core.offset), **kwargs
            ),
            fullgraph=True,
            backend=Counting(),
        )
        with pytest.raises(error, match=f"{name}: "):
            strict(q)


def test_custom_operator_registration_passes_opcheck():
    """torch.library.opcheck: schema, fake implementation, autograd registration."""
    core = PLSHAttention(2, 3, seed=1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 9, 4, generator=g, requires_grad=True)
    k = torch.randn(2, 1, 9, 4, generator=g, requires_grad=True)
    v = torch.randn(2, 1, 9, 5, generator=g, requires_grad=True)
    pos = torch.arange(9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :3] = False
    for attention_mask in (None, mask):
        args = (q, k, v, core.pitch, core.offset, pos, pos, attention_mask, 0.5, True, "cpu")
        torch.library.opcheck(torch.ops.plsh.attention.default, args)


def test_custom_operator_equals_the_eager_function():
    core = PLSHAttention(4, 5, seed=6)
    q = torch.randn(2, 4, 30, 8, dtype=torch.float64)
    via_op = ops.attention(q, q, q, core.pitch, core.offset, torch.arange(30), torch.arange(30),
                           None, 0.3, True, "cpu")  # fmt: skip
    via_api = plsh_attention(q, q, q, partition=core.partition, scale=0.3, return_lse=True)
    for a, b in zip(via_op, via_api):
        assert torch.equal(a, b)


def test_tensor_partitions_are_checked_in_eager_mode():
    """A (pitch, offset) tensor pair: shapes and dtypes always, values in eager mode."""
    core = PLSHAttention(4, 4, seed=0)
    q = torch.randn(1, 4, 10, 8)
    cases = [
        (TypeError, (core.pitch.float(), core.offset)),
        (ValueError, (core.pitch[:2], core.offset[:2])),
        (ValueError, (-core.pitch, core.offset)),
        (ValueError, (core.pitch, core.offset * float("nan"))),
        (ValueError, (core.pitch * 1e-300, core.offset)),  # bins leave int64
    ]
    for error, partition in cases:
        with pytest.raises(error, match="^partition:"):
            plsh_attention(q, q, q, partition=partition)
    plsh_attention(q, q, q, partition=(-core.pitch, core.offset), check_finite=False)  # opted out


def test_compiled_backward_reuses_the_forward_plan(monkeypatch):
    """The CPU plan travels from the forward operator to the backward one as a tensor."""
    import plsh_fast.cpu as cpu

    planned = []
    real = cpu._planning.Plan.head_specs

    def counting(self, h):
        planned.append(h)
        return real(self, h)

    monkeypatch.setattr(cpu._planning.Plan, "head_specs", counting)
    layer = PLSHSelfAttention(16, 4, num_samples=4, seed=5, resample="fixed")
    compiled = torch.compile(layer, fullgraph=True, backend=Counting())
    x = torch.randn(2, 24, 16)
    y, gx = _grads(compiled, x)
    assert sorted(planned) == [0, 1, 2, 3]  # each head planned once, by the forward
    planned.clear()
    cpu.clear_plan_cache()  # else the eager call reuses the plan the compiled one kept
    y_eager, gx_eager = _grads(layer, x)
    assert sorted(planned) == [0, 1, 2, 3]  # the same in eager mode
    torch.testing.assert_close(gx, gx_eager, rtol=0, atol=0)
    # negative control: a backward without the plans (and none kept) plans again
    planned.clear()
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 0)
    plan = cpu.plan_cpu(layer.attention.pitch, layer.attention.offset, torch.arange(24),
                        torch.arange(24), True, torch.float32)  # fmt: skip
    cpu._planning.chunk_specs(plan, 1)
    assert sorted(planned) == [0, 1, 2, 3]


def test_compiled_backward_uses_the_forwards_tiles_when_the_band_setting_changes(
    monkeypatch,
):
    """The compiled backward reuses the forward's plan (its tile heights and band flags):
    after ``BAND_MAX_TILE`` changed between the forward and its backward, mixing new tiles
    with the forward's work items used to fail with ``IndexError`` (found by review)."""
    import plsh_fast.cpu as cpu

    layer = PLSHSelfAttention(16, 2, num_samples=4, seed=3, resample="fixed")
    x = torch.randn(1, 40, 16)
    _, eager = _grads(layer, x)
    compiled = torch.compile(layer, fullgraph=True, backend=Counting())
    x2 = x.detach().clone().requires_grad_()
    y = compiled(x2)
    cpu.clear_plan_cache()
    monkeypatch.setattr(cpu, "BAND_MAX_TILE", 0)  # between the forward and its backward
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    torch.testing.assert_close(x2.grad, eager, rtol=1e-5, atol=1e-6)
