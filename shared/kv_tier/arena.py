"""A bounded store of KV blocks in one memory-mapped file, shared by every process that maps it.

One arena holds fixed-size slots of one cache layout (one file per settings fingerprint and
tier, so blocks of another model, dtype, block size or layout never meet). In the file:

    header (4 KiB)   magic, format version, fingerprint, geometry, LRU clock, dirty flag
    slot metadata    per slot: block hash (32 bytes), last use, CRC-32, state, token ids
    hash index       open addressing (linear probing): hash -> slot, -1 when empty
    slot data        page-aligned, `slot_bytes` per slot

Every operation holds an exclusive lock (a threading lock inside the process, `flock` across
processes; taken with patience, see patient_lock.py: `ArenaBusy` when a stopped process holds
it), so the index is never seen half-changed and a reader never copies a block being
written: a store claims its slots under the lock (WRITING: neither findable nor claimable),
fills them without it, and publishes them (bytes and CRC-32 in place) under it again. A
process that dies while changing the index leaves the dirty flag set and the next locker
rebuilds the index from the slots' metadata (slots left WRITING become free). Every read checks the CRC-32 (and the token ids) first: a
block that fails is dropped and reported as a miss, never copied out.

Eviction is least recently used over all slots (a clock per access). The file survives the
processes that wrote it: a memory tier lives in /dev/shm (until reboot), a file tier on local
disk; a later opener with the same fingerprint adopts the existing geometry and content.
"""

import contextlib
import logging
import mmap
import os
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.kv_tier.patient_lock import DEFAULT_PATIENCE_S, ArenaBusy, PatientLock

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # optional speed-up; identical checksums
    _crc32 = zlib.crc32

logger = logging.getLogger(__name__)

MAGIC = b"PDKVARN1"
FORMAT_VERSION = 1
HASH_BYTES = 32
HEADER_BYTES = 4096
PAGE_BYTES = 4096
FREE, VALID, WRITING = 0, 1, 2
_NO_SLOT = -1

_HEADER = np.dtype([
    ("magic", "S8"), ("version", "<u4"), ("is_ready", "<u4"), ("fingerprint", "u1", (HASH_BYTES,)),
    ("slot_bytes", "<u8"), ("num_slots", "<u8"), ("table_size", "<u8"), ("block_size", "<u8"),
    ("clock", "<u8"), ("num_valid", "<u8"), ("is_dirty", "<u4"), ("reserved", "<u4"),
])

CopyIn = Callable[[int, np.ndarray], None]   # (index in the batch, slot bytes to fill)
CopyOut = Callable[[int, np.ndarray], None]  # (index in the batch, slot bytes to read)
# A slot about to be reused: (hash, token ids, its bytes, its CRC-32), before they are overwritten.
OnEvict = Callable[[bytes, tuple[int, ...], np.ndarray, int], None]


class ArenaFormatError(RuntimeError):
    """The file holds another arena (another fingerprint or slot size) than asked for."""


@dataclass(frozen=True)
class ArenaGeometry:
    slot_bytes: int
    num_slots: int
    block_size: int

    @property
    def table_size(self) -> int:
        """Index positions: a power of two, at least twice the slots (short probe runs)."""
        return 1 << max(4, (2 * self.num_slots - 1).bit_length())


@dataclass(frozen=True)
class PutResult:
    stored: tuple[bytes, ...]   # hashes newly written
    evicted: tuple[bytes, ...]  # hashes whose slots were reused


def _align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def _file_bytes(geometry: ArenaGeometry) -> int:
    return _layout(geometry)["data"] + geometry.num_slots * geometry.slot_bytes


def _layout(geometry: ArenaGeometry) -> dict[str, int]:
    """Byte offset of each region for `geometry`."""
    n, offsets, offset = geometry.num_slots, {}, HEADER_BYTES
    for name, num_bytes in (("hashes", n * HASH_BYTES), ("last_used", n * 8), ("crc", n * 4), ("state", n * 4),
                            ("tokens", n * geometry.block_size * 4), ("table", geometry.table_size * 4)):
        offsets[name] = offset
        offset = _align(offset + num_bytes, 64)
    offsets["data"] = _align(offset, PAGE_BYTES)
    return offsets


class KVArena:
    """One arena file, mapped. Thread-safe and process-safe; see the module docstring."""

    def __init__(self, path: Path, fingerprint: bytes, geometry: ArenaGeometry,
                 lock_patience_s: float = DEFAULT_PATIENCE_S):
        if len(fingerprint) != HASH_BYTES:
            raise ValueError(f"fingerprint must be {HASH_BYTES} bytes")
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._lock = PatientLock(self._fd, lock_patience_s)
        # Slots a store filled but could not publish (ArenaBusy): published at the next lock.
        self._unpublished: list[tuple[int, bytes, tuple[int, ...], int]] = []
        self._unpublished_lock = threading.Lock()
        try:
            with self._lock.blocking():
                self.geometry = self._open_or_create(fingerprint, geometry)
            self._map()
        except BaseException:
            os.close(self._fd)
            raise

    # ---- opening ---------------------------------------------------------------------------

    def _open_or_create(self, fingerprint: bytes, wanted: ArenaGeometry) -> ArenaGeometry:
        """Under the file lock: adopt a ready arena with this fingerprint, else lay out a new one."""
        existing = self._read_header()
        if existing is not None and existing["is_ready"] == 1:
            if existing["fingerprint"].tobytes() != fingerprint or existing["slot_bytes"] != wanted.slot_bytes:
                raise ArenaFormatError(f"{self.path} holds blocks of other cache settings; remove it to reuse the name")
            found = ArenaGeometry(int(existing["slot_bytes"]), int(existing["num_slots"]),
                                  int(existing["block_size"]))
            if found != wanted:
                logger.info("KV arena %s: adopting its %d slots (asked for %d)", self.path, found.num_slots,
                            wanted.num_slots)
            return found
        self._create(fingerprint, wanted)
        return wanted

    def _read_header(self):
        if os.fstat(self._fd).st_size < HEADER_BYTES:
            return None
        header = np.frombuffer(os.pread(self._fd, _HEADER.itemsize, 0), _HEADER)[0]
        if header["magic"] != MAGIC or header["version"] != FORMAT_VERSION:
            return None
        return header

    def _create(self, fingerprint: bytes, geometry: ArenaGeometry) -> None:
        """Lay out a new arena, its space reserved now (a memory file system that fills up
        later must not fault a write into a sparse page: OSError here instead)."""
        os.ftruncate(self._fd, 0)  # a stale or half-made arena: start from zeros
        os.posix_fallocate(self._fd, 0, _file_bytes(geometry))
        header = np.zeros((), _HEADER)
        header["magic"], header["version"] = MAGIC, FORMAT_VERSION
        header["fingerprint"] = np.frombuffer(fingerprint, np.uint8)
        header["slot_bytes"], header["num_slots"] = geometry.slot_bytes, geometry.num_slots
        header["table_size"], header["block_size"] = geometry.table_size, geometry.block_size
        os.pwrite(self._fd, b"\xff" * (4 * geometry.table_size), _layout(geometry)["table"])  # every position empty
        os.pwrite(self._fd, header.tobytes(), 0)
        os.pwrite(self._fd, np.array([1], "<u4").tobytes(), _HEADER.fields["is_ready"][1])
        logger.info("KV arena %s created: %d slots of %d bytes", self.path, geometry.num_slots, geometry.slot_bytes)

    def _map(self) -> None:
        geometry = self.geometry
        self._mmap = mmap.mmap(self._fd, _file_bytes(geometry), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        offsets, n = _layout(geometry), geometry.num_slots

        def view(name: str, dtype: str, count: int) -> np.ndarray:
            return np.frombuffer(self._mmap, dtype, count, offsets[name])

        self._header = np.frombuffer(self._mmap, _HEADER, 1, 0)
        self._hashes = view("hashes", "u1", n * HASH_BYTES).reshape(n, HASH_BYTES)
        self._last_used = view("last_used", "<u8", n)
        self._crc = view("crc", "<u4", n)
        self._state = view("state", "<u4", n)
        self._tokens = view("tokens", "<u4", n * geometry.block_size).reshape(n, geometry.block_size)
        self._table = view("table", "<i4", geometry.table_size)
        self._data = view("data", "u1", n * geometry.slot_bytes).reshape(n, geometry.slot_bytes)
        self._mask = geometry.table_size - 1

    def close(self) -> None:
        """Unmap and close (the file and its content stay for other processes)."""
        with self._lock.thread_lock:
            if self._fd < 0:
                return
            for name in ("_header", "_hashes", "_last_used", "_crc", "_state", "_tokens", "_table", "_data"):
                setattr(self, name, None)
            self._mmap.close()
            os.close(self._fd)
            self._fd = self._lock.fd = -1

    # ---- locking ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Both locks (ArenaBusy when they stay held past the patience); the index is rebuilt
        first if a process died while changing it, and stores left unpublished are published."""
        with self._lock.held():
            if self._header["is_dirty"][0]:
                self._rebuild_index()
            if self._unpublished:
                with self._unpublished_lock:
                    filled, self._unpublished = self._unpublished, []
                with self._changing():
                    self._publish_all(filled)
            yield

    @property
    def num_lock_timeouts(self) -> int:
        """Operations given up because the lock stayed held past the patience."""
        return self._lock.num_gave_up

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Marks the index dirty while it changes (inside `_locked`)."""
        self._header["is_dirty"] = 1
        yield
        self._header["is_dirty"] = 0

    def _rebuild_index(self) -> None:
        self._state[self._state == WRITING] = FREE  # a writer died mid-copy: never published
        self._table.fill(_NO_SLOT)
        valid = np.flatnonzero(self._state == VALID)
        for slot in valid:
            self._insert(bytes(self._hashes[slot]), int(slot))
        self._header["num_valid"] = len(valid)
        self._header["is_dirty"] = 0
        logger.warning("KV arena %s: index rebuilt from %d valid slots", self.path, len(valid))

    # ---- the hash index (callers hold the lock) --------------------------------------------

    def _home(self, block_hash: bytes) -> int:
        return int.from_bytes(block_hash[:8], "little") & self._mask

    def _find(self, block_hash: bytes) -> tuple[int, int]:
        """(table position, slot) of `block_hash`, or (position of the empty end, -1)."""
        position = self._home(block_hash)
        while True:
            slot = int(self._table[position])
            if slot == _NO_SLOT or self._hashes[slot].tobytes() == block_hash:
                return position, slot
            position = (position + 1) & self._mask

    def _insert(self, block_hash: bytes, slot: int) -> None:
        position, found = self._find(block_hash)
        if found == _NO_SLOT:
            self._table[position] = slot

    def _remove(self, block_hash: bytes) -> None:
        """Delete by backward shift: later entries of the probe run move up into the hole."""
        hole, slot = self._find(block_hash)
        if slot == _NO_SLOT:
            return
        self._table[hole] = _NO_SLOT
        position = hole
        while True:
            position = (position + 1) & self._mask
            moving = int(self._table[position])
            if moving == _NO_SLOT:
                return
            home = self._home(self._hashes[moving].tobytes())
            if (position - home) & self._mask >= (position - hole) & self._mask:
                self._table[hole], self._table[position] = moving, _NO_SLOT
                hole = position

    def _slot_of(self, block_hash: bytes, token_ids: Sequence[int] | None) -> int:
        """The valid slot holding `block_hash` (and these token ids, when given), or -1."""
        _, slot = self._find(block_hash)
        if slot == _NO_SLOT or self._state[slot] != VALID:
            return _NO_SLOT
        if token_ids is not None and not self._tokens_match(slot, token_ids):
            return _NO_SLOT
        return slot

    def _tokens_match(self, slot: int, token_ids: Sequence[int]) -> bool:
        block_size = self.geometry.block_size
        return len(token_ids) == block_size and np.array_equal(self._tokens[slot], np.asarray(token_ids, "<u4"))

    def _touch(self, slot: int) -> None:
        clock = int(self._header["clock"][0]) + 1
        self._header["clock"] = clock
        self._last_used[slot] = clock

    # ---- reads -----------------------------------------------------------------------------

    def count_run(self, block_hashes: Sequence[bytes], token_ids: Sequence[Sequence[int]]) -> int:
        """How many leading blocks are here (hash and token ids equal); marks them used."""
        with self._locked():
            for index, (block_hash, tokens) in enumerate(zip(block_hashes, token_ids)):
                slot = self._slot_of(block_hash, tokens)
                if slot == _NO_SLOT:
                    return index
                self._touch(slot)
            return len(block_hashes)

    def contains(self, block_hash: bytes) -> bool:
        with self._locked():
            return self._slot_of(block_hash, None) != _NO_SLOT

    def load_run(self, block_hashes: Sequence[bytes], token_ids: Sequence[Sequence[int]],
                 copy_out: CopyOut) -> tuple[int, int]:
        """Copy out the leading blocks that are here and pass their CRC-32: (copied, corrupt).

        Stops at the first block that is missing or fails its checksum; a failed block is
        dropped from the arena (it counts in `corrupt`), never copied out.
        """
        with self._locked():
            for index, (block_hash, tokens) in enumerate(zip(block_hashes, token_ids)):
                slot = self._slot_of(block_hash, tokens)
                if slot == _NO_SLOT:
                    return index, 0
                if _crc32(self._data[slot]) != int(self._crc[slot]):
                    logger.warning("KV arena %s: slot %d fails its CRC-32; dropped", self.path, slot)
                    with self._changing():
                        self._free_slot(slot)
                    return index, 1
                copy_out(index, self._data[slot])
                self._touch(slot)
            return len(block_hashes), 0

    def hashes(self) -> list[bytes]:
        """Every block hash held now (a snapshot for the prefix index)."""
        with self._locked():
            return [bytes(self._hashes[slot]) for slot in np.flatnonzero(self._state == VALID)]

    # ---- writes ----------------------------------------------------------------------------

    def put(self, block_hashes: Sequence[bytes], token_ids: Sequence[Sequence[int]], copy_in: CopyIn,
            on_evict: OnEvict | None = None, crcs: Sequence[int] | None = None) -> PutResult:
        """Store the blocks not here yet (those here are marked used); least recently used
        slots make room, each passed to `on_evict` before it is overwritten. `crcs`: the
        blocks' CRC-32 when the caller knows them (else computed from the copied bytes).

        The copies run outside the lock (other processes' lookups do not wait for them): the
        slots are claimed first (WRITING: neither findable nor claimable), then filled, then
        published. A block another process stored meanwhile is kept once (its slot freed)."""
        evicted: list[bytes] = []
        with self._locked(), self._changing():
            new = self._mark_present(block_hashes)
            slots = self._claim_slots(len(new), on_evict, evicted)
            for slot in slots:
                self._state[slot] = WRITING
        checksums = []
        for index, slot in zip(new, slots):
            copy_in(index, self._data[slot])
            checksums.append(_crc32(self._data[slot]) if crcs is None else crcs[index])
        filled = [(slot, block_hashes[index], tuple(token_ids[index]), crc)
                  for index, slot, crc in zip(new, slots, checksums)]
        try:
            with self._locked(), self._changing():
                stored = self._publish_all(filled)
        except ArenaBusy:
            with self._unpublished_lock:  # the claimed slots are not lost: published later
                self._unpublished.extend(filled)
            stored = []
        return PutResult(tuple(stored), tuple(evicted))

    def _publish_all(self, filled: Sequence[tuple[int, bytes, tuple[int, ...], int]]) -> list[bytes]:
        return [block_hash for slot, block_hash, tokens, crc in filled
                if self._publish(slot, block_hash, tokens, crc)]

    def _mark_present(self, block_hashes: Sequence[bytes]) -> list[int]:
        """Indices of the blocks to write (absent, first occurrence); touches present ones."""
        new, seen = [], set()
        for index, block_hash in enumerate(block_hashes):
            slot = self._slot_of(block_hash, None)
            if slot != _NO_SLOT:
                self._touch(slot)
            elif block_hash not in seen:
                seen.add(block_hash)
                new.append(index)
        return new[:self.geometry.num_slots]

    def _claim_slots(self, count: int, on_evict: OnEvict | None, evicted: list[bytes]) -> list[int]:
        """`count` free slots, evicting the least recently used valid ones as needed."""
        free = np.flatnonzero(self._state == FREE)[:count].tolist()
        if len(free) == count:
            return free
        num_evict = count - len(free)
        ages = np.where(self._state == VALID, self._last_used, np.iinfo(np.uint64).max)
        victims = np.argpartition(ages, num_evict - 1)[:num_evict] if num_evict < len(ages) else np.arange(len(ages))
        victims = victims[np.argsort(ages[victims], kind="stable")].tolist()
        for slot in victims:
            block_hash = bytes(self._hashes[slot])
            if on_evict is not None:
                on_evict(block_hash, tuple(self._tokens[slot].tolist()), self._data[slot], int(self._crc[slot]))
            self._free_slot(slot)
            evicted.append(block_hash)
        return free + victims

    def _free_slot(self, slot: int) -> None:
        self._remove(bytes(self._hashes[slot]))
        self._state[slot] = FREE
        self._header["num_valid"] = int(self._header["num_valid"][0]) - 1

    def _publish(self, slot: int, block_hash: bytes, tokens: Sequence[int], crc: int) -> bool:
        """Make a filled slot findable; False (the slot freed) when the block got here meanwhile."""
        if self._state[slot] != WRITING:
            return False  # an index rebuild after another process's crash took it back: never published
        if self._find(block_hash)[1] != _NO_SLOT:
            self._state[slot] = FREE
            return False
        self._crc[slot] = crc
        self._hashes[slot] = np.frombuffer(block_hash, np.uint8)
        self._tokens[slot] = np.asarray(tokens, "<u4")
        self._touch(slot)
        self._state[slot] = VALID
        self._insert(block_hash, slot)
        self._header["num_valid"] = int(self._header["num_valid"][0]) + 1
        return True

    # ---- state -----------------------------------------------------------------------------

    @property
    def num_valid(self) -> int:
        """Blocks held (a racy read, for metrics)."""
        header = self._header
        return int(header["num_valid"][0]) if header is not None else 0

    @property
    def capacity_bytes(self) -> int:
        return self.geometry.num_slots * self.geometry.slot_bytes
