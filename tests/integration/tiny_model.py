"""Write a tiny Llama-architecture model directory that vLLM can load with ``load_format="dummy"``.

The directory holds a Hugging Face ``config.json`` for a 2-layer ``LlamaForCausalLM`` (a few
hundred thousand parameters), a ``generation_config.json`` and a word-level tokenizer built with
the ``tokenizers`` library. No weights are written: the dummy loader fills the parameters with
random values, which is all an engine smoke test needs. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PROMPTS", "VOCAB_WORDS", "write_tiny_llama", "write_word_tokenizer"]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")

_WORDS = """
the quick brown fox jumps over lazy dog a an and or but if then else when while memory device
engine cache block token model layer head hidden state graph settle wait free used total ratio
budget shared test runner prompt answer question hello world one two three four five six seven
eight nine ten is are was were be been being have has had do does did can
"""
VOCAB_WORDS = tuple(_WORDS.split())

PROMPTS = ("hello world the quick brown fox", "the engine cache is free and the test can wait")


def write_word_tokenizer(directory: Path, *, model_max_length: int = 256) -> int:
    """Write a word-level tokenizer over :data:`VOCAB_WORDS` into ``directory``.

    Args:
        directory: An existing directory.
        model_max_length: The tokenizer's ``model_max_length``.

    Returns:
        The vocabulary size (special tokens ``<unk>``, ``<s>``, ``</s>``, ``<pad>`` are 0-3).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *VOCAB_WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": model_max_length,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    (directory / "special_tokens_map.json").write_text(
        json.dumps(
            {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
        )
    )
    return len(vocab)


def write_tiny_llama(directory: Path) -> Path:
    """Write the tiny model into ``directory`` (created if missing) and return it.

    Args:
        directory: Where to write ``config.json``, ``generation_config.json`` and the tokenizer.

    Returns:
        ``directory``, ready to pass as ``model=`` to ``vllm.LLM``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = write_word_tokenizer(directory)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3})
    )
    return directory
