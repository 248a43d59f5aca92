"""Recipes for the CLI tests: a tiny Bert on 64 digits with the compression callbacks a test asks for."""
import yaml

from compress.lightning.data import DigitsData

TINY_BERT = {
    "model_type": "bert", "vocab_size": DigitsData.VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 80, "type_vocab_size": 1,
}


def tiny_recipe(out_dir, callbacks, **compress_options):
    """A recipe for a tiny Bert on 64 digits: 4 optimizer steps per epoch, 2 epochs."""
    return {
        "seed_everything": 0,
        "model": {"class_path": "compress.lightning.tasks.SequenceClassificationTask",
                  "init_args": {"config": TINY_BERT, "num_labels": 10, "learning_rate": 1e-3}},
        "data": {"class_path": "compress.lightning.data.DigitsData",
                 "init_args": {"batch_size": 16, "max_train_samples": 64}},
        "trainer": {"max_epochs": 2, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False,
                    "enable_model_summary": False, "limit_val_batches": 2, "callbacks": callbacks},
        "compress": {"output_dir": str(out_dir), "eval_batch_sizes": [1, 2], "latency_warmup": 0,
                     "latency_repeats": 1, "max_eval_batches": 2, **compress_options},
    }


def write_recipe(path, recipe):
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def pruning(sparsity=0.5, start=0, end=4):
    return {"class_path": "compress.lightning.callbacks.BlockPruning",
            "init_args": {"sparsity": sparsity, "start_step": start, "end_step": end, "frequency": 2}}


def qat(config_class="W8A8Config", start=2, **config_args):
    return {"class_path": "compress.lightning.callbacks.QuantizationAware",
            "init_args": {"config": {"class_path": f"compress.configs.{config_class}", "init_args": config_args},
                          "start_step": start}}


def export(dirpath):
    return {"class_path": "compress.lightning.callbacks.Export", "init_args": {"dirpath": str(dirpath)}}
