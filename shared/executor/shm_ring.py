"""A single-writer, many-reader message ring in shared memory (one step's message per slot).

Layout: a header of uint64 words [reader 0's last read sequence, reader 1's, ...], then
`num_slots` slots of [sequence, length, payload bytes]. The writer fills slot seq % num_slots
once every reader has read the message that was there, writes the payload and length, then
publishes by writing the sequence (x86 keeps stores in order; the payload is complete when a
reader sees the sequence). Readers poll their next sequence. Waiting sleeps with a growing
back-off (the machine's cores are the model's) and calls `check` so that a dead peer or a
deadline ends the wait with an error instead of a hang.
"""

import mmap
import os
import time
from collections.abc import Callable
from multiprocessing import shared_memory

import numpy as np

WORD = 8
SLOT_HEADER_WORDS = 2
MAX_POLL_SLEEP_S = 0.0005
# Where Linux keeps POSIX shared-memory objects (what shm_open opens).
POSIX_SHM_FOLDER = "/dev/shm"


class RingClosedError(RuntimeError):
    """The wait was ended by `check` (peer gone, deadline passed)."""


def wait_until(ready: Callable[[], bool], check: Callable[[], None]) -> None:
    """Poll `ready`; between polls sleep (growing to MAX_POLL_SLEEP_S) and call `check`."""
    pause = 0.0
    while not ready():
        check()
        time.sleep(pause)
        pause = min(MAX_POLL_SLEEP_S, pause * 2 or 1e-6)


class AttachedSegment:
    """A shared-memory segment another process created, mapped without registering it with
    this process's resource tracker. `SharedMemory(name=...)` registers every attach before
    Python 3.13, and a worker's tracker would unlink the engine's ring when the worker exits;
    the creator alone tracks and unlinks it."""

    def __init__(self, name: str):
        descriptor = os.open(os.path.join(POSIX_SHM_FOLDER, name.lstrip("/")), os.O_RDWR)
        try:
            self._mapping = mmap.mmap(descriptor, 0)
        finally:
            os.close(descriptor)
        self.buf = memoryview(self._mapping)

    def close(self) -> None:
        self.buf.release()
        self._mapping.close()

    def unlink(self) -> None:
        raise RuntimeError("only the process that created a ring unlinks it")


class ShmRing:
    def __init__(self, memory: shared_memory.SharedMemory | AttachedSegment, num_readers: int, num_slots: int, slot_bytes: int):
        self.memory = memory
        self.num_readers = num_readers
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.acks = np.ndarray((num_readers,), dtype=np.uint64, buffer=memory.buf)
        slot_stride = SLOT_HEADER_WORDS * WORD + slot_bytes
        self._slot_offsets = [num_readers * WORD + index * slot_stride for index in range(num_slots)]
        self._next_sequence = 1

    @classmethod
    def create(cls, num_readers: int, num_slots: int = 4, slot_bytes: int = 4 << 20) -> "ShmRing":
        size = num_readers * WORD + num_slots * (SLOT_HEADER_WORDS * WORD + slot_bytes)
        memory = shared_memory.SharedMemory(create=True, size=size)
        memory.buf[:size] = bytes(size)
        return cls(memory, num_readers, num_slots, slot_bytes)

    @classmethod
    def attach(cls, name: str, num_readers: int, num_slots: int, slot_bytes: int) -> "ShmRing":
        return cls(AttachedSegment(name), num_readers, num_slots, slot_bytes)

    @property
    def spec(self) -> tuple[str, int, int, int]:
        """What `attach` needs: (name, num_readers, num_slots, slot_bytes)."""
        return self.memory.name, self.num_readers, self.num_slots, self.slot_bytes

    def _slot_words(self, sequence: int) -> np.ndarray:
        offset = self._slot_offsets[sequence % self.num_slots]
        return np.ndarray((SLOT_HEADER_WORDS,), dtype=np.uint64, buffer=self.memory.buf, offset=offset)

    def write(self, payload: bytes, check: Callable[[], None]) -> None:
        if len(payload) > self.slot_bytes:
            raise ValueError(f"message of {len(payload)} bytes exceeds the ring's {self.slot_bytes}-byte slots")
        sequence = self._next_sequence
        wait_until(lambda: int(self.acks.min()) >= sequence - self.num_slots, check)
        offset = self._slot_offsets[sequence % self.num_slots] + SLOT_HEADER_WORDS * WORD
        self.memory.buf[offset:offset + len(payload)] = payload
        words = self._slot_words(sequence)
        words[1] = len(payload)
        words[0] = sequence
        self._next_sequence += 1

    def read(self, reader: int, check: Callable[[], None]) -> bytes:
        sequence = self._next_sequence
        words = self._slot_words(sequence)
        wait_until(lambda: int(words[0]) == sequence, check)
        offset = self._slot_offsets[sequence % self.num_slots] + SLOT_HEADER_WORDS * WORD
        payload = bytes(self.memory.buf[offset:offset + int(words[1])])
        self.acks[reader] = sequence
        self._next_sequence += 1
        return payload

    def close(self, unlink: bool = False) -> None:
        del self.acks
        self._slot_words = None
        try:
            self.memory.close()
        except BufferError:
            pass  # a numpy view is still alive somewhere; the mapping goes with the process
        if unlink:
            self.memory.unlink()
