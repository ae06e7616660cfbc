"""The shipped tile rules of ``plsh_fast/triton/_config.py`` at their thresholds.

:func:`tile_config`'s docstring states each rule (from the AOT compile tables); these tests
read them at the edges where a flipped or shifted comparison would change the choice:
``TileConfig.classify`` off exactly above one pass of samples (``MAX_SAMPLE_BLOCK``) for
float32 on sm_90 at ``head_dim <= 128``; register caps and column halves at head sizes 64,
65, 96, 97, 127, 128 and 129; sm_90 from compute capability 9; the widest of unequal head
sizes. No GPU needed: the rules take the capability as an argument.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from plsh_fast.triton import _config  # noqa: E402
from plsh_fast.triton._tiling import MAX_SAMPLE_BLOCK  # noqa: E402

CUDA = torch.device("cuda")
CPU = torch.device("cpu")
SM90, SM80 = (9, 0), (8, 0)
HEAD_DIMS = [8, 16, 40, 64, 65, 72, 96, 97, 112, 127, 128, 129, 256]


def _cfg(d, dtype, capability=SM90, num_samples=None, dv=None, device=CUDA):
    return _config.tile_config(d, d if dv is None else dv, device, dtype, capability, num_samples)


def test_one_pass_of_samples_is_sixty_four():
    assert MAX_SAMPLE_BLOCK == 64


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("capability", [SM80, (8, 9), SM90, (10, 0)])
def test_classify_is_off_only_for_float32_on_sm90_above_one_pass(d, dtype, capability):
    hopper = capability[0] >= 9
    for s, many in ((None, False), (1, False), (64, False), (65, True), (256, True)):
        cfg = _cfg(d, dtype, capability, s)
        expected = not (many and hopper and dtype == torch.float32 and d <= 128)
        assert cfg.classify is expected, (d, dtype, capability, s)
        # up to one pass (or None) the configuration is the one without num_samples
        if not many:
            assert cfg == _cfg(d, dtype, capability, None)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("capability", [SM80, (8, 9), SM90])
def test_half_types_on_sm80_may_use_255_registers_above_one_pass(d, capability):
    for dtype in (torch.float16, torch.bfloat16):
        for s in (64, 65):
            cfg = _cfg(d, dtype, capability, s)
            hopper = capability[0] >= 9
            expected = 255 if (s > 64 and not hopper and d <= 128) else None
            assert cfg.dkdv_maxnreg == expected, (d, dtype, capability, s)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_float32_register_caps_and_forward_halves(d):
    hopper, ampere = _cfg(d, torch.float32, SM90), _cfg(d, torch.float32, SM80)
    if d <= 128:
        assert hopper.fwd_maxnreg == (254 if 96 < d < 128 else None), d
        assert hopper.fwd_column_halves is (_config.pow2(d) == d or d > 96), d
        assert (hopper.block_m, hopper.block_n, hopper.dkdv_block_n) == (64, 16, 64)
        assert hopper.dkdv_split_d and hopper.dkdv_manual_x3 and hopper.narrow_whole
        assert ampere.fwd_maxnreg == (255 if d > 64 else None), d
        assert ampere.block_m == (64 if d <= 64 else 16), d
        assert ampere.column_halves and ampere.narrow_whole and not ampere.dkdv_split_d
    else:
        for cfg in (hopper, ampere):
            assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (32, 32, 8), d
            assert cfg.fwd_maxnreg is None and not cfg.column_halves


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_half_types_column_halves_and_dq_tiles(d):
    for dtype in (torch.float16, torch.bfloat16):
        hopper, ampere = _cfg(d, dtype, SM90), _cfg(d, dtype, SM80)
        if d <= 128:
            halves = 96 < d < 128
            assert hopper.column_halves is halves and hopper.narrow_whole is halves, d
            assert hopper.fwd_column_halves is False
            assert (hopper.block_m, hopper.block_n, hopper.dq_block_n) == (64, 64, 32)
            assert (ampere.block_m, ampere.block_n, ampere.dq_block_n) == (64, 32, 16)
            assert ampere.column_halves and ampere.narrow_whole
        else:
            for cfg in (hopper, ampere):
                assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (64, 32, 8), d
                assert not cfg.column_halves


def test_the_widest_of_unequal_head_sizes_chooses():
    for dtype in (torch.float32, torch.bfloat16):
        for cap in (SM80, SM90):
            assert _cfg(64, dtype, cap, dv=129) == _cfg(129, dtype, cap)
            assert _cfg(129, dtype, cap, dv=64) == _cfg(129, dtype, cap)
            assert _cfg(100, dtype, cap, dv=8) == _cfg(100, dtype, cap)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_the_interpreter_takes_16_tiles_and_gpu_column_chunks(d):
    for dtype in (torch.float32, torch.float16):
        cfg = _cfg(d, dtype, None, device=CPU)
        halves = dtype == torch.float32 and d <= 128
        assert (cfg.block_m, cfg.block_n, cfg.dkdv_block_m) == (16, 16, 16)
        assert cfg.column_halves is halves and cfg.narrow_whole is halves, (d, dtype)
        assert cfg.classify  # the interpreter classifies at any number of samples
        assert _cfg(d, dtype, None, 256, device=CPU) == cfg


def test_default_blocks_are_the_first_four_fields():
    for d in (64, 97, 256):
        cfg = _cfg(d, torch.bfloat16, SM80)
        blocks = _config.default_blocks(d, d, CUDA, torch.bfloat16, SM80)
        assert blocks == (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
    assert _config.default_blocks(64, 64, CUDA, torch.float32, SM90) != _config.default_blocks(
        64, 64, CUDA, torch.bfloat16, SM90
    )


# ----------------------------------------------------------------------------- TileConfig


def test_halves_reads_the_forward_override_only_for_the_forward():
    base = _config.TileConfig(16, 16, 4, 1, 4, 16, 4, column_halves=True)
    assert base.halves(True) and base.halves(False)
    off = dataclasses.replace(base, fwd_column_halves=False)
    assert not off.halves(True) and off.halves(False)
    on = dataclasses.replace(base, column_halves=False, fwd_column_halves=True)
    assert on.halves(True) and not on.halves(False)


def test_backward_chunks_take_the_narrower_whole():
    cfg = _config.TileConfig(16, 16, 4, 1, 4, 16, 4, column_halves=True, narrow_whole=True)
    assert cfg.backward_chunks(64, 128, dkdv=False) == ((64, 0), (64, 64))
    assert cfg.backward_chunks(128, 64, dkdv=False) == ((64, 64), (64, 0))
    assert cfg.backward_chunks(96, 96, dkdv=False) == ((64, 64), (64, 64))  # equal: halves
    split = dataclasses.replace(cfg, dkdv_split_d=True)
    assert split.backward_chunks(64, 128, dkdv=True) == ((32, 32), (64, 64))  # both halved
    assert split.backward_chunks(64, 128, dkdv=False) == ((64, 0), (64, 64))
    plain = dataclasses.replace(cfg, narrow_whole=False)
    assert plain.backward_chunks(64, 128, dkdv=False) == ((32, 32), (64, 64))
    # the backward reads column_halves, not the forward's override
    fwd_off = dataclasses.replace(cfg, fwd_column_halves=False)
    assert fwd_off.backward_chunks(96, 96, dkdv=False) == ((64, 64), (64, 64))
    fwd_on = dataclasses.replace(cfg, column_halves=False, fwd_column_halves=True)
    assert fwd_on.backward_chunks(96, 96, dkdv=False) == ((64, 32), (64, 32))
    whole = dataclasses.replace(cfg, column_halves=False)
    assert whole.backward_chunks(80, 128, dkdv=False) == ((64, 16), (128, 0))


def test_head_dim_split_at_its_documented_values():
    split = _config.head_dim_split
    assert split(80) == (64, 16) and split(96) == (64, 32) and split(200) == (256, 0)
    assert split(64) == (64, 0) and split(16) == (16, 0) and split(8) == (16, 0)
    assert split(64, halves=True) == (32, 32) and split(32, halves=True) == (16, 16)
    for d in (80, 96, 128):
        assert split(d, halves=True) == (64, 64)
    assert split(16, halves=True) == (16, 0)  # below 32 no halves
    for d in (8, 17, 64, 80, 96, 128, 200, 256):
        for halves in (False, True):  # tile widths: Python ints (tl.constexpr), not floats
            assert all(type(x) is int for x in split(d, halves)), (d, halves)
    assert split(17) == (32, 0)  # 16 + 16 is no saving over 32
    assert _config.pow2(0) == 16 and _config.pow2(17) == 32 and _config.pow2(5, minimum=1) == 8
    assert _config.pow2(1, minimum=1) == 1 and _config.pow2(0, minimum=1) == 1


def test_dot_precision():
    assert _config.dot_precision(torch.float32, True) == "ieee"
    assert _config.dot_precision(torch.float32, False) == "tf32x3"
    assert _config.dot_precision(torch.bfloat16, False) == "tf32"


# ----------------------------------------------------------------------------- the table

#: The shipped configuration of each branch of tile_config, as measured in the AOT compile
#: tables its docstring cites (benchmarks/results/aot_2026-12-01_*.md): warps, stages and
#: tiles decide spills and pipelining, which no numerical test sees. A deliberate change
#: updates this table together with a new AOT report.
SHIPPED = {
    ("interpreter", torch.float32, 64): _config.TileConfig(16, 16, 4, 1, 4, 16, 4, True, narrow_whole=True),
    ("interpreter", torch.bfloat16, 64): _config.TileConfig(16, 16, 4, 1, 4, 16, 4, False),
    (SM90, torch.float32, 64): _config.TileConfig(
        64, 16, 4, 2, 8, 16, 4, True, fwd_column_halves=True, dkdv_block_n=64,
        dkdv_split_d=True, dkdv_manual_x3=True, narrow_whole=True,
    ),
    (SM80, torch.float32, 64): _config.TileConfig(64, 16, 4, 2, 8, 16, 8, True, narrow_whole=True),
    (SM80, torch.float32, 128): _config.TileConfig(
        16, 16, 4, 2, 8, 16, 8, True, fwd_maxnreg=255, narrow_whole=True
    ),
    (SM80, torch.bfloat16, 64): _config.TileConfig(
        64, 32, 4, 3, 4, 16, 4, True, dq_block_n=16, narrow_whole=True
    ),
    (SM90, torch.bfloat16, 128): _config.TileConfig(
        64, 64, 4, 3, 4, 16, 4, False, dq_block_n=32, fwd_column_halves=False
    ),
    (SM90, torch.float32, 256): _config.TileConfig(32, 32, 8, 2, 8, 16, 8),
    (SM90, torch.bfloat16, 256): _config.TileConfig(64, 32, 8, 2, 8, 16, 8),
}  # fmt: skip


@pytest.mark.parametrize("where, dtype, d", list(SHIPPED))
def test_the_shipped_table(where, dtype, d):
    if where == "interpreter":
        assert _cfg(d, dtype, None, device=CPU) == SHIPPED[where, dtype, d]
    else:
        assert _cfg(d, dtype, where) == SHIPPED[where, dtype, d]


def test_the_capability_defaults_to_the_devices(monkeypatch):
    asked = []

    def capability(device):
        asked.append(device)
        return SM80

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    device = torch.device("cuda", 1)
    assert _config.tile_config(64, 64, device, torch.float32) == _cfg(64, torch.float32, SM80)
    assert asked == [device]
    asked.clear()
    _config.tile_config(64, 64, device, torch.float32, SM90)  # given: not asked
    assert asked == []
