"""Tests of the shipped Q/K/V activations and of :func:`plsh_ref.data.load_qkv`."""

from __future__ import annotations

import importlib.resources
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plsh_ref.data import SHIPPED_FILE, load_qkv

# --- the shipped file -------------------------------------------------------------------


def test_shipped_file_is_package_data_and_small():
    resource = importlib.resources.files("plsh_ref.data").joinpath(SHIPPED_FILE)
    assert resource.is_file()
    with importlib.resources.as_file(resource) as path:
        assert path.stat().st_size <= 5 * 1024 * 1024
    card = importlib.resources.files("plsh_ref.data").joinpath("DATA_CARD.md")
    assert card.is_file()
    text = card.read_text(encoding="utf-8")
    for needle in (
        "all-MiniLM-L6-v2",
        "Apache-2.0",
        "GNU General Public License",
        "float16",
        "make_qkv_data.py",
        "ALiBi",
    ):
        assert needle in text


def test_shipped_raw_format():
    resource = importlib.resources.files("plsh_ref.data").joinpath(SHIPPED_FILE)
    with importlib.resources.as_file(resource) as path, np.load(path) as raw:
        for name in ("query", "key", "value"):
            assert raw[name].dtype == np.float16
            assert raw[name].shape == (3, 12, 512, 32)
        assert raw["layers"].dtype == np.int64


def test_shipped_loads_as_float64_bhnd():
    qkv = load_qkv()
    for name in ("query", "key", "value"):
        arr = qkv[name]
        assert arr.dtype == np.float64
        assert arr.shape == (3, 12, 512, 32)
        assert arr.flags.c_contiguous
        assert np.all(np.isfinite(arr))
        assert np.count_nonzero(arr) > 0.99 * arr.size
        assert np.std(arr) > 0.1
        # Heads and tokens really differ (not a broadcast constant).
        assert np.ptp(arr.mean(axis=(0, 2, 3))) > 0
        assert np.ptp(arr[0, 0].mean(axis=1)) > 0
    np.testing.assert_array_equal(qkv["layers"], [0, 3, 5])
    assert qkv["layers"].dtype == np.int64


def test_shipped_metadata():
    qkv = load_qkv()
    assert qkv["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert qkv["model_license"] == "Apache-2.0"
    assert "GNU General Public License" in qkv["text_source"]
    assert "verbatim" in qkv["text_license"]
    assert isinstance(qkv["text_sha256"], str) and len(qkv["text_sha256"]) == 64
    tokens, ids = qkv["tokens"], qkv["token_ids"]
    assert tokens.shape == ids.shape == (512,)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert ids[0] == 101 and ids[-1] == 102  # BERT uncased [CLS] / [SEP]
    assert list(tokens[1:5]) == ["the", "gnu", "general", "public"]
    assert qkv["path"].endswith(SHIPPED_FILE)


def test_layer_selection():
    full = load_qkv()
    for i, layer in enumerate([0, 3, 5]):
        one = load_qkv(layer=layer)
        assert one["query"].shape == (1, 12, 512, 32)
        np.testing.assert_array_equal(one["layers"], [layer])
        for name in ("query", "key", "value"):
            np.testing.assert_array_equal(one[name][0], full[name][i])
    with pytest.raises(ValueError, match=r"^layer: 1 is not among"):
        load_qkv(layer=1)
    with pytest.raises(TypeError, match=r"^layer:"):
        load_qkv(layer=3.0)


def test_real_attention_structure():
    """Exact softmax attention on the real tokens is peaked, not uniform."""
    qkv = load_qkv(layer=0)
    q, k = qkv["query"][0], qkv["key"][0]
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    # Uniform rows would have max weight 1/512; real heads concentrate far more.
    assert np.median(w.max(-1)) > 10 / 512


def test_plsh_ref_data_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from plsh_ref.data import load_qkv; q = load_qkv(layer=5); "
        "assert q['query'].shape == (1, 12, 512, 32); "
        "assert sys.modules['torch'] is None"
    )
    import plsh_ref

    root = str(Path(plsh_ref.__file__).resolve().parent.parent)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- user files and the loader's errors -------------------------------------------------


def _rng_qkv(rng, b=2, h=4, hkv=2, nq=5, nk=7, d=3, dv=6):
    return {
        "query": rng.standard_normal((b, h, nq, d)),
        "key": rng.standard_normal((b, hkv, nk, d)),
        "value": rng.standard_normal((b, hkv, nk, dv)),
    }


def test_user_file_4d_with_metadata(tmp_path):
    rng = np.random.default_rng(0)
    arrays = _rng_qkv(rng)
    path = tmp_path / "mine.npz"
    np.savez(
        path, **arrays, layers=np.array([7, 2]), note=np.array("hello"), temperature=np.array(0.5)
    )
    out = load_qkv(path)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(out[name], arr)
        assert out[name].dtype == np.float64
    np.testing.assert_array_equal(out["layers"], [7, 2])
    assert out["note"] == "hello" and out["temperature"] == 0.5
    assert out["path"] == str(path)
    sel = load_qkv(str(path), layer=2)
    np.testing.assert_array_equal(sel["query"], arrays["query"][1:2])
    np.testing.assert_array_equal(sel["value"], arrays["value"][1:2])


def test_user_file_3d_and_float32(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "mine3d.npz"
    q = rng.standard_normal((4, 5, 8)).astype(np.float32)
    k = rng.standard_normal((1, 9, 8)).astype(np.float32)
    v = rng.standard_normal((1, 9, 2)).astype(np.float16)
    np.savez_compressed(path, query=q, key=k, value=v)
    out = load_qkv(path)
    assert out["query"].shape == (1, 4, 5, 8) and out["query"].dtype == np.float64
    assert out["key"].shape == (1, 1, 9, 8)
    assert out["value"].shape == (1, 1, 9, 2)
    np.testing.assert_array_equal(out["layers"], [0])
    np.testing.assert_array_equal(out["query"][0], q.astype(np.float64))
    np.testing.assert_array_equal(load_qkv(path, layer=0)["key"], out["key"])


@pytest.mark.parametrize("missing", ["query", "key", "value"])
def test_missing_array(tmp_path, missing):
    arrays = _rng_qkv(np.random.default_rng(2))
    del arrays[missing]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=rf"^{missing}: missing from"):
        load_qkv(path)


def _bad(tmp_path, **changes):
    arrays = _rng_qkv(np.random.default_rng(3))
    arrays.update(changes)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "changes, name, exc",
    [
        # wrong rank
        ({"query": np.zeros((4, 5))}, "query", ValueError),
        ({"key": np.zeros((1, 2, 2, 7, 3))}, "key", ValueError),
        # empty dimension
        ({"query": np.zeros((2, 4, 0, 3))}, "query", ValueError),
        # batch mismatch
        ({"key": np.ones((3, 2, 7, 3)), "value": np.ones((3, 2, 7, 6))}, "key", ValueError),
        ({"value": np.ones((1, 2, 7, 6))}, "value", ValueError),
        # heads: key/value differ, or do not divide the query's
        ({"value": np.ones((2, 4, 7, 6))}, "value", ValueError),
        ({"key": np.ones((2, 3, 7, 3)), "value": np.ones((2, 3, 7, 6))}, "key", ValueError),
        # key/value sequence lengths differ
        ({"value": np.ones((2, 2, 8, 6))}, "value", ValueError),
        # query/key head_dim differ
        ({"key": np.ones((2, 2, 7, 4))}, "key", ValueError),
        # non-finite entries
        ({"query": np.full((2, 4, 5, 3), np.nan)}, "query", ValueError),
        ({"value": np.full((2, 2, 7, 6), np.inf)}, "value", ValueError),
        # non-numeric dtypes
        ({"key": np.ones((2, 2, 7, 3), dtype=bool)}, "key", TypeError),
        ({"query": np.ones((2, 4, 5, 3), dtype=complex)}, "query", TypeError),
        ({"value": np.full((2, 2, 7, 6), "x")}, "value", TypeError),
        # layers metadata
        ({"layers": np.array([0, 1, 2])}, "layers", ValueError),
        ({"layers": np.array([4, 4])}, "layers", ValueError),
        ({"layers": np.array([0.0, 1.0])}, "layers", TypeError),
    ],
)
def test_bad_files(tmp_path, changes, name, exc):
    path = _bad(tmp_path, **changes)
    with pytest.raises(exc, match=rf"^{name}:"):
        load_qkv(path)


def test_pickled_entry_refused(tmp_path):
    arrays = _rng_qkv(np.random.default_rng(4))
    arrays["query"] = np.empty(1, dtype=object)
    path = tmp_path / "pickled.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"^query: .*pickle"):
        load_qkv(path)


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^path:"):
        load_qkv(tmp_path / "nope.npz")
    npy = tmp_path / "single.npy"
    np.save(npy, np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"^path: .*single \.npy"):
        load_qkv(npy)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip archive at all")
    with pytest.raises(ValueError, match=r"^path: cannot read"):
        load_qkv(junk)
    with pytest.raises(TypeError, match=r"^path:"):
        load_qkv(123)
