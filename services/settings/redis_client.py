"""The Redis client of a gateway or an engine instance, with its timeouts as settings.

Every Redis call of a serving process is bounded by these settings, never by redis-py's
defaults (5 s socket timeouts and 10 retries with backoff, which let one command of a process
cut from Redis wait about a minute):

- `--redis-socket-timeout-s`: longest one Redis command waits for its reply. It also bounds
  each Redis operation as a whole (a heartbeat, a lease-mirror write, a prefix-index update, a
  gateway's routing read): a process cut from Redis gives up on it after this long and goes on
  without it (the next heartbeat retries; the gateway routes on its last listing);
- `--redis-connect-timeout-s`: longest opening a connection to Redis may take;
- `--redis-retries`: a command that fails on a connection error or a timeout is sent again
  this many times, on a fresh connection (a restarted Redis leaves the pool's connections
  dead: the retry reconnects at once). Retries only help within the operation's bound;
- `--redis-health-check-interval-s`: a pooled connection idle longer than this is checked with
  a PING before it is used (0 = never).
"""

import redis.asyncio
from pydantic import Field
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from services.settings.service_settings import ServiceSettings

# Backoff between a command's retries: 10 ms doubling, at most 0.1 s (an operation is bounded
# by the socket timeout anyway).
RETRY_BACKOFF_BASE_S = 0.01
RETRY_BACKOFF_CAP_S = 0.1


class RedisClientSettings(ServiceSettings):
    """The Redis client settings every serving process shares."""

    redis_socket_timeout_s: float = Field(
        2.0, gt=0, description="longest one Redis command waits for its reply, and one Redis operation (a "
                               "heartbeat, a lease-mirror write, a gateway's routing read) as a whole: cut from "
                               "Redis, the process gives up on it after this long and goes on without it")
    redis_connect_timeout_s: float = Field(2.0, gt=0, description="longest opening a connection to Redis may take")
    redis_retries: int = Field(
        1, ge=0, description="times a Redis command that failed on a connection error or a timeout is sent again, "
                             "on a fresh connection, within the operation's bound (0 = never)")
    redis_health_check_interval_s: float = Field(
        0.0, ge=0, description="PING a pooled Redis connection idle longer than this before using it (0 = never)")


def redis_client(settings: RedisClientSettings, url: str) -> redis.asyncio.Redis:
    """An asyncio Redis client for `url` with `settings`' timeouts, retries and health checks."""
    return redis.asyncio.Redis.from_url(
        url, socket_timeout=settings.redis_socket_timeout_s,
        socket_connect_timeout=settings.redis_connect_timeout_s,
        health_check_interval=settings.redis_health_check_interval_s,
        retry=Retry(ExponentialBackoff(cap=RETRY_BACKOFF_CAP_S, base=RETRY_BACKOFF_BASE_S), settings.redis_retries))
