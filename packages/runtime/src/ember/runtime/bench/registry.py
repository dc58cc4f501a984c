"""The benchmark model registry: what `ember bench` measures, at which size, where.

Each `ModelSpec` builds a model with random weights (seeded; configs are written here
in code, nothing is downloaded) and its example inputs, at a "cpu" size (small enough
for a 2-core CI machine) or a "gpu" size (large enough for an H100 to be busy). `sets`
says which of the two default sets a model belongs to; any model can still be picked
by name with `--models` at either size. A model that needs a library (torchvision,
timm, transformers) names it in `requires`; the harness skips it, saying so, when the
library is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ember.runtime.bench.blocks import Attention, CNNBlock, LayerNormChain, SoftmaxChain
from ember.runtime.models import MLP, TransformerBlock

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[str], Built]  # size ("cpu" or "gpu") -> (model, inputs), float32, CPU
    sets: frozenset[str]
    requires: str | None = None
    about: str = ""

    def available(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1))


def _tokens(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def _pick(size: str, cpu: Any, gpu: Any) -> Any:
    return cpu if size == "cpu" else gpu


def _mlp(size: str) -> Built:
    dim, hidden, batch = _pick(size, (256, 1024, 64), (4096, 16384, 2048))
    return MLP(dim, hidden, dim), (_randn(batch, dim),)


def _transformer_block(size: str) -> Built:
    dim, heads, batch, seq = _pick(size, (128, 4, 4, 64), (1024, 16, 8, 1024))
    return TransformerBlock(dim, heads, 4 * dim), (_randn(batch, seq, dim),)


def _attention(size: str) -> Built:
    dim, heads, batch, seq = _pick(size, (128, 4, 4, 128), (1024, 16, 8, 2048))
    return Attention(dim, heads), (_randn(batch, seq, dim),)


def _softmax_chain(size: str) -> Built:
    shape = _pick(size, (8, 4, 128, 128), (16, 16, 1024, 1024))
    return SoftmaxChain(), (_randn(*shape),)


def _layernorm_chain(size: str) -> Built:
    rows, dim = _pick(size, (512, 512), (32768, 4096))
    return LayerNormChain(dim), (_randn(rows, dim),)


def _cnn_block(size: str) -> Built:
    batch, channels, hw = _pick(size, (4, 32, 32), (64, 128, 56))
    return CNNBlock(channels), (_randn(batch, channels, hw, hw),)


def _torchvision(arch: str, gpu_batch: int = 64, **kwargs: Any) -> Callable[[str], Built]:
    """A torchvision classifier by name; `kwargs` go to its constructor (a dropout of
    0, where it has one, so that a training step is deterministic and checkable)."""

    def build(size: str) -> Built:
        import torchvision

        batch, hw = _pick(size, (2, 64), (gpu_batch, 224))
        model = torchvision.models.get_model(arch, weights=None, **kwargs)
        return model, (_randn(batch, 3, hw, hw),)

    return build


def _timm(arch: str, cpu_hw: int) -> Callable[[str], Built]:
    def build(size: str) -> Built:
        import timm

        batch, hw = _pick(size, (2, cpu_hw), (64, 224))
        sized = {"img_size": hw} if arch.startswith("vit") else {}  # ViTs fix their grid
        model = timm.create_model(arch, pretrained=False, **sized)
        return model, (_randn(batch, 3, hw, hw),)

    return build


def _bert(size: str) -> Built:
    import transformers

    layers, hidden, heads, batch, seq = _pick(size, (2, 128, 4, 2, 64), (12, 768, 12, 16, 512))
    config = transformers.BertConfig(
        vocab_size=30522 if size == "gpu" else 1000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertModel(config), (_tokens(config.vocab_size, batch, seq),)


def _gpt2(size: str) -> Built:
    import transformers

    layers, hidden, heads, batch, seq = _pick(size, (2, 128, 4, 2, 64), (12, 768, 12, 8, 1024))
    config = transformers.GPT2Config(
        vocab_size=50257 if size == "gpu" else 1000,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        n_positions=max(seq, 128),
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
    )
    return transformers.GPT2LMHeadModel(config), (_tokens(config.vocab_size, batch, seq),)


def _llama_of(
    layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, batch: int, seq: int
) -> Callable[[str], Built]:
    """LlamaForCausalLM of the given GPU size; on the CPU always the same small one."""

    def build(size: str) -> Built:
        import transformers

        gpu = (layers, hidden, heads, kv_heads, intermediate, batch, seq)
        sized = _pick(size, (2, 128, 4, 1, 320, 2, 64), gpu)
        layers_, hidden_, heads_, kv_heads_, intermediate_, batch_, seq_ = sized
        config = transformers.LlamaConfig(
            vocab_size=32000 if size == "gpu" else 1000,
            hidden_size=hidden_,
            intermediate_size=intermediate_,
            num_hidden_layers=layers_,
            num_attention_heads=heads_,
            num_key_value_heads=kv_heads_,
            max_position_embeddings=seq_,
            use_cache=False,
        )
        model = transformers.LlamaForCausalLM(config)
        return model, (_tokens(config.vocab_size, batch_, seq_),)

    return build


def _t5_encoder(size: str) -> Built:
    """T5EncoderModel; on the GPU with t5-small's configuration (d_model 512, 6 layers,
    8 heads of 64, d_ff 2048, ReLU feed-forward, vocabulary 32128), written here."""
    import transformers

    layers, d_model, heads, d_ff, batch, seq = _pick(
        size, (2, 128, 4, 512, 2, 32), (6, 512, 8, 2048, 16, 128)
    )
    config = transformers.T5Config(
        vocab_size=32128 if size == "gpu" else 1000,
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=d_ff,
        num_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        feed_forward_proj="relu",
        is_encoder_decoder=False,
        use_cache=False,
    )
    return transformers.T5EncoderModel(config), (_tokens(config.vocab_size, batch, seq),)


_llama = _llama_of(8, 2048, 16, 4, 5440, 4, 2048)
_llama_small = _llama_of(4, 512, 8, 2, 1376, 4, 128)
_mobilenet = _torchvision("mobilenet_v3_large", 32, dropout=0.0)

BOTH, GPU = frozenset({"cpu", "gpu"}), frozenset({"gpu"})
CPU, NONE = frozenset({"cpu"}), frozenset[str]()
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("mlp", _mlp, BOTH, about="3 linear layers with SiLU"),
        ModelSpec("transformer_block", _transformer_block, BOTH, about="pre-norm, hand attention"),
        ModelSpec("attention", _attention, BOTH, about="causal SDPA self-attention"),
        ModelSpec("softmax_chain", _softmax_chain, BOTH, about="two softmaxes, memory-bound"),
        ModelSpec("layernorm_chain", _layernorm_chain, BOTH, about="4x residual + LN + GELU"),
        ModelSpec("cnn_block", _cnn_block, BOTH, about="ResNet basic block"),
        ModelSpec("resnet18", _torchvision("resnet18"), CPU, "torchvision", "64x64 images on CPU"),
        ModelSpec("resnet50", _torchvision("resnet50"), GPU, "torchvision", "batch 64, 224x224"),
        ModelSpec("vit_tiny", _timm("vit_tiny_patch16_224", 64), NONE, "timm", "by name only"),
        ModelSpec("vit_base", _timm("vit_base_patch16_224", 64), GPU, "timm", "batch 64, 224x224"),
        ModelSpec("convnext_tiny", _timm("convnext_tiny", 64), GPU, "timm", "batch 64, 224x224"),
        ModelSpec("bert", _bert, BOTH, "transformers", "BertModel; base size on GPU"),
        ModelSpec("gpt2", _gpt2, BOTH, "transformers", "GPT2LMHeadModel; 124M on GPU"),
        ModelSpec("llama", _llama, GPU, "transformers", "LlamaForCausalLM, 8 layers, GQA"),
        # launch-bound: many small kernels per call, where host time dominates
        ModelSpec("mobilenetv3", _mobilenet, GPU, "torchvision", "MobileNetV3-Large, batch 32"),
        ModelSpec("t5_small_encoder", _t5_encoder, GPU, "transformers", "t5-small size, batch 16"),
        ModelSpec("llama_small", _llama_small, GPU, "transformers", "4 layers x 512, batch 4"),
    )
}


def models_for(device: str) -> list[ModelSpec]:
    """The default set for a device type ('cpu' or 'cuda')."""
    key = "cpu" if device == "cpu" else "gpu"
    return [spec for spec in MODELS.values() if key in spec.sets]


def loss_input(output: Any) -> torch.Tensor:
    """The tensor a training step's loss is taken from, for any model's output."""
    if isinstance(output, torch.Tensor):
        return output
    for attr in ("logits", "last_hidden_state"):
        value = getattr(output, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, (tuple, list)) and output:
        return loss_input(output[0])
    raise TypeError(f"cannot find a tensor to take the loss of in a {type(output).__name__}")
