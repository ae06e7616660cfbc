"""Fine-tune a tiny random Hugging Face model with PLSH attention (plsh_fast.hf).

What it shows: importing ``plsh_fast.hf`` registers ``attn_implementation="plsh"`` with
transformers. ``set_alibi_attention(model, "plsh", ...)`` draws every layer's partition
sample from one seed, removes the rotary embedding (ALiBi/PLSH carry the positions) and
switches the model to PLSH attention; the model then trains as usual (the PLSH kernels
are differentiable). The script builds a tiny Llama from a config (random weights, no
download), trains it a few steps on a periodic token sequence, checks that the loss went
down, and generates with the bounded ``PLSHCache``.

Needs the ``hf`` extra (transformers 5). Run::

    python examples/finetune_hf.py                 # 200 steps, sequences of 128 tokens
    PLSH_EXAMPLE_TINY=1 python examples/finetune_hf.py   # 15 steps of 32 tokens (what CI runs)
"""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import plsh_fast.hf as plsh_hf

TINY = os.environ.get("PLSH_EXAMPLE_TINY") == "1"
VOCAB = 64


def batches(steps: int, batch: int, seq_len: int, generator: torch.Generator):
    """Sequences ``start, start + 1, ...`` modulo ``VOCAB``: next-token prediction learns them."""
    for _ in range(steps):
        start = torch.randint(VOCAB, (batch, 1), generator=generator)
        yield (start + torch.arange(seq_len)) % VOCAB


def main() -> None:
    steps, seq_len = (15, 32) if TINY else (200, 128)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="plsh")
    # one seed -> one partition per layer; RoPE removed in every layer (NoPE + PLSH)
    plsh_hf.set_alibi_attention(model, "plsh", num_samples=8, seed=0)
    print("attention implementation:", model.config._attn_implementation)

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for step, ids in enumerate(batches(steps, 8, seq_len, torch.Generator().manual_seed(0))):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            print(f"step {step:4d}: loss {losses[-1]:.3f}")
    # the first and last few steps, averaged: the loss of this easy task must fall
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first, (first, last)

    model.eval()
    prompt = torch.arange(10).unsqueeze(0)
    cache = plsh_hf.PLSHCache(model)
    with torch.no_grad():
        generated = model.generate(prompt, max_new_tokens=8, do_sample=False, cache=cache)
    print("prompt + generated:", generated[0].tolist())
    print("keys cached per layer now:", cache.max_cached_tokens(), "bounds:", cache.bounds())


if __name__ == "__main__":
    main()
