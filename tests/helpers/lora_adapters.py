"""Small random LoRA adapters made with peft (the reference), and peft's greedy output.

`save_peft_adapter` wraps a base model folder with peft, gives every LoRA matrix random,
non-zero values (peft's `init_lora_weights=False`: A and B both random, so the adapter changes
the output), and saves it in peft's format (`adapter_config.json`, `adapter_model.safetensors`).
`merged_greedy` is the reference: peft's merged model (W + scaling * B A), greedy, fp32; on a
real model (where two tokens may be nearly tied) `assert_merged_choices` checks each generated
token under teacher forcing instead, as tests/e2e/test_engine_vs_transformers.py does.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM


@dataclass(frozen=True)
class AdapterSpec:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    seed: int
    use_rslora: bool = False
    use_dora: bool = False
    # (module, rank) pairs: peft's rank_pattern, those modules' rank instead of `rank`.
    rank_pattern: tuple[tuple[str, int], ...] = ()
    # Scale of the random A and B values (peft's own random init is small for tiny models).
    std: float = 0.2
    layers: tuple[int, ...] | None = field(default=None)


def save_peft_adapter(base_folder: Path, folder: Path, spec: AdapterSpec) -> Path:
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.target_modules),
                        init_lora_weights=False, use_rslora=spec.use_rslora, use_dora=spec.use_dora,
                        rank_pattern=dict(spec.rank_pattern),
                        layers_to_transform=list(spec.layers) if spec.layers is not None else None)
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * spec.std)
    peft_model.save_pretrained(folder)
    return folder


# Logit margin under which two tokens count as tied (fp32 sums in another order may flip them).
NEAR_TIE = 1e-3


def merged_model(base_folder: Path, adapter_folder: Path | None):
    """The base model (fp32) with the adapter merged into its weights by peft."""
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    if adapter_folder is not None:
        model = PeftModel.from_pretrained(model, adapter_folder).merge_and_unload()
    return model.eval()


def assert_merged_choices(model, prompt: list[int], generated: list[int]) -> None:
    """Each generated token is the merged model's argmax given the same prefix, or a near-tie."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1:-1]
    for step, (row, token_id) in enumerate(zip(logits, generated)):
        best = int(row.argmax())
        if best != token_id:
            margin = float(row[best] - row[token_id])
            assert margin < NEAR_TIE, f"step {step}: pdserve chose {token_id}, the merged model {best} by {margin}"


def merged_greedy(base_folder: Path, adapter_folder: Path | None, prompts: list[list[int]],
                  num_new: int) -> list[list[int]]:
    """Greedy continuations by transformers on the base model with the adapter merged in."""
    model = merged_model(base_folder, adapter_folder)
    results = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(num_new):
                next_id = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
            results.append(ids[0, len(prompt):].tolist())
    return results
