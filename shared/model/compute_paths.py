"""Which kernels a model's steps run on this machine, in words: the engine logs it at load time and
reports it in its `EngineInfo` (`compute`), and every benchmark prints it beside its figures, so
a figure is never read without the path that made it (`PDSERVE_CPU_MATMUL_DTYPE` and
`PDSERVE_CPU_ATTENTION_PATH` force the alternatives)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ComputePaths:
    device: str
    # The dtype the linear layers compute in and the library running them.
    matmul: str
    decode_attention: str
    prompt_attention: str
    # RMSNorm and the rotary embedding.
    layer_ops: str

    def summary(self) -> str:
        return (f"matmul {self.matmul}; decode attention {self.decode_attention}; prompt attention "
                f"{self.prompt_attention}; norms/rotary {self.layer_ops} ({self.device})")
