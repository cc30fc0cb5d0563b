"""How one request wants its tokens chosen: the OpenAI/vLLM-style sampling parameters.

Front doors build a `SamplingParams` from user input (construction already rejects what
needs no vocabulary); the engine calls `validate(vocab_size)` once the model's vocabulary
size is known. The sampler and the scheduler only read the fields and properties.
"""

from dataclasses import dataclass, field

from shared.guided.params import GuidedDecodingParams
from shared.sampling.params_validation import validate_sampling_params

# Temperatures below this are treated as 0: always take the most likely token.
GREEDY_TEMPERATURE_EPSILON = 1e-5


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None  # only None or == n is supported
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the model's length
    # EOS and stop_token_ids are hidden until this many tokens were generated; under `guided`,
    # a grammar that is complete (allows nothing but EOS) wins: the request ends with "stop",
    # possibly shorter than min_tokens.
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)  # a single str is wrapped
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives besides the sampled token; 0: sampled only
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Constrain the output to a JSON schema, regex, choice or grammar (shared.guided).
    guided: GuidedDecodingParams | None = None
    # Let the engine speculate for this request when it runs speculative decoding (the output
    # distribution is the same either way; False opts out, e.g. to compare).
    use_speculation: bool = True

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        self.validate()

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise `InvalidRequestError` naming the first bad field.

        Without `vocab_size` the token-id range checks are skipped; the engine passes it.
        """
        validate_sampling_params(self, vocab_size)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPSILON

    @property
    def uses_top_k(self) -> bool:
        return self.top_k > 0

    @property
    def uses_top_p(self) -> bool:
        return self.top_p < 1.0

    @property
    def uses_min_p(self) -> bool:
        return self.min_p > 0.0

    @property
    def uses_repetition_penalty(self) -> bool:
        return self.repetition_penalty != 1.0

    @property
    def needs_penalties(self) -> bool:
        """True when the logits must be changed by repetition/presence/frequency penalties."""
        return (self.uses_repetition_penalty or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)
