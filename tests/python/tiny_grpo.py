"""The TRL GRPOTrainer of the trainer tests: a tiny Qwen2 initialised from a
config (nothing downloaded), a word-level tokenizer built here, prompts of
counting words and a rule-based reward; a few steps on the CPU."""

from __future__ import annotations

import os
from typing import Any, List

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def make_grpo_trainer(out: str, steps: int, callbacks: List[Any]) -> Any:
    """A GRPOTrainer of `steps` optimizer steps, logging every step, writing under `out`."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(29)]
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={w: i for i, w in enumerate(words)},
                                                          unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>",
                                               unk_token="<unk>")
    tok.padding_side = "left"
    cfg = transformers.Qwen2Config(vocab_size=len(words), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg)
    data = datasets.Dataset.from_dict({"prompt": [f"w{i} w{i + 1} w{i + 2}" for i in range(16)]})

    def reward(completions: List[str], **kwargs: Any) -> List[float]:
        return [float(sum(int(w[1:]) for w in c.split() if w.startswith("w")) % 7) for c in completions]

    args = trl.GRPOConfig(output_dir=out, use_cpu=True, bf16=False, fp16=False, per_device_train_batch_size=4,
                          num_generations=4, gradient_accumulation_steps=1, max_completion_length=6,
                          max_steps=steps, logging_steps=1, report_to="none", save_strategy="no",
                          learning_rate=1e-2, use_vllm=False, dataloader_num_workers=0, seed=0)
    return trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                           processing_class=tok, callbacks=callbacks)
