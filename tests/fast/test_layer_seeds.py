"""Per-layer partitions (SPEC section 5): layers built without a seed differ, one seed
reproduces all of them (torch.manual_seed before building, or nn.seed_layers after)."""

import pytest

torch = pytest.importorskip("torch")

from plsh_fast.nn import PLSHAttention, PLSHSelfAttention, seed_layers  # noqa: E402
from plsh_ref.partition import derived_seed, draw_partition  # noqa: E402


def _model(layers=3):
    return torch.nn.Sequential(*(PLSHSelfAttention(16, 4, num_samples=5) for _ in range(layers)))


def _partitions(model):
    return [
        (m.seed, m.pitch.clone(), m.offset.clone())
        for m in model.modules()
        if isinstance(m, PLSHAttention)
    ]


def test_layers_built_without_a_seed_draw_distinct_partitions():
    parts = _partitions(_model())
    for i in range(len(parts)):
        for j in range(i):
            assert parts[i][0] != parts[j][0]
            assert not torch.equal(parts[i][1], parts[j][1])


def test_torch_manual_seed_reproduces_every_layer_like_the_weights():
    torch.manual_seed(123)
    a = _model()
    torch.manual_seed(123)
    b = _model()
    for (sa, pa, oa), (sb, pb, ob) in zip(_partitions(a), _partitions(b)):
        assert sa == sb and torch.equal(pa, pb) and torch.equal(oa, ob)
    torch.manual_seed(124)  # negative control: another global seed, other partitions
    c = _model()
    assert all(x[0] != y[0] for x, y in zip(_partitions(a), _partitions(c)))


def test_seed_layers_reproduces_all_layers_whatever_the_rng_state():
    torch.manual_seed(1)
    a = _model()
    torch.manual_seed(2)
    b = _model()
    seeds = seed_layers(a, 7)
    assert seed_layers(b, 7) == seeds == [derived_seed(7, layer) for layer in range(3)]
    for layer, ((sa, pa, oa), (sb, pb, ob)) in enumerate(zip(_partitions(a), _partitions(b))):
        assert sa == sb == seeds[layer]
        assert torch.equal(pa, pb) and torch.equal(oa, ob)
        expected = draw_partition(a[layer].attention.sigma, 5, seeds[layer])
        assert torch.equal(pa, torch.tensor(expected.pitch))
    assert len(set(seeds)) == 3
    # the training stream restarts from the new seed
    core = a[0].attention.train()
    core.num_draws = 4
    seed_layers(a, 7)
    assert core.num_draws == 0
    x = torch.randn(1, 8, 16)
    a(x)
    assert core.num_draws == 1


def test_seed_layers_bad_input():
    with pytest.raises(TypeError, match="^model:"):
        seed_layers("model", 0)
    with pytest.raises(ValueError, match="^seed:"):
        seed_layers(_model(1), -1)
