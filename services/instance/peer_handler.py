"""Peer reuse, the holder's side: SendCachedBlocks sends blocks of a prefix this instance holds
(its pool, or its host's KV tiers) into a puller's reservation over UCX. Served by every role
when --kv-peer-reuse is on (a decode instance holds a finished conversation's blocks, prompt
and output, for the next turn's prefill)."""

import logging

import grpc

from shared.engine_api.client import NOT_HELD_FIELD, CachedSend
from shared.errors import InvalidRequestError
from shared.kv_transfer.address import parse_address
from shared.pb.pdserve.v1 import instance_pb2 as pb
from services.instance.role import RoleHandler
from services.rpc.errors import ServiceError

logger = logging.getLogger(__name__)


class PeerHandler(RoleHandler):
    def __init__(self, runtime):
        self.runtime = runtime
        self.num_sends = 0
        self.num_blocks_sent = 0
        self.num_refused = 0  # asked for blocks it no longer held

    async def send_cached_blocks(self, request: pb.SendCachedBlocksRequest) -> pb.SendCachedBlocksResponse:
        if not request.request_id:
            raise InvalidRequestError("request_id", "must not be empty")
        try:
            parse_address(request.ucx_address)
        except InvalidRequestError as error:
            raise InvalidRequestError("ucx_address", error.message) from None
        send = CachedSend(request.request_id, tuple(request.prompt_token_ids),
                          request.cache_salt if request.HasField("cache_salt") else None, request.num_skip_blocks,
                          request.ucx_address, tuple(request.dst_block_ids), request.transfer_token)
        try:
            num_blocks = await self.runtime.engine.send_cached(send)
        except InvalidRequestError as error:
            if error.field != NOT_HELD_FIELD:
                raise
            self.num_refused += 1
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from None
        self.num_sends += 1
        self.num_blocks_sent += num_blocks
        logger.info("sending %d cached blocks of %s to %s", num_blocks, request.request_id, request.ucx_address)
        return pb.SendCachedBlocksResponse(num_blocks=num_blocks)
