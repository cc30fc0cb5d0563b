"""KVConnector: the one place where disaggregation meets the engine.

Who calls what, and when (all on the engine's thread unless said otherwise):

Scheduler side
- `get_num_new_matched_tokens(request_id, num_tokens, num_local_tokens)`: when a request whose
  KV comes from elsewhere is admitted (`LLMEngine.reserve_request`): how many of its tokens
  will arrive through the connector, beyond the `num_local_tokens` the local prefix cache holds.
- `update_state_after_alloc(request_id, block_ids, num_external_tokens, transfer_token,
  adapter_key)`: the blocks are allocated; the connector gets ready to receive the external
  tokens into the last blocks, accepting only a transfer that presents `transfer_token` and
  whose KV was computed with the LoRA adapter `adapter_key` ("" for the base model).
- `request_finished(request_id, block_ids, send)`: a request finished normally; with `send` the
  connector starts shipping its prompt KV and returns True: the scheduler then keeps the blocks
  until the connector reports the send finished (delay-free-until-sent).
- `cancel(request_id)`: the request was aborted, or its received KV was taken for decoding:
  stop receiving for it before this returns (its blocks may be reused right after); a send in
  flight is abandoned and still reported once, as failed.

Worker side
- `start_load_kv()` before each step's forward pass and `wait_for_save()` after it (the engine
  calls both); `wait_for_layer_load(i)` and `save_kv_layer(i)` around layer i, for a model
  runner that overlaps transfers with layers (ours does not call them yet). Connectors that
  move whole prompts after they are computed (both here) need none of them: the defaults
  do nothing.
- `get_finished()`: transfers that ended since the last call (sends and receives, each with
  its outcome); the engine frees sent blocks, and marks received KV as arrived.

Lifecycle: `start()` once (a consumer starts listening; `address` is valid after it),
`set_wakeup(fn)`: the connector calls `fn()` from any thread when a transfer ends, so an idle
engine thread polls `get_finished`; `shutdown()` once. `stats()` may be called from any thread.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from typing import Protocol

import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.types import FinishedTransfers, KVConnectorStats, KVSendParams, KVTransferConfig


class KVCacheAccess(Protocol):
    """What a connector reads and writes: the executor's paged KV cache."""

    @property
    def kv_cache_layout(self) -> KVCacheLayout: ...

    @property
    def kv_cache(self) -> torch.Tensor:
        """A full-layout tensor that received KV is written into."""

    def blocks_for_send(self, block_ids: list[int]) -> tuple[torch.Tensor, KVCacheLayout, list[int]]:
        """(tensor, its layout, the blocks' ids in it) to read `block_ids` from (gathered from
        the ranks' shards under tensor parallelism)."""

    def commit_received_blocks(self, block_ids: list[int]) -> None:
        """Received KV is in `kv_cache` for these blocks (copied to the ranks' shards here)."""


class KVConnector(ABC):
    def __init__(self, config: KVTransferConfig, kv_access: KVCacheAccess):
        self.config = config
        self.role = config.role
        self.kv_access = kv_access
        self._wakeup: Callable[[], None] = lambda: None

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start listening (consumer); called once before the first request."""

    def shutdown(self) -> None:
        """Stop every transfer and release what the connector holds; idempotent."""

    @property
    def address(self) -> str:
        """Where producers send this consumer's KV ("" for a producer)."""
        return ""

    def set_wakeup(self, wakeup: Callable[[], None]) -> None:
        self._wakeup = wakeup

    def stats(self) -> KVConnectorStats:
        return KVConnectorStats()

    # ---- scheduler side ------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request_id: str, num_tokens: int, num_local_tokens: int) -> int:
        """Tokens of this request that arrive through the connector (a consumer: all it lacks)."""
        return num_tokens - num_local_tokens if self.role.is_consumer else 0

    @abstractmethod
    def update_state_after_alloc(self, request_id: str, block_ids: list[int], num_external_tokens: int,
                                 transfer_token: bytes, adapter_key: str = "") -> None:
        """Get ready to receive the last `num_external_tokens` tokens' blocks of `block_ids`."""

    @abstractmethod
    def request_finished(self, request_id: str, block_ids: list[int], send: KVSendParams | None) -> bool:
        """Start sending `block_ids` per `send` (if any); True to keep the blocks until sent."""

    @abstractmethod
    def cancel(self, request_id: str) -> None:
        """Stop receiving for `request_id` (synchronously) and abandon its send, if any."""

    # ---- worker side ---------------------------------------------------------------------

    def start_load_kv(self) -> None:
        """Before a step: start loading KV the step's requests need."""

    def wait_for_layer_load(self, layer_index: int) -> None:
        """Before layer `layer_index` runs: its KV is loaded."""

    def save_kv_layer(self, layer_index: int) -> None:
        """After layer `layer_index` ran: start saving its new KV."""

    def wait_for_save(self) -> None:
        """After a step: every save it started is done with the step's buffers."""

    def wait_for_sends(self, request_ids: Collection[str], timeout_s: float) -> None:
        """Block until none of `request_ids` is still being sent, or `timeout_s` has passed
        (a connector whose sends end within `request_finished` returns at once)."""

    @abstractmethod
    def get_finished(self) -> FinishedTransfers:
        """Transfers that ended since the previous call."""
