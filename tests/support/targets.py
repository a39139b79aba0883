"""Tiny real targets: random Llamas saved as Hugging Face checkpoints, and a target GGUF with geometry only."""

from __future__ import annotations

CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant: {% endif %}")

# token-id prompts for make_tiny_target's 256-token vocabulary
PROMPTS = ([5, 17, 99, 3, 42, 8, 120], [7, 7, 200, 31])


def make_tiny_target(path, *, layers=4, hidden=64, vocab=256, tied=False, seed=0, tokenizer_from=None) -> str:
    """A real, randomly initialised LlamaForCausalLM saved as safetensors; a tokenizer only if `tokenizer_from`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=256, tie_word_embeddings=tied,
        rms_norm_eps=1e-5,
    )
    model = transformers.LlamaForCausalLM(config)
    # random norm weights make a pre-norm/post-norm mix-up visible
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    if tokenizer_from is not None:
        transformers.AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(path)
    return str(path)


def make_target_with_tokenizer(path: str, *, layers: int = 4, hidden: int = 64, seed: int = 0) -> str:
    """A tiny random Llama with its own byte-level BPE tokenizer (384 tokens) and chat template."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from eaglekit.capture.plan import calibration_text

    text, _ = calibration_text(None)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=384, special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      max_position_embeddings=512, eos_token_id=2, bos_token_id=1)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.5, 1.5)  # a pre-norm / post-norm mix-up shows
    model.save_pretrained(path)
    return path


def tiny_target_gguf(path: str, layers: int = 12, hidden: int = 64, vocab: int = 256) -> str:
    """A target GGUF with what a draft conversion reads: geometry and a tokenizer (no weights needed)."""
    import gguf

    from eaglekit.io.gguf import GgufField, write_gguf

    V = gguf.GGUFValueType
    fields = [GgufField("llama.block_count", layers, V.UINT32), GgufField("llama.embedding_length", hidden, V.UINT32),
              GgufField("llama.context_length", 2048, V.UINT32), GgufField("tokenizer.ggml.model", "gpt2", V.STRING),
              GgufField("tokenizer.ggml.tokens", [f"t{i}" for i in range(vocab)], V.ARRAY, V.STRING),
              GgufField("tokenizer.ggml.token_type", [1] * vocab, V.ARRAY, V.INT32),
              GgufField("tokenizer.ggml.eos_token_id", 2, V.UINT32)]
    write_gguf(path, "llama", fields, [])
    return path
