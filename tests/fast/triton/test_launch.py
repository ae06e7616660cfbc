"""The launch code both Triton passes share (``plsh_fast.triton._launch``): rows sorted by
position and put back, and the resolution of a ``TileConfig`` into each kernel's tiles.

No kernel runs here except the bins kernel of the plan (interpreted on CPU, compiled on a
GPU: tests/_triton_interp.py).
"""

from __future__ import annotations

import dataclasses

import _triton_interp
import numpy as np
import pytest
import torch

from plsh_ref.partition import draw_partition

plsh_triton = _triton_interp.load("triton")
launch_module = _triton_interp.load("triton._launch")
backward_module = _triton_interp.load("triton._backward")

pytestmark = pytest.mark.triton


def test_sorted_rows_run_on_sorted_positions_and_come_back_in_the_callers_order():
    """Unsorted (and repeated) positions: ``run`` sees rows and positions sorted by
    position (stable), its per-row results return in the caller's order; sorted positions
    run nothing (``None``)."""
    rng = np.random.default_rng(5)
    qpos = torch.from_numpy(rng.permutation(9) * 3)
    kpos = torch.from_numpy(np.repeat(rng.permutation(4), 2))
    rows_q = torch.arange(9.0).reshape(1, 1, 9, 1)
    rows_k = torch.arange(8.0).reshape(1, 1, 8, 1)
    seen = []

    def run(query_rows, key_rows, sorted_q, sorted_k):
        seen.append((sorted_q, sorted_k))
        (q,), (k,) = query_rows, key_rows
        return (q * 10 + sorted_q.reshape(1, 1, -1, 1),), (k - sorted_k.reshape(1, 1, -1, 1),)

    (q_out,), (k_out,) = launch_module.on_sorted_rows(run, qpos, kpos, (rows_q,), (rows_k,))
    ((sorted_q, sorted_k),) = seen
    assert bool((sorted_q[1:] >= sorted_q[:-1]).all()) and bool(
        (sorted_k[1:] >= sorted_k[:-1]).all()
    )
    # row i of each result is computed from row i of the input and its own position
    assert torch.equal(q_out.flatten(), rows_q.flatten() * 10 + qpos)
    assert torch.equal(k_out.flatten(), rows_k.flatten() - kpos)
    order = torch.sort(kpos, stable=True).indices  # equal positions keep their order
    assert torch.equal(sorted_k, kpos[order])
    assert launch_module.on_sorted_rows(run, torch.arange(9), torch.arange(8), (), ()) is None
    assert len(seen) == 1


def _resolve(tiles, n=40):
    partition = draw_partition(np.array([2.0, 9.0]), 3, seed=0)
    pitch, offset = (torch.from_numpy(np.array(x)) for x in (partition.pitch, partition.offset))
    q = torch.zeros(1, 2, n, 8)
    pos = torch.arange(n)
    return _triton_interp.call(
        launch_module.prepare_launch, q, q, pitch, offset, pos, pos, True,
        tiles=tiles, plan=None, kernel=backward_module._bwd_dq_kernel,
    )  # fmt: skip


def test_a_given_configuration_sets_the_tiles_of_every_kernel():
    """``prepare_launch`` reads every launch option from the one configuration: the plan's
    tiles, the dQ key tile (``None``: ``block_n``), the dK/dV query tile
    ``min(block_m, dkdv_block_m)`` and key tile (``None``: ``block_n``), the stages, the
    variant and the classification; a dQ key tile that does not divide ``block_n`` is
    refused."""
    given = plsh_triton.TileConfig(32, 32, 4, 1, 4, 16, 4, dq_block_n=16, dkdv_block_n=64)
    launch = _resolve(given)
    assert launch.tiles == given and launch.n_q_tiles == 2 and launch.num_samples == 3
    assert (launch.plan.block_m, launch.plan.block_n) == (32, 32)
    assert (launch.dq_block_n, launch.dkdv_block_m, launch.dkdv_block_n) == (16, 16, 64)
    assert launch.meta["BLOCK_M"] == launch.meta["BLOCK_N"] == 32
    assert launch.meta["NUM_STAGES"] == launch.meta["num_stages"] == 1
    assert launch.meta["VARIANT"] == 0 and launch.meta["CLASSIFY"] is True
    wide = _resolve(dataclasses.replace(given, dkdv_block_m=64, dq_block_n=None, dkdv_block_n=None))
    assert (wide.dq_block_n, wide.dkdv_block_m, wide.dkdv_block_n) == (32, 32, 32)
    control = _resolve(dataclasses.replace(given, variant=2, classify=False))
    assert control.meta["VARIANT"] == 2 and control.meta["CLASSIFY"] is False
    with pytest.raises(AssertionError):
        _resolve(dataclasses.replace(given, dq_block_n=24))


def test_without_a_configuration_the_shipped_one_is_used():
    """``tiles=None``: ``tile_config`` of the problem; in the interpreter the dK/dV kernel
    then walks the plan's query tiles (``block_m``), compiled ``min(block_m,
    dkdv_block_m)``."""
    launch = _resolve(None)
    shipped = plsh_triton.tile_config(8, 8, _triton_interp.DEVICE, torch.float32, num_samples=3)
    assert launch.tiles == shipped and launch.interpreted == (not _triton_interp.COMPILED)
    expected = shipped.block_m if launch.interpreted else min(shipped.block_m, shipped.dkdv_block_m)
    assert launch.dkdv_block_m == expected


def test_the_public_names_are_documented_as_the_packages_own():
    """The modules that define them are private (absent from the API pages), so every
    function and class of ``plsh_fast.triton.__all__`` names the package as its module."""
    public = [getattr(plsh_triton, name) for name in plsh_triton.__all__]
    objects = [x for x in public if callable(x)]
    assert plsh_triton.TileConfig in objects and plsh_triton.plsh_backward_triton in objects
    assert all(x.__module__ == "plsh_fast.triton" for x in objects)
