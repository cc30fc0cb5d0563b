"""The gateway's read-only view of the cluster: live instances (cached briefly) and how much
of a prompt each one holds (one prefix-index round trip per request and hash recipe: each
instance is asked about the prompt hashed exactly as it hashes, from its registered cache
settings; one that registered none holds nothing). Every fresh listing goes through the
PairingMonitor, which logs prefill/decode pairs whose cache settings differ. Draining
instances (registered as DRAINING until their accepted work is done) are counted
(`draining()`) but never candidates, paired, or offered adapters.

Redis trouble never fails a request by itself: the last good listing is reused (logged) and
prefix overlap counts as zero. Each Redis read gives up after `redis_timeout_s`
(--redis-socket-timeout-s), so a request waits at most that long per read for an unreachable Redis. Right after Redis comes back (a failed listing before, or a new
run id: it restarted, possibly empty), the registry is only partial until every instance has
beaten again: for `reconnect_grace_s` a listing adds to the last view instead of replacing it,
and prefix-index garbage collection waits. Instances that failed a call recently are marked suspect for
`suspect_s`, so routing tries them last until their registration lapses.
"""

import asyncio
import logging
import time
from collections.abc import Callable

from shared.cluster.cache_settings import hash_recipe
from shared.cluster.instances import InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.prefix_index import PrefixIndex
from shared.kv_cache.block_hash import HashRecipe

from services.gateway.pairing import PairingMonitor
from services.gateway.prompt_hashes import PromptHashes
from services.gateway.router import Candidate

logger = logging.getLogger(__name__)

Listing = list[tuple[InstanceInfo, InstanceLoad]]


class ClusterView:
    def __init__(self, registry: InstanceRegistry, prefix_index: PrefixIndex, cache_s: float = 0.5,
                 suspect_s: float = 5.0, reconnect_grace_s: float = 5.0, redis_timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.prefix_index = prefix_index
        self.cache_s = cache_s
        self.suspect_s = suspect_s
        self.reconnect_grace_s = reconnect_grace_s
        self.redis_timeout_s = redis_timeout_s
        self.clock = clock
        self.num_redis_errors = 0
        self._listing: Listing | None = None  # instances that take new work
        self._registered: Listing = []  # ... and the draining ones
        self._listed_at = float("-inf")
        self._suspect_until: dict[str, float] = {}
        self._redis_run_id: str | None = None
        self._had_error = False
        self._grace_until = float("-inf")
        self.pairing = PairingMonitor()

    async def live(self) -> Listing:
        """Live instances, from a listing at most cache_s old (or the last good one)."""
        now = self.clock()
        if self._listing is not None and now - self._listed_at < self.cache_s:
            return self._listing
        try:
            async with asyncio.timeout(self.redis_timeout_s):
                listing = await self.registry.list_live(include_draining=True)
                run_id = await self.registry.server_run_id()
        except Exception as error:  # noqa: BLE001 - Redis down: keep serving with what we knew
            self.num_redis_errors += 1
            self._had_error = True
            logger.warning("listing instances failed (%r); using the last listing", error)
            return self._listing or []
        self._note_reconnect(run_id, now)
        if self.is_reconnecting() and self._listing is not None:
            listing = _merged(listing, self._registered)
        self._registered = listing
        self._listing, self._listed_at = [record for record in listing if not record[0].is_draining], now
        self.pairing.observe(self._listing)
        return self._listing

    def draining(self) -> Listing:
        """The draining instances of the last listing (no Redis call)."""
        return [record for record in self._registered if record[0].is_draining]

    def is_reconnecting(self) -> bool:
        """True within the grace period after Redis came back (the registry may be partial)."""
        return self.clock() < self._grace_until

    def _note_reconnect(self, run_id: str, now: float) -> None:
        is_restarted = self._redis_run_id is not None and run_id != self._redis_run_id
        if self._had_error or is_restarted:
            logger.warning("Redis is back%s; keeping the last view of the instances for %.1f s",
                           " (restarted)" if is_restarted else "", self.reconnect_grace_s)
            self._grace_until = now + self.reconnect_grace_s
        self._had_error, self._redis_run_id = False, run_id

    async def candidates(self, prompt: PromptHashes) -> list[Candidate]:
        """Every live instance with the number of leading prompt blocks it holds, in its pool
        and (beyond those) in its host's KV tiers. For a LoRA adapter's request, only the
        instances that serve the adapter (with the key most of them registered: the same
        files), its key then set on `prompt`, each marked when it holds the adapter in memory."""
        listing = await self.live()
        if prompt.adapter is not None:
            listing = _serving_adapter(listing, prompt)
        overlap, tier_overlap = await self._overlap(prompt, listing)
        now = self.clock()
        candidates = []
        for info, load in listing:
            prefix_blocks = overlap.get(info.instance_id, 0)
            tier_blocks = max(0, tier_overlap.get(info.kv_tier_id, 0) - prefix_blocks) if info.kv_tier_id else 0
            candidates.append(Candidate(
                instance_id=info.instance_id, role=info.role, grpc_address=info.grpc_address,
                prefix_blocks=prefix_blocks, tier_blocks=tier_blocks,
                free_blocks=load.num_free_blocks, total_blocks=load.num_total_blocks,
                num_running=load.num_running_requests, queue_depth=load.queue_depth,
                is_suspect=self._suspect_until.get(info.instance_id, 0.0) > now, cache=info.cache,
                kv_protocol_version=info.kv_protocol_version, pdserve_version=info.pdserve_version,
                has_adapter=prompt.adapter is not None and prompt.adapter in load.resident_lora_adapters))
        return candidates

    async def _overlap(self, prompt: PromptHashes, listing: Listing) -> tuple[dict[str, int], dict[str, int]]:
        """Leading blocks held, per instance and per host tier: one lookup per hash recipe."""
        by_recipe: dict[HashRecipe, tuple[list[str], set[str]]] = {}
        for info, _ in listing:
            if info.cache is not None:
                instance_ids, tier_ids = by_recipe.setdefault(hash_recipe(info.cache), ([], set()))
                instance_ids.append(info.instance_id)
                if info.kv_tier_id:
                    tier_ids.add(info.kv_tier_id)
        overlap: dict[str, int] = {}
        tier_overlap: dict[str, int] = {}
        for recipe, (instance_ids, tier_ids) in by_recipe.items():
            block_hashes = prompt.for_recipe(recipe)
            if not block_hashes:
                continue
            try:
                async with asyncio.timeout(self.redis_timeout_s):
                    overlap.update(await self.prefix_index.longest_prefix(block_hashes, instance_ids))
                    if tier_ids:
                        tier_overlap.update(await self.prefix_index.longest_tier_prefix(block_hashes, tier_ids))
            except Exception as error:  # noqa: BLE001 - route by load alone
                self.num_redis_errors += 1
                logger.warning("prefix lookup failed (%r); routing by load", error)
                return {}, {}
        return overlap, tier_overlap

    def refresh(self) -> None:
        """List the instances again on the next call (their registrations changed)."""
        self._listed_at = float("-inf")

    def mark_failed(self, instance_id: str) -> None:
        """An instance failed a call: try it last for a while, and re-list soon."""
        now = self.clock()
        self._suspect_until = {i: t for i, t in self._suspect_until.items() if t > now}
        self._suspect_until[instance_id] = now + self.suspect_s
        self._listed_at = float("-inf")

    async def collect_garbage_forever(self, interval_s: float) -> None:
        """Drop the prefix-index entries of instances whose registration lapsed (killed or
        partitioned ones never clean up after themselves). Runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            if self.is_reconnecting():
                continue
            try:
                async with asyncio.timeout(self.redis_timeout_s):
                    live_ids = await self.registry.live_instance_ids(include_draining=True)
                    dropped = await self.prefix_index.collect_garbage(live_ids)
            except Exception as error:  # noqa: BLE001 - Redis down: try again next round
                logger.warning("prefix-index garbage collection failed (%r)", error)
                continue
            if dropped:
                logger.info("dropped the prefix index of dead instances %s", dropped)

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(self.redis_timeout_s):
                return bool(await self.registry.redis.ping())
        except Exception:  # noqa: BLE001
            return False


def _serving_adapter(listing: Listing, prompt: PromptHashes) -> Listing:
    keys = [info.adapter_key(prompt.adapter) for info, _ in listing]
    counts = {key: keys.count(key) for key in keys if key is not None}
    if not counts:
        return []
    prompt.adapter_key = max(sorted(counts), key=counts.get)
    return [(info, load) for (info, load), key in zip(listing, keys) if key == prompt.adapter_key]


def live_adapters(listing: Listing) -> set[str]:
    """Names of the LoRA adapters some live instance serves."""
    return {name for info, _ in listing for name, _ in info.lora_adapters}


def _merged(fresh: Listing, last: Listing) -> Listing:
    """The fresh listing plus the last view's instances it lacks, sorted by instance id."""
    fresh_ids = {info.instance_id for info, _ in fresh}
    kept = [(info, load) for info, load in last if info.instance_id not in fresh_ids]
    return sorted(fresh + kept, key=lambda record: record[0].instance_id)
