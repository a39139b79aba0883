"""A tiny random Llama target with its own byte-level BPE tokenizer and chat template (capture tests)."""

from __future__ import annotations

import json

CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant: {% endif %}")


def make_target_with_tokenizer(path: str, *, layers: int = 4, hidden: int = 64, seed: int = 0) -> str:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from eaglekit.upgrade.capture import calibration_text

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


def write_prompts(path: str, count: int = 12) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(count):
            body = f"def area_{i}(r):\n    return 3.14159 * r * r + {i}\n" * (1 + i % 3)
            fh.write(json.dumps({"prompt": f"Explain this code:\n{body}"}) + "\n")
    return path
