"""Guided (structured) decoding through XGrammar.

  params.py          GuidedDecodingParams: which constraint a request asks for (no XGrammar import).
  limits.py          GuidedLimits: size, nesting and compile-time bounds, checked before compiling.
  compiler.py        GrammarCache: compiles constraints for one tokenizer, cached by kind + text.
  bitmask.py         filling one step's token bitmask from the matchers, applying it to logits.

The engine's hooks (admission, before and after each step) are shared.engine.guided_decoding.

Only `params` is imported here, so `SamplingParams` can use it without loading XGrammar.
"""

from shared.guided.params import GuidedDecodingParams

__all__ = ["GuidedDecodingParams"]
