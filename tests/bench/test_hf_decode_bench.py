"""benchmarks/hf_bench.py and benchmarks/decode_bench.py at tiny sizes (seconds): the scripts
run end to end, write their tables, and what they report is consistent with what they ran."""

from __future__ import annotations

import importlib.util
import json
import sys

import _paths
import pytest
import torch

pytest.importorskip("transformers")

ROOT = _paths.ROOT


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dynamo looks functions' modules up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hf_bench():
    return _load("hf_bench")


@pytest.fixture(scope="module")
def decode_bench():
    return _load("decode_bench")


def test_train_part_runs_every_variant(hf_bench, tmp_path):
    # backend "eager": Dynamo traces the step with fullgraph=True (a graph break would
    # raise) without Inductor's compile, so the test takes seconds.
    stem = tmp_path / "train"
    argv = ["--threads", "1", "--hidden", "16", "--out", str(stem), "train", "--n", "48",
            "--repeats", "2", "--compile-backend", "eager"]  # fmt: skip
    result = hf_bench.main(argv)
    (row,) = result["rows"]
    for variant in hf_bench.VARIANTS:
        assert len(row[f"{variant}_all_ms"]) == 2
        assert row[f"{variant}_ms"] > 0 and row[f"{variant}_first_s"] > 0
    ratios = [p / a for p, a in zip(row["plsh_all_ms"], row["alibi_all_ms"])]
    assert row["plsh_over_alibi"] == pytest.approx(sum(ratios) / 2)  # median of two rounds
    on_disk = json.loads(stem.with_suffix(".json").read_text())
    assert on_disk["rows"][0]["n"] == 48
    md = stem.with_suffix(".md").read_text()
    assert "| 48 |" in md and "plsh / alibi" in md and "then 2 untimed rounds" in md


def test_tiny_llama_variants_share_weights_and_differ_in_attention(hf_bench):
    models = {v: hf_bench.tiny_llama(v, hidden=16) for v in hf_bench.VARIANTS}
    emb = [m.model.embed_tokens.weight for m in models.values()]
    assert all(torch.equal(emb[0], e) for e in emb[1:])
    impls = {v: m.config._attn_implementation for v, m in models.items()}
    assert impls == {"plsh": "plsh", "alibi": "alibi", "sdpa": "sdpa"}
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = {v: m(ids).logits for v, m in models.items()}
    # negative control: the attention really differs (else the comparison is void)
    assert not torch.allclose(logits["plsh"], logits["alibi"])
    assert not torch.allclose(logits["alibi"], logits["sdpa"])
    with pytest.raises(ValueError, match="^variant"):
        hf_bench.tiny_llama("flash")


def test_generate_part_reports_both_caches(hf_bench, tmp_path):
    stem = tmp_path / "gen"
    argv = ["--threads", "1", "--hidden", "16", "--out", str(stem), "generate",
            "--prompt", "40", "--new-tokens", "5", "--repeats", "1"]  # fmt: skip
    (row,) = hf_bench.main(argv)["rows"]
    assert row["same_tokens"] is True  # PLSHCache is exact: greedy tokens equal DynamicCache's
    for cache in ("plsh_cache", "dynamic_cache"):
        assert row[f"{cache}_prefill_s"] > 0 and row[f"{cache}_decode_tokens_per_s"] > 0
    # 40 + 5 tokens fit in the bound: nothing evicted yet, both caches hold the same bytes
    assert row["plsh_cache_mb"] == pytest.approx(row["dynamic_cache_mb"])
    assert "| 40 |" in stem.with_suffix(".md").read_text()


def test_stamps_time_every_generated_token(hf_bench):
    from transformers import DynamicCache

    model = hf_bench.tiny_llama("plsh", hidden=16).eval()
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    run = hf_bench._generate_once(model, ids, DynamicCache(), 6)
    assert len(run["tokens"]) == 6
    # the rate is over the 5 tokens after the first: finite and positive
    assert 0 < run["decode_tokens_per_s"] < float("inf")


def test_decode_bench_without_full_peer_and_profile(decode_bench, tmp_path):
    argv = ["--context", "300", "1500", "--batch", "1", "--num-heads", "2", "--steps", "3",
            "--prefill-tail", "64", "--full-max-context", "400", "--profile",
            "--out", str(tmp_path)]  # fmt: skip
    assert decode_bench.main(argv) == 0
    (path,) = tmp_path.glob("decode_*.json")
    rows = json.loads(path.read_text())["rows"]
    short, long = rows
    assert short["alibi_full_tokens_per_s"] > 0  # context <= --full-max-context: measured
    assert long["alibi_full_tokens_per_s"] is None  # above it: not measured
    for r in rows:
        assert r["plsh_cached_at_end"] <= r["bound"]
        assert r["plsh_over_window"] == pytest.approx(
            r["plsh_tokens_per_s"] / r["alibi_window_tokens_per_s"]
        )
        pieces = r["step_pieces_us"]
        # every wrapped piece ran inside the step it belongs to
        for piece in ("argument checks", "finiteness check", "ring plan", "ring attend"):
            assert 0 < pieces[f"plsh: {piece}"] < pieces["plsh: whole step"]
        assert pieces["plsh: SDPA"] < pieces["plsh: ring attend"]
        assert "window: ring attend" not in pieces and pieces["window: SDPA"] > 0
    md = path.with_suffix(".md").read_text()
    assert "not measured" in md and "Step pieces" in md and "--full-max-context 400" in md
    # the wrappers are gone afterwards
    from plsh_fast import decoding

    assert decoding._StepRing.attend.__qualname__ == "_StepRing.attend"
    assert not hasattr(decoding._StepRing.attend, "__wrapped__")


def test_decode_bench_tail_prefill_matches_full_prefill(decode_bench):
    # The keys drawn from the prefill tail on (origin > 0) give the same cache as a
    # prefill of the whole context: the bench's shortcut is exact.
    from plsh_fast.decoding import PLSHDecodingCache, cache_bound
    from plsh_ref import alibi_slopes, draw_partition

    part = draw_partition(1.0 / alibi_slopes(2), 4, seed=0)
    tail = max(64, cache_bound(part))
    n = tail + 300
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n + 1, 8, generator=g, dtype=torch.float64) for _ in range(3))
    full, short = PLSHDecodingCache(part), PLSHDecodingCache(part)
    full.update(q[:, :, :n], k[:, :, :n], v[:, :, :n])
    a = n - tail
    short.update(q[:, :, a:n], k[:, :, a:n], v[:, :, a:n], query_positions=torch.arange(a, n))
    step = (q[:, :, n:], k[:, :, n:], v[:, :, n:])
    assert torch.equal(full.cached_positions(0), short.cached_positions(0))
    torch.testing.assert_close(full.update(*step), short.update(*step), rtol=0, atol=0)


def test_too_short_prefill_tail_changes_the_cache():
    # Negative control for the test above: a tail shorter than the reach loses live keys.
    from plsh_fast.decoding import PLSHDecodingCache, cache_bound
    from plsh_ref import alibi_slopes, draw_partition

    part = draw_partition(1.0 / alibi_slopes(2), 4, seed=0)
    n, tail = cache_bound(part) + 300, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
    full, short = PLSHDecodingCache(part), PLSHDecodingCache(part)
    full.update(q, k, v)
    a = n - tail
    short.update(q[:, :, a:], k[:, :, a:], v[:, :, a:], query_positions=torch.arange(a, n))
    assert full.cached_positions(0).numel() > short.cached_positions(0).numel()
