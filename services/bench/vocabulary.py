"""The tokenizer side of a workload: usable token ids and prompt text for text backends.

Called by the bench command and the compare driver once, before building a dataset.
"""

from pathlib import Path

from services.bench.datasets import BenchPrompt


def load_bench_tokenizer(model: str | None):
    """The tokenizer of `model` (an HF folder or GGUF; None: the default SmolLM2)."""
    from shared.model.default_model import resolve_model
    from shared.tokenization.tokenizer import load_tokenizer

    return load_tokenizer(Path(resolve_model(model)))


def usable_token_ids(tokenizer) -> list[int]:
    """Every token id of the vocabulary except the special ones (BOS, EOS, chat markers...)."""
    special_ids = set(tokenizer.all_special_ids)
    return [token_id for token_id in range(len(tokenizer)) if token_id not in special_ids]


def with_prompt_text(prompts: list[BenchPrompt], tokenizer) -> list[BenchPrompt]:
    """The same prompts, each with its text filled in (decoded) where it had none."""
    return [prompt if prompt.prompt_text is not None else
            BenchPrompt(prompt.prompt_token_ids, prompt.output_len, tokenizer.decode(prompt.prompt_token_ids))
            for prompt in prompts]
