"""The target's parts a store's reader needs, read tensor by tensor from its safetensors (never the decoder).

A store holds id L, the last decoder layer's output before the final norm; the target's greedy token at each
position is argmax(lm_head · final_norm(id L)). So a run that trains or calibrates from a store needs the target's
config, tokenizer, embeddings, final norm and lm_head only: a folder holding just those serves as the target.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglekit.io.jsonfile import load_json_object
from eaglekit.target import TargetInfo, head_names

if TYPE_CHECKING:
    import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "special_tokens_map.json")
LABEL_ROWS = 1024  # rows per lm_head product: bounds the [rows, V] logits in memory


def folder_of(info: TargetInfo) -> str:
    return os.path.dirname(os.path.abspath(info.path))


def sha256_of_files(folder: str, names: tuple[str, ...]) -> str | None:
    """SHA-256 over the named files that exist (name and bytes); None when there is none."""
    digest, found = hashlib.sha256(), False
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            found = True
            with open(path, "rb") as fh:
                digest.update(name.encode() + b"\0" + fh.read() + b"\0")
    return "sha256:" + digest.hexdigest() if found else None


def config_digest(info: TargetInfo) -> str:
    with open(info.path, "rb") as fh:
        return "sha256:" + hashlib.sha256(fh.read()).hexdigest()


@dataclass
class TargetHead:
    """Embeddings, final norm and lm_head of a target, float32, with the norm as the target computes it."""

    embed_tokens: Any  # [V, H]
    norm_weight: Any  # [H]
    lm_head: Any  # [V, H]
    eps: float
    unit_offset: bool  # Gemma's norm multiplies by (1 + weight)

    def final_norm(self, states: torch.Tensor) -> torch.Tensor:
        """The target's final RMSNorm of float32 states (float32 math, as transformers' Llama norm computes it)."""
        import torch

        x = states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * ((1.0 + self.norm_weight) if self.unit_offset else self.norm_weight)

    def greedy(self, last: torch.Tensor) -> torch.Tensor:
        """The target's greedy token [n] after each of the states id L [n, H]."""
        import torch

        out = []
        for start in range(0, last.shape[0], LABEL_ROWS):
            rows = self.final_norm(last[start : start + LABEL_ROWS].to(self.lm_head.device))
            out.append((rows @ self.lm_head.T).argmax(-1).to("cpu", torch.long))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)

    def top_k(self, last: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's k most likely next tokens [n, k] after each state id L [n, H] and their probabilities
        [n, k] (float32, softmax over the whole vocabulary): the teacher's distribution, cut to its top k."""
        import torch

        ids, probs = [], []
        for start in range(0, last.shape[0], LABEL_ROWS):
            rows = self.final_norm(last[start : start + LABEL_ROWS].to(self.lm_head.device))
            top = torch.softmax((rows @ self.lm_head.T).float(), dim=-1).topk(k, dim=-1)
            ids.append(top.indices.to("cpu", torch.long))
            probs.append(top.values.to("cpu", torch.float32))
        if not ids:
            return torch.zeros((0, k), dtype=torch.long), torch.zeros((0, k), dtype=torch.float32)
        return torch.cat(ids), torch.cat(probs)


def load_head(info: TargetInfo, device: str = "cpu") -> TargetHead:
    """Read embeddings, final norm and lm_head straight from the target's files (only those tensors' bytes)."""
    import torch
    from safetensors import safe_open

    folder = folder_of(info)
    tensors = {}
    for role, (rel, entry) in head_names(info).items():
        with safe_open(os.path.join(folder, rel), "pt") as fh:
            tensors[role] = fh.get_tensor(entry.name).to(device, torch.float32)
    config = load_json_object(info.path, "target config")
    text: dict[str, Any] = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    eps = text.get("rms_norm_eps", text.get("layer_norm_eps", 1e-6))
    return TargetHead(tensors["embed"], tensors["norm"], tensors["lm_head"], float(eps),
                      unit_offset=str(info.model_type or "").startswith("gemma"))


def tokenizer_identity(info: TargetInfo) -> dict[str, str | None]:
    """SHA-256 of the tokenizer files and of the chat template (inline in tokenizer_config.json or a jinja file)."""
    folder = folder_of(info)
    template = None
    config_path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config_path):
        template = load_json_object(config_path, "tokenizer config").get("chat_template")
    for name in ("chat_template.jinja", "chat_template.json"):
        if template is None and os.path.isfile(os.path.join(folder, name)):
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                template = fh.read()
    return {"sha256": sha256_of_files(folder, TOKENIZER_FILES),
            "chat_template_sha256": None if template is None else
            "sha256:" + hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()}
