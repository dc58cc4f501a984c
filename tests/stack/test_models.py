"""End-to-end: real models compiled with backend="ember" match eager, with gradients."""

from __future__ import annotations

import pytest
import torch
from helpers import LastHiddenState, check_inference, check_training, gpt2
from torch import nn

from ember.runtime.models import MLP, TransformerBlock


class SmallCNN(nn.Module):
    """Conv + batch norm + ReLU twice, pooling, and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, stride=2),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class BagOfEmbeddings(nn.Module):
    """A text classifier without recurrence: embed, masked mean over tokens, MLP."""

    def __init__(self, vocab: int = 100, dim: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, classes))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != 0).unsqueeze(-1).float()
        pooled = (self.embed(tokens) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(self.norm(pooled)).log_softmax(-1)


def test_transformer_block_inference() -> None:
    check_inference(TransformerBlock(32, 4, 64), [torch.randn(2, 16, 32)])


def test_transformer_block_training() -> None:
    check_training(TransformerBlock(32, 4, 64), [torch.randn(2, 16, 32)])


def test_mlp_training() -> None:
    check_training(MLP(32, 64, 8), [torch.randn(16, 32)])


def test_cnn_with_batch_norm_eval() -> None:
    check_inference(SmallCNN(), [torch.randn(4, 3, 16, 16)], rtol=1e-4, atol=1e-5)


def test_cnn_with_batch_norm_training_updates_running_stats() -> None:
    check_training(SmallCNN(), [torch.randn(4, 3, 16, 16)])


def test_text_model_inference_and_training() -> None:
    tokens = torch.randint(0, 100, (6, 12))
    tokens[:, -3:] = 0  # padding
    check_inference(BagOfEmbeddings(), [tokens])
    check_training(BagOfEmbeddings(), [tokens], loss=lambda out: -out[:, 0].mean())


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_transformers_model_from_config(arch: str) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is in the models group")
    if arch == "bert":
        config = transformers.BertConfig(
            vocab_size=128,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        model = LastHiddenState(transformers.BertModel(config))
    else:
        model = gpt2(transformers, vocab=128, width=32)
    tokens = torch.randint(0, 128, (2, 16))

    check_inference(model, [tokens], rtol=1e-4, atol=1e-4)
    check_training(model, [tokens], rtol=1e-4, atol=1e-4, steps=1)
