"""The tokenizer interface over a locally built HF tokenizer and a locally trained sentencepiece model."""

import pytest
import sentencepiece
import tokenizers
import transformers

from grpo_jax.tokenizer import HFTokenizer, SentencePieceTokenizer, load

CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    words = ["<pad>", "<eos>", "<|end|>", "<|user|>", "<|assistant|>", "[UNK]", "what", "is", "two", "plus", "four", "?"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="[UNK]",
        additional_special_tokens=["<|end|>", "<|user|>", "<|assistant|>"],
    )
    fast.chat_template = CHAT
    path = tmp_path_factory.mktemp("hf_tok")
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sp")
    text = path / "corpus.txt"
    text.write_text("\n".join(f"the number {i} plus {i + 1} is {2 * i + 1}" for i in range(200)))
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(path / "tiny"), vocab_size=40, model_type="bpe",
        pad_id=0, unk_id=1, bos_id=2, eos_id=3,
    )
    return path / "tiny.model"


def test_hf_tokenizer(hf_dir):
    tok = load(hf_dir)
    assert isinstance(tok, HFTokenizer)
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 0, 12)
    ids = tok.encode("what is two plus four ?")
    assert ids == [6, 7, 8, 9, 10, 11]
    assert tok.decode(ids[:-1] + [tok.eos_id, tok.pad_id]) == "what is two plus four"
    prompt = tok.apply_chat_template([{"role": "user", "content": "what is two ?"}])
    assert prompt == "<|user|> what is two ? <|end|> <|assistant|> "
    assert tok.encode(prompt) == [3, 6, 7, 8, 11, 2, 4]


def test_sentencepiece_tokenizer(sp_model):
    tok = load(sp_model)
    assert isinstance(tok, SentencePieceTokenizer)
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (3, 0, 40)
    ids = tok.encode("the number 12 plus 13 is 25")
    assert tok.eos_id not in ids and 2 not in ids  # no special tokens added
    assert tok.encode("the number 12", continuation=True) == ids[:len(tok.encode("the number 12"))]
    assert tok.decode(ids) == "the number 12 plus 13 is 25"
    assert tok.apply_chat_template is None


def test_unknown_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load(tmp_path)


def test_hf_tokenizer_without_chat_template(hf_dir, tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    assert load(tmp_path).apply_chat_template is None


def _word_level(tmp, words, chat, post_processor=None, **special):
    """A HF tokenizer directory over whitespace-separated `words`, with a chat template."""
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    if post_processor is not None:
        tok.post_processor = post_processor
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", **special)
    fast.chat_template = chat
    fast.save_pretrained(tmp)
    return load(tmp)


def test_llama_style_tokenizer_keeps_its_bos(tmp_path):
    """Issue 13.9: Llama's tokenizer adds <|begin_of_text|> (its post-processor); plain prompts keep
    it (the old encode dropped it), and a chat template that writes BOS itself gets exactly one."""
    words = ["<|begin_of_text|>", "<|eot_id|>", "<|user|>", "<|assistant|>", "[UNK]", "what", "is", "two", "?"]
    bos = "<|begin_of_text|>"
    tok = _word_level(
        tmp_path, words, "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|eot_id|> "
        "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}",
        post_processor=tokenizers.processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 0)]),
        bos_token=bos, eos_token="<|eot_id|>",
    )
    assert tok.encode("what is two ?") == [0, 5, 6, 7, 8]
    prompt = tok.apply_chat_template([{"role": "user", "content": "what is two ?"}])
    assert prompt.startswith(bos)
    assert tok.encode(prompt) == [0, 2, 5, 6, 7, 8, 1, 3]  # one BOS, from the template
    assert tok.encode("two ?", continuation=True) == [7, 8]  # a completion target gains no BOS


def test_qwen_style_tokenizer_adds_nothing(tmp_path):
    """Qwen's tokenizer has no BOS: neither plain text nor a chat prompt gains a token."""
    words = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]", "user", "assistant", "what", "is", "two", "?"]
    tok = _word_level(
        tmp_path, words, "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}",
        eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )
    assert tok.encode("what is two ?") == [6, 7, 8, 9]
    prompt = tok.apply_chat_template([{"role": "user", "content": "what is two ?"}])
    assert tok.encode(prompt) == [1, 4, 6, 7, 8, 9, 2, 1, 5]
    assert tok.encode("two ?", continuation=True) == [8, 9]
