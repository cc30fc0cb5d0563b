"""Sends batches of KV events on a ZeroMQ PUB socket from a thread of its own, so that an
engine step never waits for the network or for encoding.

Each message is three frames, as vLLM's ZmqEventPublisher sends them: the topic, an 8-byte
big-endian sequence number (0 for the first batch of this publisher) and the MessagePack
batch. `publish` only puts the batch on a bounded queue; when the queue is full the batch is
dropped and counted (`num_dropped`). A subscriber that reads too slowly loses messages at the
socket's high-water mark, as with vLLM.
"""

import logging
import queue
import threading

import msgspec
import zmq

from shared.errors import ConfigurationError
from shared.kv_events.config import KVEventsConfig

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 2.0


class KVEventPublisher:
    def __init__(self, config: KVEventsConfig):
        self.config = config
        self.num_published = 0
        self.num_dropped = 0
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_batches)
        self._socket = self._open_socket(config)
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    @staticmethod
    def _open_socket(config: KVEventsConfig) -> zmq.Socket:
        socket = zmq.Context.instance().socket(zmq.PUB)
        socket.setsockopt(zmq.SNDHWM, config.send_hwm)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            if config.binds:
                socket.bind(config.endpoint)
            else:
                socket.connect(config.endpoint)
        except zmq.ZMQError as error:
            socket.close()
            raise ConfigurationError("kv_events_endpoint", f"cannot open {config.endpoint!r}: {error}") from None
        return socket

    def publish(self, batch) -> None:
        """Queue one batch (never waits; a full queue drops it)."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.num_dropped += 1

    def close(self) -> None:
        """Send what is queued (for up to CLOSE_TIMEOUT_S), then close the socket."""
        try:
            self._queue.put(None, timeout=CLOSE_TIMEOUT_S)
        except queue.Full:
            logger.warning("KV events publisher: queue still full at close; %d batches unsent", self._queue.qsize())
        self._thread.join(CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._socket.close()

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        topic = self.config.topic.encode()
        while (batch := self._queue.get()) is not None:
            try:
                self._socket.send_multipart((topic, self.num_published.to_bytes(8, "big"), encoder.encode(batch)))
                self.num_published += 1
            except zmq.ZMQError as error:  # the socket is gone: nothing more can be sent
                logger.warning("KV events publisher stopped: %r", error)
                return
