"""One engine's KV-event stream: the log its pool, cache manager and tiers record into, and the
publisher its step hands each step's events to (`flush`)."""

import time

from shared.kv_events.config import KVEventsConfig
from shared.kv_events.log import KVEventLog
from shared.kv_events.publisher import KVEventPublisher
from shared.kv_events.wire import TYPES


class KVEventStream:
    def __init__(self, config: KVEventsConfig):
        self.config = config
        self.types = TYPES[config.wire_format]
        self.log = KVEventLog(self.types)
        self.publisher = KVEventPublisher(config)

    def flush(self) -> None:
        """Hand the events recorded since the last flush to the publisher as one batch."""
        events = self.log.drain()
        if events:
            self.publisher.publish(self.types.batch(time.time(), events, self.config.data_parallel_rank))

    @property
    def num_dropped(self) -> int:
        """Events the log dropped plus batches the publisher's full queue dropped."""
        return self.log.num_dropped + self.publisher.num_dropped

    def close(self) -> None:
        self.flush()
        self.publisher.close()
