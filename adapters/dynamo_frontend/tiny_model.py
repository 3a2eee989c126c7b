"""A tiny local model directory for the Dynamo frontend: a tokenizer and configs, no weights.

The frontend tokenizes prompts and detokenizes outputs with the model's ``tokenizer.json``;
nothing may be downloaded, so the adapter writes one at run time with the ``tokenizers``
package: a WordLevel vocabulary where the word ``t<n>`` is token ``n`` (``0 <= n < VOCAB``)
and whitespace splits words, so the text ``"t1 t2 t3"`` is exactly the tokens ``[1, 2, 3]``
and no special token is added.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 4096
EOS = VOCAB  # the end-of-sequence token, after the words
UNK = VOCAB + 1
BARE_MARK = VOCAB - 2
"""A prompt starting with this token is a bare call (``Direct``): the worker answers with the
suite's item convention, ``items`` data tokens of ``data_token(worker, index)``."""
DATA_BASE = 2048
STRIDE = 64


def data_token(worker: int, index: int) -> int:
    """The token a bare call's data item ``index`` from suite worker ``worker`` is spelled as."""
    if not (0 <= index < STRIDE and 0 <= worker < (BARE_MARK - DATA_BASE) // STRIDE):
        raise ValueError(f"item {index} of worker {worker} has no token in the tiny vocabulary")
    return DATA_BASE + worker * STRIDE + index


def data_item(token: int) -> tuple[int, int] | None:
    """(worker, index) of a bare call's data token, or None for any other token."""
    if not DATA_BASE <= token < BARE_MARK:
        return None
    return divmod(token - DATA_BASE, STRIDE)


LOAD_MARK = VOCAB - 1
"""A prompt starting with this token is the adapter's load on a worker (``mark_overloaded``):
the worker holds it without a token until told to end it, whatever its script."""


def word(token: int) -> str:
    return f"t{token}"


def prompt_text(tokens: tuple[int, ...] | list[int]) -> str:
    """The text the tiny tokenizer reads as exactly ``tokens``."""
    return " ".join(word(token) for token in tokens)


def build_tiny_model(directory: Path) -> Path:
    """Write the model files into ``directory`` (created if needed); returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {word(n): n for n in range(VOCAB)}
    vocab["</s>"] = EOS
    vocab["<unk>"] = UNK
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.add_special_tokens(["</s>", "<unk>"])
    tokenizer.save(str(directory / "tokenizer.json"))
    files = {
        "config.json": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": VOCAB + 2,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "num_hidden_layers": 1,
            "max_position_embeddings": 8192,
            "bos_token_id": EOS,
            "eos_token_id": EOS,
            "torch_dtype": "float32",
        },
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 8192,
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        },
        "generation_config.json": {"eos_token_id": EOS, "bos_token_id": EOS},
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=1))
    return directory
