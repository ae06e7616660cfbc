"""The CPU path's user-set settings are set on ``plsh_fast.cpu`` and honoured everywhere.

The settings live in ``plsh_fast/cpu/_settings.py``; the package forwards reads and writes
of their names there (:mod:`plsh_fast.cpu`), and every module reads them at call time. A
module that copied a setting (``from ._settings import CHUNK_ELEMENTS``) would keep the
value of import time: the structural test below fails on such an import.
"""

from __future__ import annotations

import ast
import re

import _paths
import pytest
import torch

import plsh_fast.cpu as cpu
from plsh_fast.cpu import _settings
from plsh_fast.nn import PLSHAttention

SETTINGS = _settings.__all__


def test_every_setting_is_public_and_forwarded():
    assert set(SETTINGS) <= set(cpu.__all__)
    assert set(SETTINGS) <= set(dir(cpu))
    for name in SETTINGS:
        assert getattr(cpu, name) is getattr(_settings, name)
        assert name not in vars(cpu)  # not a copy in the package's namespace


@pytest.mark.parametrize("name", SETTINGS)
def test_a_plain_assignment_on_the_package_reaches_the_settings(name):
    saved = getattr(cpu, name)
    marker = object()
    try:
        setattr(cpu, name, marker)
        assert getattr(_settings, name) is marker and getattr(cpu, name) is marker
        assert name not in vars(cpu)
    finally:
        setattr(cpu, name, saved)
    assert getattr(_settings, name) is saved


def test_no_module_of_the_package_copies_a_setting():
    """Only ``from . import _settings as settings`` (read at call time) is allowed."""
    copies = []
    for path in sorted((_paths.ROOT / "plsh_fast" / "cpu").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_settings"):
                copies += [(path.name, a.name) for a in node.names if a.name in SETTINGS]
            if isinstance(node, ast.Assign) and path.name != "_settings.py":
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
                copies += [(path.name, t) for t in targets if t in SETTINGS]
    assert copies == []


def _plan(pos):
    core = PLSHAttention(4, 8, seed=0)
    plan = cpu.plan_cpu(core.pitch, core.offset, pos, pos, True, torch.float32)
    return plan, cpu._planning.chunk_specs(plan, 1)


def test_settings_set_on_the_package_change_the_planning_and_the_kernel():
    """Each setting, assigned on the package, changes what the modules that read it do
    (planning, bands, the cache, the tile kernel); restored, the default behaviour is back."""
    pos = torch.arange(400)
    with cpu.no_kept_plans():
        plan, specs = _plan(pos)
    assert any(plan.band) and cpu.fused_tiles_available()
    saved = {name: getattr(cpu, name) for name in SETTINGS}
    try:
        cpu.CHUNK_ELEMENTS = 256
        cpu.BAND_MAX_TILE = 0
        cpu.USE_FUSED_TILES = False
        cpu.PLAN_CACHE_BYTES = 0
        with cpu.no_kept_plans():
            small_plan, small_specs = _plan(pos)
        assert not any(small_plan.band)  # BAND_MAX_TILE read by _band
        assert len(small_specs) > len(specs)  # CHUNK_ELEMENTS read by _planning / _band
        assert not cpu.fused_tiles_available()  # USE_FUSED_TILES read by _tiles
        for _ in range(3):
            _plan(pos)
        assert cpu.kept_plan_bytes() == 0  # PLAN_CACHE_BYTES read by _plan_cache
        cpu.BAND_MAX_TILE, cpu.BAND_TILE = 32, 48
        with pytest.raises(ValueError, match="^BAND_TILE:"):  # read by _planning
            _plan(pos)
    finally:
        for name, value in saved.items():
            setattr(cpu, name, value)
    with cpu.no_kept_plans():
        plan_again, specs_again = _plan(pos)
    assert plan_again.band == plan.band and len(specs_again) == len(specs)
    assert cpu.fused_tiles_available()


def test_the_documented_defaults_are_the_values():
    """The package docstring documents each setting once (``.. py:data::`` with its
    ``:value:``); the values live in ``_settings.py``: the two must agree."""
    documented = dict(re.findall(r"\.\. py:data:: (\w+)\n   :value: (.+)\n", cpu.__doc__))
    assert set(documented) == set(SETTINGS)
    for name, value in documented.items():
        assert ast.literal_eval(value) == getattr(_settings, name), name


def test_the_public_names_are_documented_as_the_packages_own():
    """The modules that define them are private (absent from the API pages), so every
    function of ``plsh_fast.cpu.__all__`` names the package as its module."""
    functions = [getattr(cpu, name) for name in cpu.__all__ if name not in SETTINGS]
    assert functions and all(f.__module__ == "plsh_fast.cpu" for f in functions)
