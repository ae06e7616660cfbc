"""CPU emulation of the float32 Triton kernels' arithmetic with ``tl.dot(input_precision=...)``.

The Triton interpreter computes float32 dots exactly in float32, so the interpreted tests
cannot see what ``input_precision="tf32x3"`` does on a GPU. This module redoes the
kernels' float32 arithmetic in torch on CPU, tile by tile, with each ``tl.dot`` replaced
by a model of the compiled one. What is modelled is read from Triton's own lowering (the
``F32DotTC`` pass, checked in the TTGIR of ``plsh_fast.triton._forward._fwd_kernel`` compiled
for sm_90a by Triton 3.6 and 3.9, which agree):

* ``tf32x3``: ``a_hi = cvt.rna.tf32.f32(a)`` (10 mantissa bits, round to nearest, ties away
  from zero), ``a_lo = a - a_hi`` (exact in float32), the same for ``b``; three TF32 MMAs
  ``d1 = a_lo b_hi``, ``d2 = a_hi b_lo + d1``, NaNs of ``d2`` replaced by 0, ``d3 = a_hi b_hi
  + d2``, and the accumulator argument added last: ``dot(a, b, c) = d3 + c`` (one float32
  addition). ``acc * alpha + tl.dot(p, v)`` takes this form with ``c = acc * alpha`` (seen
  in the forward's TTGIR), and so, we assume, do ``dq += tl.dot(ds, k)`` and the like.
  The float32 dK/dV kernel on sm_90 (``TileConfig.dkdv_manual_x3``) writes its logits'
  and ``dP``'s tf32x3 out (``input_precision="tf32"`` dots on its own ``cvt.rna`` split,
  the operands in column quarters): the same arithmetic, each column half's three MMA
  terms over its two quarters in column order, the halves added as above.
* ``tf32`` (the negative control): one TF32 MMA on the raw float32 operands.
* A TF32 MMA reads float32 registers; how it treats the 13 low mantissa bits of an
  operand that is not a TF32 number (``a_lo``, and every operand of plain ``tf32``) is
  not documented: ``operand_rounding="rz"`` drops them (truncation), ``"rna"`` rounds them
  as ``cvt.rna`` would (``a_lo = tf32(a - a_hi)``).
* Inside an MMA the products of TF32 numbers are exact; the reduction dimension is taken in
  chunks of :data:`MMA_K` = 8 (the K of the TF32 ``wgmma``/``mma.sync`` shapes), each chunk's
  sum is formed exactly (float64) and added to the float32 accumulator with one rounding:
  to nearest (``accumulate="rn"``) or toward zero (``"rz"``, the pessimistic case).

Not emulated bit-exactly: the tensor core's internal alignment and rounding of a chunk's
sum (its exact order and width are not published), the order of the float32 row sums
(``tl.reduce``; torch's order here), and the approximate ``ex2.approx.ftz.f32`` and
``div.full.f32`` the kernels compile to: with ``approx_ulps > 0`` each ``exp2`` result and
each final division is perturbed by a seeded random relative error of up to that many
float32 ulps (we assume 2 bounds both), and the contraction of multiply-adds into FMAs
(Triton's default; it only removes roundings). Everything else (the scale product, the online
softmax's maximum and rescaling, ``P = C exp2(.)``, ``D_i = dO_i . O_i``) is float32 in the
kernels' order, tile sizes and column chunks (given by the caller:
``plsh_fast.triton.tile_config`` and ``head_dim_split``).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "MMA_K",
    "KernelArithmetic",
    "emulated_backward",
    "emulated_dot",
    "emulated_forward",
    "round_tf32",
]

#: reduction chunk of one TF32 tensor-core instruction (wgmma m64nNk8, mma.sync m16n8k8)
MMA_K = 8
LOG2E = 1.4426950408889634
_LOW = 0x1FFF  # the 13 mantissa bits a TF32 number does not have


def round_tf32(x: torch.Tensor, mode: str = "rna") -> torch.Tensor:
    """float32 ``x`` rounded to TF32 (8 exponent bits, 10 mantissa bits), as float32.

    ``mode="rna"``: to nearest, ties away from zero (PTX ``cvt.rna.tf32.f32``); ``"rz"``:
    toward zero (the low 13 bits dropped). Infinities and NaNs are returned unchanged.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"x: must be float32, got {x.dtype}")
    if mode not in ("rna", "rz"):
        raise ValueError(f"mode: must be 'rna' or 'rz', got {mode!r}")
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = bits & 0x80000000
    mag = bits & 0x7FFFFFFF
    finite = mag < 0x7F800000
    if mode == "rna":  # adding half a TF32 ulp to the magnitude rounds half away from zero
        mag = mag + 0x1000
    rounded = torch.where(finite, sign | (mag & ~_LOW), bits)
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded)
    return rounded.to(torch.int32).view(torch.float32)


def _round_f32(x64: torch.Tensor, mode: str) -> torch.Tensor:
    """float64 ``x64`` rounded to float32 to nearest (``"rn"``) or toward zero (``"rz"``)."""
    y = x64.to(torch.float32)
    if mode == "rz":
        over = y.to(torch.float64).abs() > x64.abs()
        y = torch.where(over, torch.nextafter(y, torch.zeros_like(y)), y)
    return y


def _mma(a, b, acc, accumulate: str):
    """One TF32 MMA ``acc + a @ b`` (operands already TF32 values): exact chunk sums of
    :data:`MMA_K` products, each added to the float32 accumulator with one rounding."""
    k = a.shape[-1]
    chunks = -(-k // MMA_K)
    pad = chunks * MMA_K - k
    a64 = torch.nn.functional.pad(a.to(torch.float64), (0, pad))
    b64 = torch.nn.functional.pad(b.to(torch.float64), (0, 0, 0, pad))
    # (..., chunks, M, MMA_K) @ (..., chunks, MMA_K, N): every chunk's sum in one matmul
    a64 = a64.reshape(a64.shape[:-1] + (chunks, MMA_K)).movedim(-2, -3)
    b64 = b64.reshape(b64.shape[:-2] + (chunks, MMA_K, b64.shape[-1]))
    parts = a64 @ b64
    for t in range(chunks):
        acc = _round_f32(acc.to(torch.float64) + parts[..., t, :, :], accumulate)
    return acc


class KernelArithmetic:
    """A model of the compiled kernels' float32 arithmetic (see the module docstring).

    Parameters
    ----------
    precision : {"tf32x3", "tf32", "ieee"}
        ``input_precision`` of every ``tl.dot``; ``"ieee"`` is a plain float32 matmul.
    operand_rounding : {"rz", "rna"}
        How an MMA reads a float32 operand that is not a TF32 number.
    accumulate : {"rn", "rz"}
        Rounding of each chunk sum into the float32 accumulator.
    approx_ulps : float
        Relative size, in float32 ulps, of the random error given to ``exp2`` and to the
        final division (0: correctly rounded torch results).
    seed : int
        Seed of that random error.
    """

    def __init__(
        self,
        precision: str = "tf32x3",
        operand_rounding: str = "rz",
        accumulate: str = "rn",
        approx_ulps: float = 0.0,
        seed: int = 0,
    ):
        if precision not in ("tf32x3", "tf32", "ieee"):
            raise ValueError(f"precision: must be tf32x3, tf32 or ieee, got {precision!r}")
        if operand_rounding not in ("rz", "rna") or accumulate not in ("rn", "rz"):
            raise ValueError("operand_rounding/accumulate: must be 'rz'/'rna' and 'rn'/'rz'")
        self.precision = precision
        self.operand_rounding = operand_rounding
        self.accumulate = accumulate
        self.approx_ulps = float(approx_ulps)
        self.gen = torch.Generator().manual_seed(seed)

    def dot(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None):
        """``tl.dot(a, b, c, input_precision=self.precision)`` on float32 tensors
        ``(..., M, K) x (..., K, N)`` (broadcast batch dimensions); ``c`` defaults to 0."""
        return emulated_dot(
            a, b, c, self.precision, operand_rounding=self.operand_rounding,
            accumulate=self.accumulate,
        )  # fmt: skip

    def chained_dot(self, a: torch.Tensor, b: torch.Tensor, split: tuple[int, int]):
        """A dot whose reduction dimension the kernels take in two column chunks
        ``split = (BLOCK_D, BLOCK_D1)`` (``plsh_fast.triton.head_dim_split``):
        ``tl.dot(a1, b1, tl.dot(a0, b0))``; ``BLOCK_D1 = 0``: one dot."""
        first, second = split
        if second == 0:
            return self.dot(a, b)
        c = self.dot(a[..., :first], b[..., :first, :])
        return self.dot(a[..., first:], b[..., first:, :], c)

    def _perturb(self, x: torch.Tensor) -> torch.Tensor:
        if self.approx_ulps == 0.0:
            return x
        u = torch.rand(x.shape, generator=self.gen, dtype=torch.float64) * 2.0 - 1.0
        return (x.to(torch.float64) * (1.0 + u * self.approx_ulps * 2.0**-23)).to(torch.float32)

    def exp2(self, x: torch.Tensor) -> torch.Tensor:
        """``tl.exp2`` (``ex2.approx.ftz.f32``), modelled as ``torch.exp2`` within
        ``approx_ulps`` (exact at 0: the rescaling factor of an unchanged maximum is 1)."""
        return torch.where(x == 0.0, 1.0, self._perturb(torch.exp2(x)))

    def div(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """float32 division (``div.full.f32``), modelled within ``approx_ulps``."""
        return self._perturb(x / y)


def emulated_dot(a, b, c=None, precision="tf32x3", *, operand_rounding="rz", accumulate="rn"):
    """A model of ``tl.dot(a, b, c, input_precision=precision)`` for float32 tensors.

    Parameters
    ----------
    a, b : torch.Tensor
        float32 ``(..., M, K)`` and ``(..., K, N)``.
    c : torch.Tensor, optional
        float32 accumulator ``(..., M, N)``; default 0.
    precision : {"tf32x3", "tf32", "ieee"}
    operand_rounding, accumulate : str
        See :class:`KernelArithmetic`.

    Returns
    -------
    torch.Tensor
        float32 ``(..., M, N)``.
    """
    if precision == "ieee":
        out = a @ b
        return out if c is None else c + out
    zero = torch.zeros(torch.broadcast_shapes(a.shape[:-1] + b.shape[-1:]), dtype=torch.float32)
    if precision == "tf32":
        acc = _mma(
            round_tf32(a, operand_rounding), round_tf32(b, operand_rounding), zero, accumulate
        )
        return acc if c is None else c + acc
    a_hi, b_hi = round_tf32(a, "rna"), round_tf32(b, "rna")
    a_lo = round_tf32(a - a_hi, operand_rounding)
    b_lo = round_tf32(b - b_hi, operand_rounding)
    acc = _mma(a_lo, b_hi, zero, accumulate)
    acc = _mma(a_hi, b_lo, acc, accumulate)
    acc = torch.where(torch.isnan(acc), torch.zeros_like(acc), acc)
    acc = _mma(a_hi, b_hi, acc, accumulate)
    return acc if c is None else c + acc


def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero rows appended along dim -2 up to a multiple (the kernels' masked loads)."""
    extra = -x.shape[-2] % multiple
    if extra == 0:
        return x
    return torch.cat([x, x.new_zeros(x.shape[:-2] + (extra, x.shape[-1]))], dim=-2)


def _pad_counts(counts: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    h, n_q, n_k = counts.shape
    out = counts.new_zeros((h, rows, cols))
    out[:, :n_q, :n_k] = counts
    return out


def _tiles(x: torch.Tensor, block: int) -> torch.Tensor:
    """``(batch, heads, n, d)`` -> ``(batch, heads, n_tiles, block, d)``, zero-padded."""
    x = _pad_rows(x, block)
    return x.reshape(x.shape[0], x.shape[1], x.shape[2] // block, block, x.shape[3])


def emulated_forward(
    arith: KernelArithmetic,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    counts,
    num_samples: int,
    scale: float,
    *,
    block_m: int = 64,
    block_n: int = 16,
    d_split: tuple[int, int] = (0, 0),
    return_stats: bool = False,
):
    """The float32 forward of ``plsh_fast.triton._forward._fwd_kernel`` under ``arith``.

    Parameters
    ----------
    arith : KernelArithmetic
    query, key, value : torch.Tensor
        float32 ``(batch, num_heads, n_q|n_k, head_dim|head_dim_v)``, ``num_heads_kv =
        num_heads``, positions sorted (the rows are the kernel's rows).
    counts : array_like of int
        ``(num_heads, n_q, n_k)`` collision counts with the causal mask applied
        (:func:`plsh_ref.partition.counts`): the kernel's weights ``C_ij``.
    num_samples : int
    scale : float
    block_m, block_n : int
        Tile sizes (defaults: the float32 tiles on sm_90 at ``head_dim <= 128``,
        ``plsh_fast.triton.tile_config``).
    d_split : tuple of int
        The kernels' column chunks ``(BLOCK_D, BLOCK_D1)`` of ``head_dim`` (the reduction of
        ``q . k``); ``(0, 0)``: one chunk.

    return_stats : bool
        Also return the kernel's softmax statistics (``plsh_forward_triton(...,
        return_stats=True)``).

    Returns
    -------
    (out, lse) or (out, lse, stats) : tuple of torch.Tensor
        float32 ``(batch, num_heads, n_q, head_dim_v)`` and ``(batch, num_heads, n_q)``
        (natural log); a row without an admissible key gives 0 and ``-inf``. ``stats``:
        float32 ``(batch, num_heads, n_q, 2)``, the row maximum (log2 domain) and
        ``log2`` of the row sum; ``(-inf, -inf)`` on an empty row.
    """
    batch, num_heads, n_q, _ = query.shape
    qt = _tiles(query, block_m)
    k, v = _pad_rows(key, block_n), _pad_rows(value, block_n)
    tm, cols = qt.shape[2], k.shape[2]
    w_all = _pad_counts(torch.as_tensor(counts), tm * block_m, cols).to(torch.float32)
    w_all = w_all.reshape(1, num_heads, tm, block_m, cols)
    scale_log2 = _f32(scale * LOG2E)
    m_i = torch.full((batch, num_heads, tm, block_m), -math.inf)
    l_i = torch.zeros((batch, num_heads, tm, block_m))
    acc = torch.zeros((batch, num_heads, tm, block_m, v.shape[3]))
    for n0 in range(0, cols, block_n):
        kt = k[:, :, None, n0 : n0 + block_n, :]
        vt = v[:, :, None, n0 : n0 + block_n, :]
        w = w_all[..., n0 : n0 + block_n]
        admissible = w > 0.0
        logits = arith.chained_dot(qt, kt.transpose(-1, -2), d_split) * scale_log2
        logits = torch.where(admissible, logits, -math.inf)
        m_new = torch.maximum(m_i, logits.amax(dim=-1))
        m_use = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.where(admissible, arith.exp2(logits - m_use[..., None]) * w, 0.0)
        alpha = arith.exp2(m_i - m_use)
        l_i = l_i * alpha + p.sum(dim=-1)
        acc = arith.dot(p, vt, acc * alpha[..., None])  # acc * alpha + tl.dot(p, v)
        m_i = m_new
    nonempty = l_i > 0.0
    l_safe = torch.where(nonempty, l_i, 1.0)
    out = torch.where(nonempty[..., None], arith.div(acc, l_safe[..., None]), 0.0)
    lse = m_i * _f32(0.6931471805599453) + torch.log(l_safe) - _f32(math.log(num_samples))
    lse = torch.where(nonempty, lse, -math.inf)
    result = (
        out.reshape(batch, num_heads, tm * block_m, -1)[:, :, :n_q],
        lse.reshape(batch, num_heads, tm * block_m)[:, :, :n_q],
    )
    if not return_stats:
        return result
    stats = torch.stack([m_i, torch.where(nonempty, torch.log2(l_safe), m_i)], dim=-1)
    return (*result, stats.reshape(batch, num_heads, tm * block_m, 2)[:, :, :n_q])


def emulated_backward(
    arith: KernelArithmetic,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    counts,
    num_samples: int,
    scale: float,
    *,
    block_m: int = 64,
    block_n: int = 16,
    dkdv_block_m: int = 16,
    d_split: tuple[int, int] = (0, 0),
    dv_split: tuple[int, int] = (0, 0),
    stats: torch.Tensor | None = None,
):
    """The float32 ``_delta_kernel``, ``_bwd_dq_kernel`` and ``_bwd_dkdv_kernel`` of
    ``plsh_fast.triton._backward`` under ``arith``.

    Parameters
    ----------
    arith, query, key, value, counts, num_samples, scale, block_m, block_n
        As :func:`emulated_forward`.
    out, lse : torch.Tensor
        The forward's float32 output and LSE (natural log; read only without ``stats``).
    grad_out : torch.Tensor
        float32 ``(batch, num_heads, n_q, head_dim_v)``.
    dkdv_block_m : int
        Query rows per step of the dK/dV kernel (16 on a GPU).
    d_split, dv_split : tuple of int
        Column chunks of ``head_dim`` and ``head_dim_v`` (the reductions of ``q . k`` and
        ``dO . v``).
    stats : torch.Tensor or None
        The forward's ``(batch, num_heads, n_q, 2)`` row maximum and ``log2`` row sum
        (``emulated_forward(..., return_stats=True)``): ``P = C 2^((x log2 e - m) - log2
        l)`` in the dK/dV kernel, ``P 2^-e = C 2^(x log2 e - mu)`` with ``mu = fl(m + log2
        l)`` in the dQ kernel (its rows times ``2^e`` afterwards), as the kernels with
        ``stats``; ``None``: ``P = C 2^(x log2 e - lse2)`` with ``lse2 = lse log2 e + log2
        s``, as the kernels without.

    Returns
    -------
    (grad_query, grad_key, grad_value) : tuple of float32 torch.Tensor
    """
    batch, num_heads, n_q, _ = query.shape
    n_k = key.shape[2]
    c = torch.as_tensor(counts)
    scale_log2 = _f32(scale * LOG2E)
    delta = (out * grad_out).sum(dim=-1)  # _delta_kernel: D_i = dO_i . O_i
    if stats is None:  # the kernels' conversion of an LSE alone
        lse2 = lse * _f32(LOG2E) + _f32(math.log2(num_samples))
        stats = torch.stack([lse2, torch.zeros_like(lse2)], dim=-1)
    live = stats[..., 0] > -math.inf
    row_max = torch.where(live, stats[..., 0], 0.0)
    log2_l = torch.where(live, stats[..., 1], 0.0)

    # dQ: one program per query tile, over the key tiles, with mu = fl(m + log2 l); its
    # rows times 2^e afterwards (the launch code's dq_rounding_factor).
    mu = row_max + log2_l
    qt, dot_ = _tiles(query, block_m), _tiles(grad_out, block_m)
    tm = qt.shape[2]
    rows = tm * block_m
    k, v = _pad_rows(key, block_n), _pad_rows(value, block_n)
    cols = k.shape[2]
    w_all = _pad_counts(c, max(rows, -(-n_q // dkdv_block_m) * dkdv_block_m), cols)
    w_all = w_all.to(torch.float32)
    pad = rows - n_q
    mu_t = torch.nn.functional.pad(mu, (0, pad)).reshape(batch, num_heads, tm, block_m)
    live_t = torch.nn.functional.pad(live, (0, pad)).reshape(batch, num_heads, tm, block_m)
    delta_t = torch.nn.functional.pad(delta, (0, pad)).reshape(batch, num_heads, tm, block_m)
    w_q = w_all[None, :, :rows].reshape(1, num_heads, tm, block_m, cols)
    dq = torch.zeros_like(qt)
    for n0 in range(0, cols, block_n):
        kt = k[:, :, None, n0 : n0 + block_n, :]
        vt = v[:, :, None, n0 : n0 + block_n, :]
        w = w_q[..., n0 : n0 + block_n]
        admissible = (w > 0.0) & live_t[..., None]
        logits = arith.chained_dot(qt, kt.transpose(-1, -2), d_split) * scale_log2
        p = torch.where(admissible, arith.exp2(logits - mu_t[..., None]) * w, 0.0)
        dp = arith.chained_dot(dot_, vt.transpose(-1, -2), dv_split)
        ds = p * (dp - delta_t[..., None])
        dq = arith.dot(ds, kt, dq)  # dq += tl.dot(ds, k)
    dq = (dq * _f32(scale)).reshape(batch, num_heads, rows, -1)[:, :, :n_q]
    dq = dq * torch.where(live, torch.exp2((mu - row_max) - log2_l), 1.0)[..., None]

    # dK, dV: one program per key tile, over the query rows in steps of dkdv_block_m.
    kt, vt = _tiles(key, block_n), _tiles(value, block_n)
    tn = kt.shape[2]
    w_k = w_all[..., : tn * block_n].reshape(num_heads, -1, tn, block_n).permute(0, 2, 3, 1)
    dk, dv = torch.zeros_like(kt), torch.zeros_like(vt)
    for m0 in range(0, n_q, dkdv_block_m):
        m1 = min(m0 + dkdv_block_m, n_q)
        q = _pad_rows(query[:, :, m0:m1], dkdv_block_m)[:, :, None]
        do = _pad_rows(grad_out[:, :, m0:m1], dkdv_block_m)[:, :, None]
        width = (0, dkdv_block_m - (m1 - m0))
        max_m = torch.nn.functional.pad(row_max[:, :, m0:m1], width)[:, :, None, None, :]
        log2_l_m = torch.nn.functional.pad(log2_l[:, :, m0:m1], width)[:, :, None, None, :]
        live_m = torch.nn.functional.pad(live[:, :, m0:m1], width)[:, :, None, None, :]
        delta_m = torch.nn.functional.pad(delta[:, :, m0:m1], width)[:, :, None, None, :]
        w_t = w_k[None, ..., m0 : m0 + dkdv_block_m]
        admissible = (w_t > 0.0) & live_m
        logits_t = arith.chained_dot(kt, q.transpose(-1, -2), d_split) * scale_log2
        p_t = torch.where(admissible, arith.exp2(logits_t - max_m - log2_l_m) * w_t, 0.0)
        dv = arith.dot(p_t, do, dv)  # dv += tl.dot(p_t, do)
        dp_t = arith.chained_dot(vt, do.transpose(-1, -2), dv_split)
        ds_t = p_t * (dp_t - delta_m)
        dk = arith.dot(ds_t, q, dk)  # dk += tl.dot(ds_t, q)
    dk = (dk * _f32(scale)).reshape(batch, num_heads, tn * block_n, -1)[:, :, :n_k]
    dv = dv.reshape(batch, num_heads, tn * block_n, -1)[:, :, :n_k]
    return dq, dk, dv
