"""Write offline stand-ins for the hub models the chosen vLLM tests name.

Each stand-in is a tiny model of the named architecture with random weights, written with
transformers (``save_pretrained``, safetensors) and the word-level tokenizer of
``tests/integration/tiny_model.py``, and placed in a Hugging Face hub cache under ``HF_HOME``
the way a download would have left it (``hub/models--org--name/refs/main`` naming a snapshot).
With ``HF_HUB_OFFLINE=1`` transformers and vLLM then resolve the hub name to it; nothing is
downloaded.

Usage: python standins.py HF_HOME
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.integration.tiny_model import write_word_tokenizer  # noqa: E402

SNAPSHOT = "0" * 40
MAX_LEN = 2048
# Head size 64 (hidden 128, 2 heads): vLLM's CPU attention supports 32, 64, 80, 96, 112, 128,
# 160, 192, 224, 256 and 512, not 16.

# hub name -> (transformers config class, tiny config). Special tokens: 1 bos, 2 eos, 3 pad.
STANDINS: dict[str, tuple[str, dict[str, Any]]] = {
    "distilbert/distilgpt2": (
        "GPT2Config",
        {"n_embd": 128, "n_layer": 2, "n_head": 2, "n_positions": MAX_LEN},
    ),
    "JackFram/llama-160m": (
        "LlamaConfig",
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "max_position_embeddings": MAX_LEN,
        },
    ),
    "facebook/opt-125m": (
        "OPTConfig",
        {
            "hidden_size": 128,
            "ffn_dim": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "word_embed_proj_dim": 128,
            "max_position_embeddings": MAX_LEN,
        },
    ),
}


def write(hf_home: Path, name: str) -> Path:
    """Write the stand-in for ``name`` into the hub cache under ``hf_home``; return its snapshot."""
    import torch
    import transformers

    repo = hf_home / "hub" / ("models--" + name.replace("/", "--"))
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    vocab = write_word_tokenizer(snapshot, model_max_length=MAX_LEN)
    config_class, fields = STANDINS[name]
    config = getattr(transformers, config_class)(
        vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=3, **fields
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(snapshot, safe_serialization=True)
    (snapshot / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3})
    )
    return snapshot


def main() -> None:
    """Write every stand-in into the HF_HOME named on the command line."""
    hf_home = Path(sys.argv[1])
    for name in STANDINS:
        print(f"stand-in {name}: {write(hf_home, name)}")


if __name__ == "__main__":
    main()
