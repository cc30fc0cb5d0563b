"""Compiling guided-decoding constraints with XGrammar, for one tokenizer, cached by kind + text.

`GuidedDecoding` (the engine's hooks) builds one `GrammarCache` per engine on the first guided
request; services compile on its worker threads before admission (`GuidedDecoding.prepare`),
so the step loop finds the grammar cached, and a bad schema, regex or grammar is refused with
XGrammar's message before any compute. The cache is safe to use from several threads. Compiled grammars are immutable and shared: every request
(and every n > 1 child) asking for the same constraint gets the same `CompiledGrammar` and its
own matcher.
"""

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import xgrammar as xgr

from shared.errors import InvalidRequestError
from shared.guided.bitmask import allows_no_token, allows_only
from shared.guided.params import GuidedDecodingParams

logger = logging.getLogger(__name__)

DEFAULT_MAX_CACHED_GRAMMARS = 256
DEFAULT_COMPILER_THREADS = 4
# Longest XGrammar message passed on (they may quote the whole schema).
MAX_MESSAGE_CHARS = 500
# JSON outputs use fixed separators (", " and ": "), no free whitespace: a sampled model cannot
# then wander into endless blank lines, and outputs stay short.
JSON_ANY_WHITESPACE = False
JSON_KINDS = ("json_schema", "json_object")
# XGrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:123: " (and sometimes a
# failed check's condition); users get the rest.
_ERROR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


def tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: Sequence[int]) -> xgr.TokenizerInfo:
    """XGrammar's view of a Hugging Face tokenizer, padded to the model's `vocab_size` (the
    logits width); `stop_token_ids` (the model's EOS ids) are what a finished grammar allows."""
    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                              stop_token_ids=list(stop_token_ids))


def xgrammar_message(error: Exception) -> str:
    """XGrammar's error text without its source-location prefix."""
    return _ERROR_PREFIX.sub("", str(error).strip())


class GrammarCache:
    """Compiled grammars keyed by (kind, text), least recently used dropped past `max_entries`."""

    def __init__(self, info: xgr.TokenizerInfo, max_entries: int = DEFAULT_MAX_CACHED_GRAMMARS,
                 num_threads: int = DEFAULT_COMPILER_THREADS):
        self.tokenizer_info = info
        self.max_entries = max_entries
        # This class is the cache; XGrammar's own would hold every grammar a second time.
        self._compiler = xgr.GrammarCompiler(info, max_threads=num_threads, cache_enabled=False)
        self._entries: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # held for dictionary updates only, never while compiling
        self.num_hits = 0
        self.num_misses = 0

    @property
    def vocab_size(self) -> int:
        return self.tokenizer_info.vocab_size

    def __len__(self) -> int:
        return len(self._entries)

    def compile(self, guided: GuidedDecodingParams) -> xgr.CompiledGrammar:
        """The compiled grammar; raises InvalidRequestError("guided.<kind>", XGrammar's message)."""
        key = (guided.kind, guided.text)
        compiled = self.lookup(key)
        if compiled is not None:
            return compiled
        compiled = self._compile_uncached(guided)
        with self._lock:
            self._entries[key] = compiled
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return compiled

    def lookup(self, key: tuple[str, str]) -> xgr.CompiledGrammar | None:
        """The cached grammar for (kind, text), counted as a hit or a miss."""
        with self._lock:
            compiled = self._entries.get(key)
            if compiled is None:
                self.num_misses += 1
                return None
            self.num_hits += 1
            self._entries.move_to_end(key)
            return compiled

    def _compile_uncached(self, guided: GuidedDecodingParams) -> xgr.CompiledGrammar:
        try:
            compiled = self._compile_kind(guided.kind, guided.text, guided)
        except (RuntimeError, ValueError, TypeError) as error:
            message = xgrammar_message(error)
            logger.info("refused %s: %s", guided.field_name, message)
            raise InvalidRequestError(guided.field_name, message[:MAX_MESSAGE_CHARS]) from None
        problem = why_useless(compiled, guided.kind, self.tokenizer_info)
        if problem is not None:
            raise InvalidRequestError(guided.field_name, problem)
        return compiled

    def _compile_kind(self, kind: str, text: str, guided: GuidedDecodingParams) -> xgr.CompiledGrammar:
        if kind == "json_schema":
            return self._compiler.compile_json_schema(text, any_whitespace=JSON_ANY_WHITESPACE)
        if kind == "json_object":
            # Any object: strict mode off, or {"type": "object"} would only allow {}.
            return self._compiler.compile_json_schema(
                '{"type": "object"}', any_whitespace=JSON_ANY_WHITESPACE, strict_mode=False)
        if kind == "regex":
            return self._compiler.compile_regex(text)
        if kind == "choice":
            return self._compiler.compile_grammar(choice_grammar(guided.choice))
        return self._compiler.compile_grammar(text)


def why_useless(compiled: xgr.CompiledGrammar, kind: str, info: xgr.TokenizerInfo) -> str | None:
    """Why no request could get useful output under the grammar, judged by its first step."""
    bitmask = first_token_bitmask(compiled, info.vocab_size)
    if allows_no_token(bitmask, info.vocab_size):
        return "matches no output at all (no token can ever be generated); check the constraint"
    if kind in JSON_KINDS and allows_only(bitmask, info.stop_token_ids):
        return "no value satisfies this schema: it matches only the empty output, which is no JSON value"
    return None


def first_token_bitmask(compiled: xgr.CompiledGrammar, vocab_size: int):
    """The tokens the grammar allows first (`root ::= root` and the regex `[^\\s\\S]` allow
    none; a grammar matching only "" allows only the stop tokens)."""
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0]


def choice_grammar(choices: Sequence[str]) -> str:
    """EBNF whose language is exactly `choices` (JSON string escapes are EBNF string escapes)."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
