"""plsh_fast.nn: PLSHAttention / PLSHSelfAttention behaviour.

References are the float64 functions of plsh_ref (exact ALiBi, PLSH with the module's
partition); the module's dense backend and the fused backend must compute them.
"""

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import plsh_ref  # noqa: E402
from plsh_fast.nn import PLSHAttention, PLSHSelfAttention, biased_sdpa  # noqa: E402
from plsh_ref.partition import draw_partition  # noqa: E402


def _qkv(n=24, heads=4, heads_kv=None, d=8, batch=2, dtype=torch.float64, seed=0, n_k=None):
    g = torch.Generator().manual_seed(seed)
    heads_kv = heads_kv or heads
    n_k = n if n_k is None else n_k
    q = torch.randn(batch, heads, n, d, generator=g, dtype=dtype)
    k = torch.randn(batch, heads_kv, n_k, d, generator=g, dtype=dtype)
    v = torch.randn(batch, heads_kv, n_k, d + 1, generator=g, dtype=dtype)
    return q, k, v


def _np(*ts):
    return [t.detach().numpy() for t in ts]


# -------------------------------------------------------------------- float64 state
@pytest.mark.parametrize("convert", ["half", "bfloat16", "float", "to_float16"])
def test_float64_buffers_survive_dtype_casts(convert):
    layer = PLSHSelfAttention(32, 4, attention=PLSHAttention(4, 10, seed=3))
    core = layer.attention
    before = {k: core._buffers[k].clone() for k in ("slopes", "pitch", "offset")}
    if convert == "to_float16":
        layer.to(torch.float16)
    else:
        getattr(layer, convert)()
    assert layer.q_proj.weight.dtype != torch.float64  # the cast did happen to the weights
    for name, old in before.items():
        new = core._buffers[name]
        assert new.dtype == torch.float64, name
        assert torch.equal(new, old), name  # bit for bit: no round trip through low precision
    assert core.state_dict()["pitch"].dtype == torch.float64


def test_negative_control_plain_module_buffer_is_downcast():
    # Without the _apply override a float64 buffer is downcast by .half(): the test
    # above would catch a regression.
    m = torch.nn.Module()
    m.register_buffer("pitch", torch.ones(2, dtype=torch.float64))
    m.half()
    assert m.pitch.dtype == torch.float16


# ------------------------------------------------------------------ reference values
@pytest.mark.parametrize("heads_kv", [4, 2])
def test_eval_equals_reference_plsh_with_module_partition(heads_kv):
    core = PLSHAttention(4, 12, seed=7, backend="dense").eval()
    q, k, v = _qkv(n=40, heads_kv=heads_kv)
    out = core(q, k, v)
    ref, _ = plsh_ref.plsh_attention(
        *_np(q, k, v), partition=core.partition, causal=True, return_lse=True
    )
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    # and a different partition gives a different function (the check can fail)
    other, _ = plsh_ref.plsh_attention(
        *_np(q, k, v), partition=draw_partition(core.sigma, 12, 8), return_lse=True
    )
    assert np.max(np.abs(other - ref)) > 1e-3


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads_kv", [4, 2, 1])
def test_exact_equals_dense_alibi_reference(causal, heads_kv):
    core = PLSHAttention(4, 5, method="exact", causal=causal)
    q, k, v = _qkv(n=20, heads_kv=heads_kv, n_k=29)
    kpos = np.arange(29) + 100
    qpos = np.arange(20) + 109
    out = core(q, k, v, query_positions=qpos, key_positions=kpos)
    ref, _ = plsh_ref.alibi_attention(
        *_np(q, k, v), causal=causal, query_positions=qpos, key_positions=kpos, return_lse=True
    )
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    # negative control: PLSH with few samples is measurably different from exact ALiBi
    core.exact = False
    core.backend = "dense"
    assert (
        np.max(np.abs(core.eval()(q, k, v, query_positions=qpos, key_positions=kpos).numpy() - ref))
        > 1e-3
    )


def test_exact_in_float32_within_sdpa_rounding():
    core = PLSHAttention(4, method="exact")
    q, k, v = _qkv(n=33, dtype=torch.float32)
    out = core(q, k, v).double().numpy()
    ref, _ = plsh_ref.alibi_attention(*_np(q.double(), k.double(), v.double()), return_lse=True)
    # measured 0.6 eps relative to max|ref|; PLSH (s=16) instead of exact is ~1e6 eps off
    assert np.max(np.abs(out - ref)) <= 4 * np.finfo(np.float32).eps * np.max(np.abs(ref))


def test_longer_sequences_than_ever_seen_just_work():
    # A partition is a function of absolute positions: no length is fixed at draw time.
    core = PLSHAttention(4, 8, seed=1, backend="dense").eval()
    q, k, v = _qkv(n=300, batch=1, d=4)
    out = core(q, k, v)
    ref, _ = plsh_ref.plsh_attention(*_np(q, k, v), partition=core.partition, return_lse=True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    # causal prefix consistency: the first 100 rows do not depend on the later tokens
    short = core(q[:, :, :100], k[:, :, :100], v[:, :, :100])
    np.testing.assert_allclose(short.numpy(), out[:, :, :100].numpy(), rtol=0, atol=1e-12)
    # far positions (a chunk at 10**6) also match the reference
    pos = np.arange(50) + 10**6
    far = core(q[:, :, :50], k[:, :, :50], v[:, :, :50], query_positions=pos, key_positions=pos)
    ref_far, _ = plsh_ref.plsh_attention(
        *_np(q[:, :, :50], k[:, :, :50], v[:, :, :50]),
        partition=core.partition,
        query_positions=pos,
        key_positions=pos,
        return_lse=True,
    )
    np.testing.assert_allclose(far.numpy(), ref_far, rtol=0, atol=1e-12)


# ------------------------------------------------------------- train / eval partitions
def test_training_resamples_every_forward_and_eval_is_fixed():
    core = PLSHAttention(4, 10, seed=5, backend="dense")
    q, k, v = _qkv(n=48)
    core.train()
    a, b = core(q, k, v), core(q, k, v)
    assert core.num_draws == 2
    assert torch.max(torch.abs(a - b)) > 1e-3
    # the training stream is reproducible from the seed
    np.testing.assert_array_equal(
        core.training_partition(1).pitch, PLSHAttention(4, 10, seed=5).training_partition(1).pitch
    )
    ref_b, _ = plsh_ref.plsh_attention(
        *_np(q, k, v), partition=core.training_partition(1), return_lse=True
    )
    np.testing.assert_allclose(b.detach().numpy(), ref_b, rtol=0, atol=1e-12)
    core.eval()
    c, d = core(q, k, v), core(q, k, v)
    assert torch.equal(c, d)
    assert core.num_draws == 2  # eval does not advance the stream


def test_resample_fixed_trains_with_the_eval_partition():
    core = PLSHAttention(4, 10, seed=5, resample="fixed", backend="dense")
    q, k, v = _qkv(n=30)
    train_out = core.train()(q, k, v)
    assert torch.equal(train_out, core.eval()(q, k, v))
    assert core.num_draws == 0


def test_state_dict_round_trip_gives_identical_eval_outputs():
    src = PLSHSelfAttention(32, 4, attention=PLSHAttention(4, 10, seed=11, backend="dense"))
    src.attention.num_draws = 17
    dst = PLSHSelfAttention(32, 4, attention=PLSHAttention(4, 6, seed=99, backend="dense"))
    x = torch.randn(2, 50, 32)
    assert not torch.equal(src.eval()(x), dst.eval()(x))  # differ before loading
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # plain tensors and ints only
    assert state["attention.pitch"].dtype == torch.float64
    dst.load_state_dict(state)
    assert dst.attention.num_samples == 10  # another num_samples is adopted
    assert dst.attention.seed == 11 and dst.attention.num_draws == 17
    assert dst.attention.partition == src.attention.partition
    assert torch.equal(src(x), dst(x))
    # training continues the same partition stream after a resume
    np.testing.assert_array_equal(
        dst.attention.training_partition(17).offset, src.attention.training_partition(17).offset
    )


def test_gradients_flow_and_match_float64_gradcheck():
    core = PLSHAttention(2, 4, seed=2, resample="fixed", backend="dense")
    q, k, v = (t.requires_grad_() for t in _qkv(n=7, heads=2, d=3, batch=1))
    assert torch.autograd.gradcheck(lambda a, b, c: core(a, b, c), (q, k, v))


def test_empty_rows_give_zero_output_and_zero_gradient():
    q, k, v = (t.requires_grad_() for t in _qkv(n=4, heads=2, d=3, batch=1, n_k=5))
    core = PLSHAttention(2, 4, method="exact")
    qpos = np.array([0, 1, 2, 10])
    kpos = np.array([3, 4, 5, 6, 7])  # rows 0..2 have no admissible key (causal)
    out = core(q, k, v, query_positions=qpos, key_positions=kpos)
    assert torch.all(torch.isfinite(out))
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    out.sum().backward()
    assert torch.equal(q.grad[:, :, :3], torch.zeros_like(q.grad[:, :, :3]))
    assert torch.all(q.grad[:, :, 3] != 0)


def test_biased_sdpa_equals_reference_biased_attention():
    q, k, v = _qkv(n=9, heads=4, heads_kv=2, n_k=11)
    bias = np.random.default_rng(0).normal(size=(4, 9, 11))
    ref, _ = plsh_ref.biased_attention(*_np(q, k, v), bias=bias, return_lse=True)
    np.testing.assert_allclose(
        biased_sdpa(q, k, v, bias=torch.from_numpy(bias)).numpy(), ref, rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_layer_against_float64_reference(dtype):
    # A model cast with .to(dtype) keeps a float64 partition and computes the same function
    # as the float64 reference up to the rounding of the dtype.
    torch.manual_seed(0)
    layer = PLSHSelfAttention(
        32, 4, num_heads_kv=2, attention=PLSHAttention(4, 8, seed=1, backend="dense")
    ).eval()
    x = torch.randn(2, 40, 32)
    ref = layer.double()(x.double())
    out = layer.to(dtype)(x.to(dtype))
    assert out.dtype == dtype and layer.attention.pitch.dtype == torch.float64
    bound = 4 * torch.finfo(dtype).eps * ref.abs().max().item()
    # measured: 0.5 eps (float16) and 0.4 eps (bfloat16) relative to max|ref|
    assert (out.double() - ref).abs().max().item() <= bound
    # negative control: another partition is far outside the bound
    layer.attention.set_partition(draw_partition(layer.attention.sigma, 8, 2))
    assert (layer(x.to(dtype)).double() - ref).abs().max().item() > 2 * bound


# ------------------------------------------------------------------- fused backend
def test_fast_backend_equals_dense_backend_forward_and_backward():
    api = pytest.importorskip("plsh_fast.api")
    if not hasattr(api, "plsh_attention"):
        pytest.skip("plsh_fast.api.plsh_attention not available")
    grads = {}
    for backend in ("auto", "dense"):
        core = PLSHAttention(4, 10, seed=4, backend=backend, resample="fixed")
        q, k, v = (t.requires_grad_() for t in _qkv(n=37, heads_kv=2, dtype=torch.float64))
        out = core(q, k, v)
        (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
        grads[backend] = [out.detach(), q.grad, k.grad, v.grad]
    for a, b in zip(grads["auto"], grads["dense"]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------- bad input
def test_bad_inputs_raise_clear_errors():
    core = PLSHAttention(4, 8, backend="dense")
    q, k, v = _qkv(n=8, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"^key: dtype torch.float64 differs from query dtype"):
        core(q.requires_grad_(), k.double(), v)
    with pytest.raises(ValueError, match=r"^query: has 2 heads"):
        core(q[:, :2], k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match=r"^key: num_heads_kv=3"):
        core(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match=r"^query_positions: must have length 8"):
        core(q, k, v, query_positions=np.arange(5), key_positions=np.arange(8))
    with pytest.raises(TypeError, match=r"^value: dtype must be float16"):
        core(q, k, v.long())
    with pytest.raises(ValueError, match=r"^partition: has 3 heads"):
        core.set_partition(draw_partition(np.ones(3), 8, 0))
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample"):
        core.set_partition((np.ones((4, 2)), np.zeros((4, 2))))
    with pytest.raises(ValueError, match=r"^partition: state_dict entry pitch has shape"):
        core.load_state_dict(PLSHAttention(8, 8).state_dict())
    with pytest.raises(ValueError, match=r"^resample:"):
        PLSHAttention(4, resample="sometimes")
    with pytest.raises(ValueError, match=r"^slopes: must have shape \(4,\)"):
        PLSHAttention(4, slopes=[0.5, 0.25])
    with pytest.raises(ValueError, match=r"^slopes:"):
        PLSHAttention(2, slopes=[0.5, -0.25])
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        PLSHAttention(4, 0)
    with pytest.raises(ValueError, match=r"^embed_dim: 30 is not divisible"):
        PLSHSelfAttention(30, 4)
    with pytest.raises(ValueError, match=r"^attention: core has num_heads=2"):
        PLSHSelfAttention(32, 4, attention=PLSHAttention(2))


@pytest.mark.parametrize("name", ["causal", "check_finite"])
def test_module_flags_must_be_bool(name):
    """PLSHAttention(causal="no") was coerced by bool() to True; now a TypeError."""
    from plsh_fast.nn import PLSHAttention

    with pytest.raises(TypeError, match=f"^{name}"):
        PLSHAttention(4, 8, **{name: "no"})


def test_state_dict_with_a_resized_pitch_but_no_offset_is_refused():
    """Regression: load_state_dict(strict=False) with a pitch of another num_samples and no
    offset left the offset as uninitialised memory, used silently by forward."""
    from plsh_fast.nn import PLSHAttention

    src = PLSHAttention(4, 8, seed=3)
    state = {k: v for k, v in src.state_dict().items() if k != "offset"}
    dst = PLSHAttention(4, 16, seed=1)
    with pytest.raises(ValueError, match="offset is missing"):
        dst.load_state_dict(state, strict=False)


def test_activation_checkpointing_with_fresh_partitions_is_refused():
    """Regression: checkpoint recomputation drew the next training partition, so the
    gradients belonged to another function than the loss (silently)."""
    from torch.utils.checkpoint import checkpoint

    from plsh_fast.nn import PLSHSelfAttention

    x = torch.randn(1, 40, 16, generator=torch.Generator().manual_seed(0))
    layer = PLSHSelfAttention(16, 2, num_samples=2, seed=0)
    y = checkpoint(layer, x, use_reentrant=False)
    with pytest.raises(ValueError, match="resample"):
        y.square().sum().backward()


def test_activation_checkpointing_with_a_fixed_partition_gives_the_same_gradients():
    from torch.utils.checkpoint import checkpoint

    from plsh_fast.nn import PLSHSelfAttention

    x = torch.randn(1, 40, 16, generator=torch.Generator().manual_seed(0))
    layer = PLSHSelfAttention(16, 2, num_samples=2, seed=0, resample="fixed")
    grads = []
    for use_checkpoint in (False, True):
        layer.zero_grad()
        y = checkpoint(layer, x, use_reentrant=False) if use_checkpoint else layer(x)
        y.square().sum().backward()
        grads.append(layer.q_proj.weight.grad.clone())
    assert torch.equal(grads[0], grads[1])


def test_deprecated_names_still_work_with_a_warning():
    """backend="fast" is "auto" and bias= is projection_bias, for one release."""
    with pytest.warns(DeprecationWarning, match="backend='fast'"):
        core = PLSHAttention(4, 4, seed=0, backend="fast")
    assert core.backend == "auto"
    with pytest.warns(DeprecationWarning, match="projection_bias="):
        layer = PLSHSelfAttention(16, 4, bias=True, attention=PLSHAttention(4, 4, seed=0))
    assert layer.q_proj.bias is not None
    assert PLSHSelfAttention(16, 4, projection_bias=False).q_proj.bias is None
    with pytest.raises(TypeError, match="^projection_bias:"):
        PLSHSelfAttention(16, 4, projection_bias="yes")


def test_self_attention_refuses_non_float_x_by_name():
    # an integer x used to end in torch's "expected m1 and m2 to have the same dtype"
    # (RuntimeError), an array in a ValueError about its shape
    layer = PLSHSelfAttention(16, 4, num_samples=4, seed=0)
    x = torch.randn(2, 5, 16)
    for bad in (x.long(), x.numpy()):
        with pytest.raises(TypeError, match="^x: must be a floating-point torch.Tensor"):
            layer(bad)
    with pytest.raises(ValueError, match=r"^x: must be \(batch, seq_len, 16\)"):
        layer(x[0])
    assert layer(x).shape == x.shape
