"""The restart board: what the supervisor of `pdserve up` publishes to Redis for `pdserve status`.

One hash per deployment (`pdserve:{deployment}:supervisor`, see shared.cluster.keys), one field
per child: JSON {role, state, restarts, last_exit_code}. The key carries a short TTL that every
publish refreshes, so a stopped launcher's board disappears by itself. Publishing is best
effort: Redis being down (or restarting) never disturbs supervision.
"""

import json
import logging

import redis

from shared.cluster.keys import supervisor_key

logger = logging.getLogger(__name__)

BOARD_TTL_S = 10
TIMEOUT_S = 0.5


def publish_records(redis_url: str, deployment: str, records) -> None:
    """Write every ChildRecord's state (best effort)."""
    if not records:
        return
    fields = {record.name: json.dumps({"role": record.role, "state": record.state,
                                       "restarts": record.num_restarts,
                                       "last_exit_code": record.last_exit_code})
              for record in records}
    key = supervisor_key(deployment)
    try:
        with redis.Redis.from_url(redis_url, socket_timeout=TIMEOUT_S,
                                  socket_connect_timeout=TIMEOUT_S) as client:
            with client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=fields)
                pipe.expire(key, BOARD_TTL_S)
                pipe.execute()
    except redis.RedisError as error:
        logger.debug("restart board not published: %r", error)


def parse_board(hash_fields: dict) -> dict[str, dict]:
    """HGETALL reply of the board -> {child name: {role, state, restarts, last_exit_code}}."""
    board = {}
    for name, value in hash_fields.items():
        name = name.decode() if isinstance(name, bytes) else name
        try:
            board[name] = json.loads(value)
        except ValueError:
            continue
    return dict(sorted(board.items()))
