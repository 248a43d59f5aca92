"""Tests for the callbacks on a tiny Mixtral: BlockPruning scores and masks every expert's layers (each
score kind, per-layer and global allocation), QuantizationAware fake-quantizes them, Export writes
QuantizedExperts that load back to the same output."""
import lightning.pytorch as pl
import pytest
import torch

import compress
from compress.configs import W8A8Config
from compress.core.sparsity import expand_mask, mask_sparsity
from compress.lightning.callbacks import BlockPruning, Export, QuantizationAware
from compress.nn.experts import ExpertLinear, QuantizedExperts
from compress.nn.qat import compressed_layers

transformers = pytest.importorskip("transformers")


class MixtralTask(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=128,
                                            num_local_experts=4, num_experts_per_tok=2)
        self.model = transformers.MixtralForCausalLM(config)

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch[0], labels=batch[0]).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _loader():
    ids = torch.randint(3, 128, (32, 8), generator=torch.Generator().manual_seed(1))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)


@pytest.mark.parametrize("score, allocation", [("magnitude", "layer"), ("movement", "layer"), ("fisher", "global")])
def test_experts_are_pruned_fake_quantized_and_exported(tmp_path, score, allocation):
    task = MixtralTask()
    seen = {}

    class Inspect(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            for name, layer in compressed_layers(pl_module.model).items():
                if isinstance(layer, ExpertLinear):
                    seen[name] = (layer.mask.clone(), layer.weight.detach().clone(), layer.fake_quant_enabled)

    callbacks = [BlockPruning(0.5, start_step=1, end_step=4, frequency=1, score=score, allocation=allocation),
                 QuantizationAware(W8A8Config()), Export(str(tmp_path / "export")), Inspect()]
    pl.Trainer(max_steps=6, callbacks=callbacks, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False).fit(task, _loader())
    assert len(seen) == 8  # 4 experts x (gate_up, down)
    shares = [mask_sparsity(mask) for mask, _, _ in seen.values()]
    if allocation == "layer":
        assert all(share == pytest.approx(0.5) for share in shares)
    else:
        assert 0 < min(shares) and max(shares) < 1
    for mask, weight, fake_quant in seen.values():
        assert fake_quant and (weight[~expand_mask(mask, tuple(weight.shape))] == 0).all()
    experts = task.model.model.layers[0].mlp.experts
    assert isinstance(experts, QuantizedExperts) and type(experts.down[0]).__name__ == "BSRW8A8Linear"
    loaded = compress.load_compressed(tmp_path / "export")
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, task.model.eval()(input_ids=ids).logits,
                                   atol=1e-6, rtol=1e-6)
