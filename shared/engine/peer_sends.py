"""Peer reuse, both ends in the engine (the services carry the control messages).

Holder: `PeerSends.start` finds a prefix's blocks in this engine (its pool, else its KV
tiers), takes a reference on each for as long as the send runs (the lease: the pool cannot
evict a block a peer is reading), and has the KV connector send those the puller lacks into
the puller's reserved blocks; the references go when the connector reports the send ended,
whatever its outcome (the sender's timeout bounds it). A holder that no longer has every
block refuses, and the puller computes the prefix instead.

Puller: an ordinary KV reservation of the prefix (`reserve_request`); once its KV arrived,
`keep_arrived_kv` registers the received blocks in the prefix cache before the reservation is
released, so the prompt that follows finds them as prefix hits.
"""

import logging

from shared.core.kv_cache_manager import KVCacheManager
from shared.core.request import Request
from shared.engine_api.client import NOT_HELD_FIELD, CachedSend
from shared.errors import InvalidRequestError
from shared.kv_cache.block_pool import KVBlock
from shared.kv_transfer.base import KVConnector
from shared.kv_transfer.types import KVSendParams, KVTransferOutcome
from shared.sampling.params import SamplingParams

logger = logging.getLogger(__name__)

TRANSFER_ID_PREFIX = "peer-send:"


class PeerSends:
    def __init__(self, kv_manager: KVCacheManager, connector: KVConnector | None):
        self.kv = kv_manager
        self.connector = connector
        self._held: dict[str, list[KVBlock]] = {}  # transfer id -> blocks referenced while sending

    def start(self, send: CachedSend) -> int:
        """Start sending; the number of blocks on their way. InvalidRequestError naming the
        field when this engine cannot send them (no sender, bad input, blocks not held)."""
        if self.connector is None or not self.connector.role.is_producer:
            raise InvalidRequestError("kv_transfer", "this engine's KV connector does not send KV")
        num_blocks = self._check(send)
        transfer_id = TRANSFER_ID_PREFIX + send.request_id
        if transfer_id in self._held:
            raise InvalidRequestError("request_id", f"{send.request_id!r} is already being sent")
        blocks = self._held_prefix(send, num_blocks)
        sending = blocks[send.num_skip_blocks:]
        self.kv.pool.touch(sending)
        self._held[transfer_id] = sending
        try:
            self.connector.request_finished(transfer_id, [block.block_id for block in blocks], KVSendParams(
                send.remote_address, send.request_id, send.remote_block_ids, send.num_skip_blocks,
                send.transfer_token))
        except BaseException:
            self.kv.pool.free(list(reversed(self._held.pop(transfer_id))))
            raise
        return len(sending)

    def _check(self, send: CachedSend) -> int:
        block_size = self.kv.block_size
        num_tokens = len(send.prompt_token_ids)
        if num_tokens == 0 or num_tokens % block_size:
            raise InvalidRequestError("prompt_token_ids", f"must be whole blocks of {block_size} tokens, "
                                                          f"got {num_tokens} tokens")
        num_blocks = num_tokens // block_size
        if len(send.remote_block_ids) != num_blocks:
            raise InvalidRequestError("dst_block_ids", f"{len(send.remote_block_ids)} ids for {num_blocks} blocks")
        if not 0 <= send.num_skip_blocks < num_blocks:
            raise InvalidRequestError("num_skip_blocks", f"{send.num_skip_blocks} leaves none of the {num_blocks} "
                                                         "blocks to send")
        return num_blocks

    def _held_prefix(self, send: CachedSend, num_blocks: int) -> list[KVBlock]:
        probe = Request(TRANSFER_ID_PREFIX + send.request_id, list(send.prompt_token_ids), SamplingParams(),
                        cache_salt=send.cache_salt)
        blocks = self.kv.find_cached_prefix(probe, max_blocks=num_blocks)
        if len(blocks) < num_blocks:
            raise InvalidRequestError(NOT_HELD_FIELD, f"this instance holds {len(blocks)} of the {num_blocks} "
                                                      "blocks asked for")
        return blocks

    def finish(self, outcome: KVTransferOutcome) -> bool:
        """A send ended: let go of its blocks. False when it was no peer send."""
        blocks = self._held.pop(outcome.request_id, None)
        if blocks is None:
            return False
        self.kv.pool.free(list(reversed(blocks)))
        if not outcome.is_ok:
            logger.warning("peer send %s failed: %s", outcome.request_id, outcome.error,
                           extra={"request_id": outcome.request_id})
        return True
