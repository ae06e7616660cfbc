"""generate() with ``PLSHCache`` on a tiny random Llama: the decode steps run on each layer's
ring, and every layer's output stays within the a-priori bound ``PLSHCache.error_bound``
reports (Theorem 2.2 with the DKW eps of ``plsh_ref.bounds``) against exact ALiBi attention on
that layer's own query/key/value, at the bound's stated probability."""

import numpy as np
import pytest
from scipy.stats import binom

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import plsh_fast.hf as hf  # noqa: E402
from plsh_fast.decoding import DecodingErrorBound  # noqa: E402
from plsh_ref import draw_partition  # noqa: E402
from plsh_ref.attention import alibi_attention  # noqa: E402
from plsh_ref.bounds import max_norm_error_bound, output_error_bound  # noqa: E402
from plsh_ref.partition import derived_seed  # noqa: E402

VOCAB, LAYERS, HEADS = 101, 2, 4
S, DELTA, PROMPT, NEW = 16, 0.1, 16, 80
N = PROMPT + NEW - 1  # the last generated token is never fed back
# small scales, so that the caches evict (the bound covers the evicted keys too)
SIGMA = np.array([1.0, 2.0, 4.0, 8.0])
SLOPES = 1.0 / SIGMA


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=2, max_position_embeddings=4096)  # fmt: skip
    model = hf.set_alibi_attention(LlamaForCausalLM(cfg).eval().double(), "plsh", seed=0)
    return model


def _decode(model, seed, check_steps=False):
    """Greedy generate() with a PLSHCache on partitions drawn from ``seed``; per layer the
    queries, keys, values and outputs of every attention call, concatenated."""
    for layer, block in enumerate(model.model.layers):
        block.self_attn.plsh_partition = draw_partition(SIGMA, S, derived_seed(seed, layer))
    cache = hf.PLSHCache(model)
    calls = [[] for _ in range(LAYERS)]
    for index, layer in enumerate(cache.layers):

        def record(query, key, value, _attend=layer.attend, _calls=calls[index], _layer=layer,
                   **kwargs):  # fmt: skip
            out = _attend(query, key, value, **kwargs)
            _calls.append((query, key, value, out))
            if check_steps:  # the bound reported after every step is the theorem's
                seen = sum(c[0].shape[2] for c in _calls)
                eps = max_norm_error_bound(seen, S, DELTA / HEADS)
                assert _layer.error_bound(DELTA) == DecodingErrorBound(eps, DELTA, seen, S, HEADS)
            return out

        layer.attend = record
    ids = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        tokens = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                cache=cache)  # fmt: skip
    per_layer = [[torch.cat(t, dim=2).numpy() for t in zip(*c)] for c in calls]
    return cache, tokens, per_layer


@pytest.fixture(scope="module")
def model():
    # one thread: these tiny steps are dominated by thread hand-offs on a shared machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield _model()
    torch.set_num_threads(threads)


def _errors(per_layer):
    """Per layer: ``(|PLSH - exact ALiBi|, the a-priori bound)``, float64 ``(1, H, N, d)``."""
    result = []
    for q, k, v, out in per_layer:
        exact = alibi_attention(q, k, v, slopes=SLOPES, causal=True, return_lse=False)
        bound = output_error_bound(q, k, v, S, DELTA, slopes=SLOPES, causal=True)
        result.append((np.abs(out - exact), bound))
    return result


def test_decode_steps_run_on_the_ring_and_report_the_theorems_bound(model):
    cache, tokens, per_layer = _decode(model, seed=0, check_steps=True)
    assert tokens.shape == (1, PROMPT + NEW)
    for layer, (q, _, _, out) in zip(cache.layers, per_layer):
        assert q.shape == (1, HEADS, N, 16) and out.shape == q.shape
        assert layer.decoder.ring_steps == NEW - 1  # every decode step, none general
        assert layer.cached_tokens() <= layer.bound < N  # it evicted
    got = cache.error_bound(DELTA)
    assert (
        got
        == [DecodingErrorBound(max_norm_error_bound(N, S, DELTA / HEADS), DELTA, N, S, HEADS)]
        * LAYERS
    )


TRIALS = 8


def test_each_layers_error_stays_within_the_reported_bound_at_its_probability(model):
    """A trial fails if any output element of any layer exceeds its bound. Each layer's
    bound fails with probability at most DELTA (over its partition's draw, for all inputs
    at once: the earlier layers' partitions change its query/key/value, not the event), so a
    trial fails with probability at most LAYERS * DELTA; the failures are then dominated by
    Bin(TRIALS, LAYERS * DELTA), and exceeding its 1 - 1e-6 quantile has probability <= 1e-6."""
    failures = 0
    for trial in range(TRIALS):
        _, _, per_layer = _decode(model, seed=100 + trial)
        failures += any(bool((e > b + 1e-9).any()) for e, b in _errors(per_layer))
    assert failures <= binom.ppf(1 - 1e-6, TRIALS, LAYERS * DELTA)


def test_a_bound_shrunk_10_times_is_violated(model):
    """Negative control: the check above with the bound divided by 10 fails in every one of
    3 trials (measured on this model, 2026-12-02: the largest error over both layers
    reaches 0.11-0.20 of the bound in each of the 11 seeded trials here, 0.14-0.20 in these
    3), so the test above can fail."""
    for trial in range(3):
        _, _, per_layer = _decode(model, seed=200 + trial)
        errors = _errors(per_layer)
        assert any(bool((e > b / 10 + 1e-9).any()) for e, b in errors)
