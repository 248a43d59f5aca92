"""scripts/teacher_text.py on the CPU: a tiny random Llama samples blocks from WikiText-2's training split."""
import pytest
import torch

from compress.lightning.data import LanguageModelingData
from compress.lightning.teacher_text import load_teacher_text, random_prompts
from scripts.teacher_text import main
from tests.compress.lightning.test_data import needs_wikitext
from tests.compress.lightning.test_teacher_text import tiny_llama


@needs_wikitext
def test_the_command_samples_from_the_training_split(tmp_path):
    model_dir = tmp_path / "teacher"
    tiny_llama(30522).save_pretrained(model_dir)
    out = tmp_path / "text.safetensors"
    tokenizer = LanguageModelingData().tokenizer_name
    main(["--model", str(model_dir), "--tokenizer", tokenizer, "--block-size", "16", "--blocks", "3",
          "--prompt-tokens", "4", "--out", str(out)])
    blocks, info = load_teacher_text(out, 16, tokenizer, 30522)
    assert blocks.shape == (3, 16) and info["prompt_tokens"] == 4 and info["model"] == str(model_dir)
    data = LanguageModelingData(tokenizer=tokenizer, block_size=16)
    data.setup("fit")
    train = torch.tensor(data.train_set["input_ids"])
    assert torch.equal(blocks[:, :4], random_prompts(train, 3, 4, seed=0))
    with pytest.raises(FileExistsError):
        main(["--model", str(model_dir), "--tokenizer", tokenizer, "--block-size", "16", "--blocks", "3",
              "--out", str(out)])
