"""Shipped real query/key/value activations, and the loader for user ``.npz`` files.

The package ships ``minilm_qkv.npz``: the outputs of the query, key and value projections
of layers 0, 3 and 5 of the pretrained encoder ``sentence-transformers/all-MiniLM-L6-v2``
(Apache-2.0) on 512 tokens of real English text (the Preamble of the GNU GPL v3), stored as
float16 in the layout ``(num_layers, num_heads, seq_len, head_dim) = (3, 12, 512, 32)``.
``DATA_CARD.md`` beside it tells how it was made; ``scripts/make_qkv_data.py`` regenerates
it. MiniLM has no ALiBi: as in the paper's experiments on pretrained models, ALiBi (or
positional LSH) is inserted as the positional bias on top of these activations.

:func:`load_qkv` reads that file, or a user's file in the same format (the ``plsh
reproduce --qkv FILE`` option), validates it and returns float64 arrays in the project's
layout ``(batch, num_heads, seq_len, head_dim)``, the stored layers being the batch.

File format (``np.savez`` / ``np.savez_compressed``, no pickled objects)
-------------------------------------------------------------------------
``query``
    Real floating or integer array ``(B, H, n_q, d)`` or ``(H, n_q, d)`` (taken as ``B = 1``).
``key``
    ``(B, H_kv, n_k, d)`` or ``(H_kv, n_k, d)``; ``H_kv`` divides ``H`` (grouped-query
    attention: query head ``h`` uses key/value head ``h // (H // H_kv)``).
``value``
    ``(B, H_kv, n_k, d_v)`` or ``(H_kv, n_k, d_v)``; ``d_v`` may differ from ``d``.
``layers`` (optional)
    Integer array ``(B,)`` of distinct layer indices labelling the batch entries; defaults
    to ``arange(B)``.
anything else (optional)
    Metadata (strings, numbers, arrays), returned as is (0-d arrays as Python scalars).

All entries of ``query``, ``key`` and ``value`` must be finite; every dimension is >= 1.
"""

from __future__ import annotations

import importlib.resources
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..validation import as_float_array, check_int

__all__ = ["SHIPPED_FILE", "load_qkv"]

#: File name of the shipped activations inside :mod:`plsh_ref.data`.
SHIPPED_FILE = "minilm_qkv.npz"

_REQUIRED = ("query", "key", "value")


def load_qkv(path: str | os.PathLike | None = None, layer: int | None = None) -> dict:
    """Load query/key/value activations from an ``.npz`` file as float64 arrays.

    Parameters
    ----------
    path : str or os.PathLike, optional
        An ``.npz`` file in the format described in :mod:`plsh_ref.data`. ``None`` (the
        default) loads the shipped all-MiniLM-L6-v2 activations ``minilm_qkv.npz``
        (layers 0, 3, 5; 12 heads; 512 tokens; head_dim 32) through
        :mod:`importlib.resources`.
    layer : int, optional
        Keep only this layer: a value from the file's ``layers`` array (for a file without
        ``layers``, a batch index). The result then has batch size 1. ``None`` keeps every
        stored layer, one per batch entry.

    Returns
    -------
    dict
        ``"query"`` : ndarray of float64, shape ``(B, H, n_q, d)``.
        ``"key"`` : ndarray of float64, shape ``(B, H_kv, n_k, d)``.
        ``"value"`` : ndarray of float64, shape ``(B, H_kv, n_k, d_v)``.
        ``"layers"`` : ndarray of int64, shape ``(B,)``, the layer of each batch entry.
        ``"path"`` : str, the file that was read.
        Every other entry of the file as metadata: 0-d arrays as Python scalars or
        strings, other arrays unchanged. The shipped file has ``"model"``,
        ``"model_license"``, ``"model_sha256"``, ``"text_source"``, ``"text_license"``,
        ``"text_sha256"``, ``"tokens"`` (str, ``(512,)``, WordPiece tokens including
        ``[CLS]`` and ``[SEP]``), ``"token_ids"`` (int64, ``(512,)``), ``"description"``
        and ``"generator"``.

        ``B`` is the number of stored layers (1 when ``layer`` is given). The arrays are
        fresh float64 copies: the shipped float16 values are converted exactly.

    Raises
    ------
    TypeError
        ``path`` is not a path; ``layer`` is not an integer; ``query``, ``key``,
        ``value`` or ``layers`` hold a non-numeric dtype (the message starts with that
        name).
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        ``path`` is not an ``.npz`` archive; ``query``, ``key`` or ``value`` is missing,
        has neither 3 nor 4 dimensions, has an empty dimension or a NaN/inf entry;
        batch sizes, key/value lengths or query/key head dimensions disagree;
        ``key``/``value`` head counts differ or do not divide the query's; ``layers``
        has the wrong shape or repeats a layer; an entry holds pickled objects; ``layer``
        is not among the stored layers. The message starts with the offending name.

    References
    ----------
    ``plsh_ref/data/DATA_CARD.md`` (the shipped file); ``docs/experiments.md`` (part 2, real
    activations; ``plsh reproduce --qkv FILE``).

    Examples
    --------
    >>> from plsh_ref.data import load_qkv
    >>> qkv = load_qkv(layer=3)
    >>> qkv["query"].shape, qkv["query"].dtype
    ((1, 12, 512, 32), dtype('float64'))
    """
    if layer is not None:
        layer = check_int("layer", layer)
    if path is None:
        resource = importlib.resources.files(__name__).joinpath(SHIPPED_FILE)
        with importlib.resources.as_file(resource) as shipped:
            return _load(Path(shipped), layer)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: must be a str or os.PathLike, got {type(path).__name__}")
    return _load(Path(path), layer)


def _read_entries(path: Path) -> dict:
    """Read every entry of the archive at ``path`` (no pickles)."""
    if not path.is_file():
        raise FileNotFoundError(f"path: no such file: {path}")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"path: cannot read {path} as an .npz archive ({exc})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(
            f"path: {path} is a single .npy array, not an .npz archive with "
            f"'query', 'key' and 'value' (save with np.savez)"
        )
    entries = {}
    with archive:
        for name in archive.files:
            try:
                entries[name] = archive[name]
            except ValueError as exc:  # object arrays need pickle, which is refused
                raise ValueError(
                    f"{name}: entry of {path} cannot be loaded without pickle "
                    f"({exc}); store plain numeric or string arrays"
                ) from exc
            except (OSError, zipfile.BadZipFile, EOFError) as exc:
                raise ValueError(f"{name}: entry of {path} is corrupt ({exc})") from exc
    return entries


def _as_bhnd(name: str, arr: np.ndarray) -> np.ndarray:
    """Check one activation array and return it as float64 ``(B, H, n, d)``."""
    out = as_float_array(name, arr, ndim=(3, 4))
    if out.ndim == 3:
        out = out[np.newaxis]
    if min(out.shape) < 1:
        raise ValueError(f"{name}: every dimension must be >= 1, got shape {out.shape}")
    return np.ascontiguousarray(out)


def _load(path: Path, layer: int | None) -> dict:
    entries = _read_entries(path)
    missing = [k for k in _REQUIRED if k not in entries]
    if missing:
        raise ValueError(
            f"{missing[0]}: missing from {path}; a Q/K/V file needs arrays "
            f"'query', 'key' and 'value' (found: {sorted(entries)})"
        )
    query = _as_bhnd("query", entries.pop("query"))
    key = _as_bhnd("key", entries.pop("key"))
    value = _as_bhnd("value", entries.pop("value"))

    batch, num_heads, _, head_dim = query.shape
    for name, arr in (("key", key), ("value", value)):
        if arr.shape[0] != batch:
            raise ValueError(
                f"{name}: batch size {arr.shape[0]} differs from the query's "
                f"{batch} (shapes query {query.shape}, {name} {arr.shape})"
            )
    if value.shape[1] != key.shape[1]:
        raise ValueError(f"value: has {value.shape[1]} heads but key has {key.shape[1]}")
    if num_heads % key.shape[1] != 0:
        raise ValueError(
            f"key: {key.shape[1]} key/value heads do not divide the {num_heads} query heads"
        )
    if value.shape[2] != key.shape[2]:
        raise ValueError(
            f"value: sequence length {value.shape[2]} differs from the key's {key.shape[2]}"
        )
    if key.shape[3] != head_dim:
        raise ValueError(f"key: head_dim {key.shape[3]} differs from the query's {head_dim}")

    if "layers" in entries:
        raw = np.asarray(entries.pop("layers"))
        if raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.integer):
            raise TypeError(f"layers: must hold integers, got dtype {raw.dtype}")
        if raw.shape != (batch,):
            raise ValueError(
                f"layers: must have shape ({batch},) (one per batch entry), got {raw.shape}"
            )
        layers = raw.astype(np.int64)
        if np.unique(layers).size != batch:
            raise ValueError(f"layers: must be distinct, got {layers.tolist()}")
    else:
        layers = np.arange(batch, dtype=np.int64)

    if layer is not None:
        hits = np.flatnonzero(layers == layer)
        if hits.size == 0:
            raise ValueError(f"layer: {layer} is not among the stored layers {layers.tolist()}")
        sel = slice(int(hits[0]), int(hits[0]) + 1)
        query, key, value, layers = query[sel], key[sel], value[sel], layers[sel]

    result: dict[str, Any] = {
        "query": np.ascontiguousarray(query),
        "key": np.ascontiguousarray(key),
        "value": np.ascontiguousarray(value),
        "layers": layers,
    }
    for name, arr in entries.items():
        result[name] = arr.item() if arr.ndim == 0 else arr
    result["path"] = str(path)
    return result
