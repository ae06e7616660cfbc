"""torch.compile(fullgraph=True) of a tiny HF Llama with a Pólya kernel per head.

``"plsh"`` reads the layers' partitions drawn from the kernels; ``"alibi"`` builds the
kernels' bias ``log k_h`` with torch operations (:func:`plsh_fast.nn.kernel_bias`). Both
trace to one graph with no break and give the eager losses (AOTAutograd-eager backend, as
in ``test_hf_compile.py``).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch._dynamo.backends.debugging import aot_eager  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import plsh_fast.hf as hf  # noqa: E402
from plsh_ref.kernels import Exponential, KerpleLog, KerplePower, Mixture  # noqa: E402

VOCAB = 101
KERNELS = (
    KerpleLog(0.7, 1 / 16),
    KerplePower(0.25, 0.5),
    Mixture([0.5, 0.5], [Exponential(4.0), KerpleLog(1.5, 0.1)]),
    Exponential(64.0),
)


class Counting:
    """A torch.compile backend that counts the graphs it is given (one per compile)."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return aot_eager(gm, example_inputs)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _llama(impl, kernels=KERNELS):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return hf.set_alibi_attention(LlamaForCausalLM(cfg), impl, seed=0, kernels=kernels)


@pytest.mark.parametrize("impl", ["plsh", "alibi"])
def test_training_steps_with_kernels_compile_fullgraph_and_match_eager(impl):
    losses = {}
    for mode in ("compiled", "eager"):
        model = _llama(impl).train()
        backend = Counting()
        step = (
            torch.compile(model, fullgraph=True, backend=backend) if mode == "compiled" else model
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[mode] = []
        for i in range(2):
            ids = torch.randint(0, VOCAB, (1, 48), generator=torch.Generator().manual_seed(i))
            loss = step(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[mode].append(loss.item())
        if mode == "compiled":
            assert backend.graphs == 1
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-5, atol=1e-6)
    assert losses["eager"][0] != losses["eager"][1]
    # negative control: the kernels matter (ALiBi gives another first loss)
    ids = torch.randint(0, VOCAB, (1, 48), generator=torch.Generator().manual_seed(0))
    plain = _llama(impl, kernels=None).train()
    assert abs(plain(input_ids=ids, labels=ids).loss.item() - losses["eager"][0]) > 1e-5


def test_alibi_with_config_kernels_but_no_prepared_layer_is_refused_under_compile():
    model = _llama("alibi")
    for _, module in hf._attention_modules(model):
        module.plsh_kernels = None  # as a model built from a config with plsh_kernels
    compiled = torch.compile(model, fullgraph=True, backend=Counting())
    with pytest.raises(Exception, match="config.plsh_kernels: this layer's kernels are not"):
        compiled(input_ids=torch.zeros(1, 8, dtype=torch.long))
