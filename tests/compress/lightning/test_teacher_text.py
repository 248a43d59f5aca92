"""Teacher-sampled training text: prompts, cached sampling, the file, and the data module appending it."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from compress.lightning.data import LanguageModelingData
from compress.lightning.teacher_text import (generate_teacher_text, load_teacher_text, random_prompts,
                                             sample_continuations, save_teacher_text)
from tests.compress.lightning.test_data import needs_wikitext


def tiny_llama(vocabulary: int = 64) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocabulary, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def test_prompts_are_slices_of_training_blocks_drawn_by_the_seed():
    blocks = torch.arange(5 * 16).reshape(5, 16)
    prompts = random_prompts(blocks, 50, 4, seed=3)
    assert prompts.shape == (50, 4) and prompts.dtype == torch.int64
    for prompt in prompts:  # consecutive tokens of one block
        row, offset = divmod(int(prompt[0]), 16)
        assert offset <= 12 and torch.equal(prompt, blocks[row, offset:offset + 4])
    assert torch.equal(prompts, random_prompts(blocks, 50, 4, seed=3))
    assert not torch.equal(prompts, random_prompts(blocks, 50, 4, seed=4))
    assert len({int(p[0]) // 16 for p in prompts}) > 1  # more than one block
    with pytest.raises(ValueError, match="prompt_tokens: expected 1 to 15"):
        random_prompts(blocks, 2, 16, seed=0)
    with pytest.raises(ValueError, match=r"expected training blocks of shape \(n > 0, block_size\), got \(0, 16\)"):
        random_prompts(blocks[:0], 2, 4, seed=0)


def test_sampling_with_the_cache_keeps_the_prompt_and_follows_the_model():
    model = tiny_llama()
    prompts = torch.randint(64, (3, 5), generator=torch.Generator().manual_seed(1))
    # a temperature near zero samples the most likely token: the model's own greedy decoding, uncached
    cold = sample_continuations(model, prompts, 12, temperature=1e-6)
    greedy = prompts
    for _ in range(7):
        greedy = torch.cat([greedy, model(input_ids=greedy).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cold, greedy)
    # at temperature 1 the samples follow the model's distribution (first sampled token, 4,000 draws)
    many = prompts[:1].expand(4000, -1)
    first = sample_continuations(model, many, 6, seed=0)[:, 5]
    expected = torch.softmax(model(input_ids=prompts[:1]).logits[0, -1], -1)
    observed = torch.bincount(first, minlength=64).float() / 4000
    assert float((observed - expected).abs().max()) < 0.03
    with pytest.raises(ValueError, match="temperature: expected a positive number"):
        sample_continuations(model, prompts, 12, temperature=0.0)
    with pytest.raises(ValueError, match="leaves nothing to sample"):
        sample_continuations(model, prompts, 5)


def test_generated_blocks_start_with_training_text_and_are_seeded():
    model = tiny_llama()
    train = torch.randint(64, (4, 10), generator=torch.Generator().manual_seed(2))
    blocks = generate_teacher_text(model, train, 5, prompt_tokens=3, batch_size=2, seed=7)
    assert blocks.shape == (5, 10) and model.training is False
    assert torch.equal(blocks, generate_teacher_text(model, train, 5, prompt_tokens=3, batch_size=2, seed=7))
    prompts = random_prompts(train, 5, 3, seed=7)
    assert torch.equal(blocks[:, :3], prompts)


def test_the_file_round_trips_and_refuses_what_does_not_fit(tmp_path):
    blocks = torch.randint(64, (3, 8))
    info = {"model": "m", "tokenizer": "tok", "block_size": 8}
    path = save_teacher_text(tmp_path / "text.safetensors", blocks, info)
    loaded, read_info = load_teacher_text(path, 8, "tok", 64)
    assert torch.equal(loaded, blocks) and read_info == info
    assert [p.name for p in tmp_path.iterdir()] == ["text.safetensors"]  # no temporary left
    with pytest.raises(FileExistsError, match="exists; expected a new path"):
        save_teacher_text(path, blocks, info)
    save_teacher_text(path, blocks[:1], info, overwrite=True)
    assert len(load_teacher_text(path, 8, "tok", 64)[0]) == 1
    with pytest.raises(ValueError,
                       match=r"expected input_ids of shape \(n, 16\) for blocks of 16 tokens, got \(1, 8\)"):
        load_teacher_text(path, 16, "tok", 64)
    with pytest.raises(ValueError, match="sampled with tokenizer 'tok', the data uses 'other'"):
        load_teacher_text(path, 8, "other", 64)
    with pytest.raises(ValueError, match=r"expected \[0, 4\) for the tokenizer's vocabulary"):
        load_teacher_text(path, 8, "tok", 4)
    from safetensors.torch import save_file
    save_file({"input_ids": blocks.int()}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="expected a file written by compress.lightning.teacher_text"):
        load_teacher_text(tmp_path / "plain.safetensors", 8, "tok", 64)


@needs_wikitext
def test_the_data_module_appends_teacher_blocks_to_training_only(tmp_path):
    plain = LanguageModelingData(block_size=32, max_train_blocks=6, max_eval_blocks=4)
    plain.setup("fit")
    vocabulary = 30522  # the default tokenizer's (all-MiniLM-L6-v2)
    sampled = torch.randint(vocabulary, (5, 32))
    path = save_teacher_text(tmp_path / "t.safetensors", sampled, {"model": "m", "tokenizer": plain.tokenizer_name})
    data = LanguageModelingData(block_size=32, max_train_blocks=6, max_eval_blocks=4, teacher_text=str(path))
    data.setup("fit")
    assert len(data.train_set) == 11 and len(data.eval_set) == len(plain.eval_set)
    assert data.train_set["input_ids"][:6] == plain.train_set["input_ids"]
    assert data.train_set["input_ids"][6:] == sampled.tolist() == data.train_set["labels"][6:]
    assert data.eval_set["input_ids"] == plain.eval_set["input_ids"]
    wrong = LanguageModelingData(block_size=16, max_train_blocks=6, teacher_text=str(path))
    with pytest.raises(ValueError, match=r"expected input_ids of shape \(n, 16\)"):
        wrong.setup("fit")
