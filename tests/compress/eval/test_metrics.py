"""Tests for compress/eval/metrics.py: accuracy and F1, token-weighted perplexity, the class per head."""
import math

import pytest
import torch
import transformers
from transformers.modeling_outputs import CausalLMOutput, SequenceClassifierOutput

from compress.eval.metrics import ClassificationMetrics, PerplexityMetrics, metrics_for


def test_classification_metrics_binary_and_multiclass():
    binary = ClassificationMetrics(2)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 0.0]])  # predicts 0, 1, 1, 0
    binary.update(SequenceClassifierOutput(logits=logits), {"labels": torch.tensor([0, 1, 0, 1])})
    result = binary.compute()
    assert result["accuracy"] == pytest.approx(0.5)
    assert result["f1"] == pytest.approx(0.5)  # precision 1/2, recall 1/2 for class 1
    multi = ClassificationMetrics(3)
    multi.update(SequenceClassifierOutput(logits=torch.eye(3)), {"labels": torch.tensor([0, 1, 1])})
    assert multi.compute()["accuracy"] == pytest.approx(2 / 3)


def test_perplexity_weights_batches_by_predicted_tokens():
    metrics = PerplexityMetrics()
    first = {"labels": torch.zeros(1, 5, dtype=torch.long)}  # 4 predicted tokens
    second = {"labels": torch.tensor([[1, 2, -100, -100]])}  # 1 predicted token
    metrics.update(CausalLMOutput(loss=torch.tensor(1.0)), first)
    metrics.update(CausalLMOutput(loss=torch.tensor(3.0)), second)
    expected = (4 * 1.0 + 1 * 3.0) / 5
    assert metrics.compute()["perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)


def test_metrics_for_picks_the_head():
    bert = transformers.BertConfig(vocab_size=20, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, num_labels=4)
    llama = transformers.LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2)
    classifier = metrics_for(transformers.BertForSequenceClassification(bert))
    assert isinstance(classifier, ClassificationMetrics) and classifier.num_labels == 4
    assert isinstance(metrics_for(transformers.LlamaForCausalLM(llama)), PerplexityMetrics)
    with pytest.raises(ValueError, match="ForSequenceClassification"):
        metrics_for(torch.nn.Linear(2, 2))
