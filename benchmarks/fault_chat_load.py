"""Two-turn chats for `make bench-faults`: the streaming load, but each chat's second turn is its
first prompt, the first turn's answer and a new user message, so the turn's prompt shares a long
prefix with KV other instances hold (the prefill instance that computed turn 1 holds its prompt,
the decode instance that generated the answer holds prompt and answer). With the host tier off,
the second turn's prefill pulls the blocks it lacks from that decode instance over UCX.

Requests 0..n-1 are first turns, n..2n-1 the second turns of the same chats. Both are submitted
at once, first turns first: every first turn has started before any second turn waits for its
first turn (FIFO workers), so the load cannot deadlock.
"""

import threading

from benchmarks.fault_load import StreamingLoad, StreamResult, random_prompt


def next_turn_prompt(prompt: list[int], answer: list[int], num_new_tokens: int, seed: int) -> list[int]:
    """The next turn of a chat: everything so far, then a new (random, reproducible) message."""
    if num_new_tokens < 1:
        raise ValueError(f"num_new_tokens must be at least 1, got {num_new_tokens}")
    return list(prompt) + list(answer) + random_prompt(num_new_tokens, seed)


class ChatLoad(StreamingLoad):
    def __init__(self, stub, num_chats: int, concurrency: int, new_tokens: int = 32, **kwargs):
        super().__init__(stub, 2 * num_chats, concurrency, **kwargs)
        self.num_chats = num_chats
        self.new_tokens = new_tokens
        self._ended = [threading.Event() for _ in range(num_chats)]
        self._prompts: dict[int, list[int]] = {}

    def first_turns(self) -> list[tuple[list[int], StreamResult]]:
        """(prompt, result) of every first turn that has ended."""
        return [(self._prompts[i], self._results[i]) for i in range(self.num_chats)
                if self._ended[i].is_set() and i in self._prompts]

    def prompt_of(self, index: int) -> list[int]:
        if index < self.num_chats:
            prompt = super().prompt_of(index)
        else:
            chat = index - self.num_chats
            if not self._ended[chat].wait(self.timeout_s):
                raise TimeoutError(f"chat {chat}'s first turn did not end within {self.timeout_s} s")
            prompt = next_turn_prompt(self._prompts[chat], self._results[chat].token_ids, self.new_tokens,
                                      self.seed * 1000 + index)
        self._prompts[index] = prompt
        return prompt

    def _run(self, result: StreamResult) -> None:
        try:
            super()._run(result)
        finally:
            if result.index < self.num_chats:
                self._ended[result.index].set()
