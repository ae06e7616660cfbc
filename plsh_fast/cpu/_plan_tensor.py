"""A CPU plan as one tensor (package docstring, "The plan"): how the compiled backward
reuses the forward's plan.

Custom operators pass only tensors from a forward to its backward
(:mod:`plsh_fast._ops`): :func:`plan_to_tensor` writes the tile heights, band flags and
every work item of a plan into one int64 tensor, :func:`plan_from_tensor` reads them back
into the plan of :func:`plsh_fast.cpu.plan_cpu`.
"""

from __future__ import annotations

import torch

from . import _planning as planning

__all__ = ["plan_from_tensor", "plan_to_tensor"]

_SPEC_HEADER = 6  # head, tile, width, tiles in the group, samples, has causal cut


def plan_to_tensor(plan: planning.Plan) -> torch.Tensor:
    """The plan's tile groups as one int64 1-D CPU tensor (for :func:`plan_from_tensor`).

    Custom operators pass only tensors from a forward to its backward
    (:mod:`plsh_fast._ops`); this is how the compiled backward reuses the forward's plan.
    ``[-1]`` when the forward built no tile groups (empty inputs); ``[-3, heads, tiles,
    band flags]`` for a kept plan, whose items no longer hold their ranges.
    """
    if plan.specs is None:
        return torch.full((1,), -1, dtype=torch.int64)
    # The tile heights and band flags of the heads come first: the backward must use the
    # forward's even if the package settings changed in between.
    heads = len(plan.tiles)
    if any(spec[5] is None for spec in plan.specs):
        # A kept plan's slim items (Plan.drop_ranges): the backward finds the kept plan by
        # its inputs (plan_cpu), or, if it was evicted meanwhile, plans the items again
        # with the forward's tiles (their ranges depend on the inputs only).
        return torch.tensor([-3, heads, *plan.tiles, *plan.band], dtype=torch.int64)
    parts = [torch.tensor([len(plan.specs), heads, *plan.tiles, *plan.band], dtype=torch.int64)]
    for h, tile, w, sel, lo, st, en, cut, new in plan.specs:
        header = [h, tile, w, sel.numel(), st.shape[0], cut is not None]
        parts += [torch.tensor(header, dtype=torch.int64), sel, lo, st.reshape(-1), en.reshape(-1)]
        if cut is not None:
            parts.append(cut.reshape(-1))
        parts.append(new.reshape(-1).to(torch.int64))
    return torch.cat(parts)


def plan_from_tensor(
    blob: torch.Tensor, pitch, offset, query_positions, key_positions, causal: bool, dtype
) -> planning.Plan:
    """The plan of :func:`plsh_fast.cpu.plan_cpu`, tile groups decoded from :func:`plan_to_tensor`.

    Sort orders and tile heights are recomputed (``O(n)``); the block ranges and tile
    groups (the expensive part) are read from ``blob``, unless ``plan_cpu`` returns a
    kept plan, whose groups are the same (same inputs, deterministic planning).
    """
    plan = planning.plan_cpu(pitch, offset, query_positions, key_positions, causal, dtype)
    count = int(blob[0])
    if count in (-1, -2) or plan.specs is not None:
        return plan
    heads = int(blob[1])
    plan.tiles = blob[2 : 2 + heads].tolist()
    plan.band = [bool(b) for b in blob[2 + heads : 2 + 2 * heads].tolist()]
    if count == -3:  # the forward's plan was kept (slim items): plan them with its tiles
        return plan
    specs, at = [], 2 + 2 * heads
    for _ in range(count):
        h, tile, w, g, s, has_cut = blob[at : at + _SPEC_HEADER].tolist()
        at += _SPEC_HEADER

        def take(size, shape):
            nonlocal at
            out = blob[at : at + size].view(shape)
            at += size
            return out

        sel, lo = take(g, (g,)), take(g, (g,))
        st, en = take(s * g * tile, (s, g, tile)), take(s * g * tile, (s, g, tile))
        cut = take(g * tile, (g, tile)) if has_cut else None
        new = take(g * tile, (g, tile)).bool()
        specs.append((h, tile, w, sel, lo, st, en, cut, new))
    plan.specs = specs
    return plan
