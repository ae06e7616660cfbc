"""torch.compile of HF models with attn_implementation "plsh" / "alibi" (tiny random configs).

One graph: Dynamo traces Llama, Qwen3 (GQA) and BLOOM to a single graph with no break
(``fullgraph=True``), for a training step and for ``generate()``; sequence lengths from 128
to 4096 under ``dynamic=True`` reuse the graph (one more graph only where the length crosses
``plsh_fast.dense.DENSE_CROSSOVER``, whose side is a shape guard); nothing in the trace
touches a NumPy array. The compiles use Dynamo with the eager or AOTAutograd-eager backend
(what is tested is the trace, not Inductor's code), which keeps each test to seconds.
"""

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch._dynamo.backends.debugging import aot_eager  # noqa: E402
from transformers import (  # noqa: E402
    BloomConfig,
    BloomForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import plsh_fast.dense as dense  # noqa: E402
import plsh_fast.hf as hf  # noqa: E402

VOCAB = 101
NUMPY_WARNING = "The given NumPy array is not writable"


class Counting:
    """A torch.compile backend that counts the graphs it is given (one per compile)."""

    def __init__(self, inner=None):
        self.graphs = 0
        self.inner = inner

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward if self.inner is None else self.inner(gm, example_inputs)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192)  # fmt: skip
    return LlamaForCausalLM(cfg)


def _qwen3():
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=8192)  # fmt: skip
    return Qwen3ForCausalLM(cfg)


def _bloom():
    torch.manual_seed(2)
    return BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4))


def _set_up(make, impl):
    model = make()
    if make is _bloom:
        return hf.swap_bloom_attention(model, impl, seed=0)
    return hf.set_alibi_attention(model, impl, seed=0)


def _ids(n, seed=0):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def test_default_compile_of_llama_plsh_is_one_graph_without_numpy_warnings():
    """Without ``fullgraph`` too (it once made 15 graphs: the plans output of data-dependent
    length, the partition comparison, NumPy in the trace). The NumPy warning is printed once
    per process by torch, so this catches it only if nothing earlier triggered it."""
    model = _set_up(_llama, "plsh").train()
    ids = _ids(40)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=NUMPY_WARNING)
        explained = torch._dynamo.explain(model)(input_ids=ids, labels=ids)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize(
    "make,impl,inner",
    [
        (_llama, "plsh", aot_eager),  # AOTAutograd: the backward through plsh::attention too
        (_qwen3, "plsh", None),
        (_bloom, "plsh", None),
        (_llama, "alibi", None),
        (_qwen3, "alibi", None),
        (_bloom, "alibi", None),
    ],
    ids=["llama-plsh", "qwen3-plsh", "bloom-plsh", "llama-alibi", "qwen3-alibi", "bloom-alibi"],
)
def test_training_steps_compile_fullgraph_and_match_eager(make, impl, inner):
    """Two AdamW steps, compiled with ``fullgraph=True`` against eager from the same weights;
    the losses agree to float32 rounding and the second differs from the first."""
    losses = {}
    for mode in ("compiled", "eager"):
        model = _set_up(make, impl).train()
        backend = Counting(inner)
        step = (
            torch.compile(model, fullgraph=True, backend=backend) if mode == "compiled" else model
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[mode] = []
        for i in range(2):
            ids = _ids(48, seed=i)
            loss = step(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[mode].append(loss.item())
        if mode == "compiled":
            assert backend.graphs == 1
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-5, atol=1e-6)
    assert losses["eager"][0] != losses["eager"][1]  # the step did change the model


def test_lengths_128_to_4096_compile_once_per_side_of_the_crossover():
    """Eight lengths under ``dynamic=True``: one graph below the dense crossover and one above
    (the dispatch is a shape guard), never one per length, and no recompile-limit warning."""
    model = _set_up(_llama, "plsh").eval()
    backend = Counting()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    limit = dense.DENSE_CROSSOVER["cpu"]
    lengths = (128, 200, 333, 512, 1500, 2048, 3000, 4096)
    assert min(lengths) <= limit < max(lengths)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in lengths:
            compiled(input_ids=_ids(n, seed=n))
    assert backend.graphs == 2
    assert not [w for w in caught if "recompile" in str(w.message).lower()]


@pytest.mark.parametrize(
    "make,impl", [(_qwen3, "plsh"), (_bloom, "alibi")], ids=["qwen3-plsh", "bloom-alibi"]
)
def test_generate_with_a_compiled_forward_gives_the_eager_tokens(make, impl):
    """``generate()`` (DynamicCache, left-padded batch) through a ``fullgraph`` forward:
    prefill and decode steps trace without a break and give the eager tokens."""
    model = _set_up(make, impl).eval()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    eager = model.generate(ids, **kwargs)
    backend = Counting()
    model.forward = torch.compile(model.forward, fullgraph=True, dynamic=True, backend=backend)
    compiled = model.generate(ids, **kwargs)
    assert torch.equal(compiled, eager)
    assert 1 <= backend.graphs <= 2  # prefill and decode step (no per-step recompiles)


def test_an_unprepared_model_is_refused_while_tracing_with_the_fix_in_the_message():
    model = _llama()
    model.set_attn_implementation("plsh")  # no set_alibi_attention: no prepared partitions
    compiled = torch.compile(model, fullgraph=True, backend=Counting())
    with pytest.raises(Exception, match="set_alibi_attention"):
        compiled(input_ids=_ids(16))
    model(input_ids=_ids(16))  # one eager forward prepares every layer ...
    torch._dynamo.reset()
    compiled(input_ids=_ids(16))  # ... and then it traces
