"""Each transformers attention layer keeps its CPU plans in its own cache
(``plsh_fast.hf.prepare_layer`` gives it ``plsh_plan_cache``), as ``plsh_fast.nn`` layers do:
a model whose layers' plans together exceed one ``PLAN_CACHE_BYTES`` budget still hits them
all on a repeated call; one cache shared by the layers (the negative control) misses."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import plsh_fast.hf as hf  # noqa: E402
from plsh_fast import cpu  # noqa: E402

VOCAB, LAYERS, N = 101, 4, 288  # 288 x 288 pairs: above the dense crossover, the CPU path


@pytest.fixture
def plans(monkeypatch):
    """Counts of ``_planning.make_plan`` calls (a plan made, not found kept)."""
    calls = {"plan": 0}
    real = cpu._planning.make_plan

    def counted(*args):
        calls["plan"] += 1
        return real(*args)

    monkeypatch.setattr(cpu._planning, "make_plan", counted)
    return calls


def _llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096)  # fmt: skip
    return hf.set_alibi_attention(LlamaForCausalLM(cfg).eval(), "plsh", num_samples=4, seed=0)


def _bloom():
    torch.manual_seed(0)
    cfg = BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=LAYERS, n_head=4)
    return hf.swap_bloom_attention(BloomForCausalLM(cfg).eval(), "plsh", num_samples=4, seed=0)


def _attention(model):
    return [m for m in model.modules() if hasattr(m, "plsh_plan_cache")]


@pytest.mark.parametrize("make", [_llama, _bloom], ids=["llama", "bloom"])
def test_layers_keep_their_plans_within_one_budget_each(make, plans, monkeypatch):
    model = make()
    layers = _attention(model)
    assert len(layers) == LAYERS and len({id(m.plsh_plan_cache) for m in layers}) == LAYERS
    ids = torch.randint(0, VOCAB, (1, N), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids)
        model(ids)  # kept from the second call on
        sizes = [m.plsh_plan_cache.nbytes for m in layers]
        assert min(sizes) > 0 and cpu.kept_plan_bytes() == 0  # none in the process-wide cache
        # a budget that holds the largest layer's plan, but not two of them
        budget = max(sizes) + min(sizes) // 2
        assert budget < sum(sizes)
        monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", budget)
        for m in layers:
            m.plsh_plan_cache.clear()
        first = model(ids).logits
        model(ids)
        plans["plan"] = 0
        again = model(ids).logits
        assert plans["plan"] == 0  # every layer found its plan
        assert torch.equal(first, again)
        assert all(len(m.plsh_plan_cache) == 1 for m in layers)
        # negative control: the same layers sharing one cache evict each other's plans
        shared = cpu.PlanCache()
        for m in layers:
            m.plsh_plan_cache = shared
        model(ids)
        model(ids)
        plans["plan"] = 0
        model(ids)
        assert plans["plan"] == LAYERS  # every layer planned again
        assert len(shared) == 1


def test_a_new_partition_empties_the_layers_plans():
    model = _llama()
    module = model.model.layers[0].self_attn
    ids = torch.randint(0, VOCAB, (1, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
        model(ids)
    cache = module.plsh_plan_cache
    assert len(cache) == 1
    hf.set_alibi_attention(model, "plsh", num_samples=4, seed=1)  # new partitions
    assert module.plsh_plan_cache is cache and len(cache) == 0
