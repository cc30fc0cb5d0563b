"""The multi-turn chat workload of `make bench-multiturn`: many conversations over one shared
system prompt, each turn adding a user message to the conversation so far (answers included).

Texts are words the tokenizer encodes as one token each (so a message of N words is about N
tokens), drawn from a seeded generator: every server gets the same conversations. The order
is round-robin over the chats, turn by turn (turn 1 of every chat, then turn 2, ...), taken
`concurrency` at a time; a chat's next turn waits for its previous answer.
"""

import random
import re
from dataclasses import dataclass

from shared.errors import ConfigurationError

_WORD = re.compile(r"^ [a-z]{3,10}$")


@dataclass(frozen=True)
class ChatWorkload:
    num_chats: int = 64
    num_turns: int = 4
    concurrency: int = 8
    system_tokens: int = 400
    user_tokens: int = 300
    output_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_chats", "num_turns", "concurrency", "system_tokens", "user_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise ConfigurationError(name.replace("_", "-"), f"must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class Turn:
    chat: int
    index: int  # 1-based turn number


@dataclass
class ChatTexts:
    system: str
    user_messages: list[list[str]]  # [chat][turn - 1]


def single_token_words(tokenizer) -> list[str]:
    """Lower-case words (with their leading space) that are one token of the vocabulary."""
    words = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if _WORD.match(text) and tokenizer.encode(text, add_special_tokens=False) == [token_id]:
            words.append(text)
    if len(words) < 100:
        raise ConfigurationError("model", "its vocabulary has too few single-token words for the workload")
    return words


def build_texts(workload: ChatWorkload, tokenizer) -> ChatTexts:
    words = single_token_words(tokenizer)
    rng = random.Random(workload.seed)

    def text(num_words: int) -> str:
        return "".join(rng.choice(words) for _ in range(num_words)).strip()

    system = text(workload.system_tokens)
    messages = [[text(workload.user_tokens) for _ in range(workload.num_turns)] for _ in range(workload.num_chats)]
    return ChatTexts(system, messages)


def round_robin(workload: ChatWorkload) -> list[Turn]:
    """Every turn in the order it is sent: turn 1 of every chat, then turn 2, ..."""
    return [Turn(chat, index) for index in range(1, workload.num_turns + 1) for chat in range(workload.num_chats)]


def history_tokens(workload: ChatWorkload) -> int:
    """Tokens of every conversation at its end, all chats together (what the pools would keep)."""
    per_chat = workload.system_tokens + workload.num_turns * (workload.user_tokens + workload.output_tokens)
    return workload.num_chats * per_chat
