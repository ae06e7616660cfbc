"""Each transformers attention layer keeps the dense counts of its short calls in its own cache
(``plsh_fast.hf.prepare_layer`` gives it ``plsh_dense_cache``), as it keeps its CPU plans:
a model whose layers' counts together exceed one ``DENSE_CACHE_BYTES`` budget still hits them
all on a repeated call, and the logits served from the kept counts equal the first call's;
one cache shared by the layers (the negative control) misses in every layer. A new partition
empties the layer's cache."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import plsh_fast.dense as dense  # noqa: E402
import plsh_fast.hf as hf  # noqa: E402
from plsh_ref import alibi_slopes, draw_partition  # noqa: E402

VOCAB, LAYERS, HEADS, N = 101, 4, 4, 40  # 40 x 40 pairs: below the dense crossover
ENTRY = HEADS * N * N  # one layer's uint8 counts, batch 1


def _llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=2, max_position_embeddings=4096)  # fmt: skip
    return hf.set_alibi_attention(LlamaForCausalLM(cfg).eval(), "plsh", num_samples=4, seed=0)


def _layers(model):
    return [m for m in model.modules() if hasattr(m, "plsh_dense_cache")]


def _ids():
    return torch.randint(0, VOCAB, (1, N), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def one_entry_budget(monkeypatch):
    assert dense.below_crossover(N, N, torch.device("cpu"))
    monkeypatch.setattr(dense, "DENSE_CACHE_BYTES", ENTRY)  # holds one layer's counts


def test_layers_keep_their_counts_within_one_budget_each(one_entry_budget):
    model = _llama()
    layers = _layers(model)
    assert len(layers) == LAYERS and len({id(m.plsh_dense_cache) for m in layers}) == LAYERS
    shared = dense.active_dense_cache()
    before = (shared.hits, shared.misses)
    with torch.no_grad():
        logits = [model(_ids()).logits for _ in range(3)]  # kept from the second call on
    for m in layers:
        cache = m.plsh_dense_cache
        assert (cache.misses, cache.hits, cache.nbytes) == (2, 1, ENTRY)
    assert (shared.hits, shared.misses) == before  # the process-wide cache is not used
    assert torch.equal(logits[2], logits[0]) and torch.equal(logits[1], logits[0])


def test_negative_control_one_cache_shared_by_the_layers_misses(one_entry_budget):
    model = _llama()
    layers = _layers(model)
    shared = dense.DenseCountCache()
    for m in layers:
        m.plsh_dense_cache = shared
    with torch.no_grad():
        for _ in range(3):
            model(_ids())
    assert shared.hits == 0 and shared.misses == 3 * LAYERS


def test_a_new_partition_empties_the_layer_cache():
    model = _llama()
    layer = _layers(model)[0]
    with torch.no_grad():
        first = [model(_ids()).logits for _ in range(2)]
    assert len(layer.plsh_dense_cache) == 1
    old = layer.plsh_partition
    layer.plsh_partition = draw_partition(1.0 / alibi_slopes(HEADS), 4, 99)
    with torch.no_grad():
        again = model(_ids()).logits
    assert len(layer.plsh_dense_cache) == 0 and layer.plsh_dense_cache.hits == 0
    assert not torch.equal(again, first[1])  # the new partition's counts, not the kept ones
    layer.plsh_partition = old
