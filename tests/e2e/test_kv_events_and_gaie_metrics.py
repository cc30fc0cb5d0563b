"""What a GAIE gateway reads from a real stack (separate processes, SmolLM2): the prefill
instance's KV-event stream shows BlockStored with hashes and the prompt's token ids after a chat
request, decoded with vLLM's schema, for its pool ("GPU") and its host tier ("CPU", the test
stacks run one); every instance's /metrics has the four metrics of GAIE's model-server protocol."""

import pytest
from transformers import AutoTokenizer

from tests.helpers.vllm_kv_events import BlockStored, Subscriber
from tests.unit.metrics_scrape import labels_of, scrape

MAX_TRIES = 5  # chats sent until one lands after the subscription (a SUB socket misses earlier ones)
GAIE_METRICS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                "vllm:lora_requests_info")


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


def stored_events(subscriber: Subscriber) -> list[BlockStored]:
    found = []
    while (message := subscriber.receive(3000)) is not None:
        found += [event for event in message[2].events if isinstance(event, BlockStored)]
        if found:
            while (more := subscriber.receive(500)) is not None:
                found += [event for event in more[2].events if isinstance(event, BlockStored)]
            return found
    return found


def test_a_chat_request_shows_up_as_block_stored_with_its_tokens(stack, client, smollm2_folder):
    subscriber = Subscriber(stack.stack.config.kv_events_endpoint)  # instance 0: prefill-0
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    try:
        for attempt in range(MAX_TRIES):
            marker = f"zebra{attempt}quasar"
            content = f"{marker} " + " ".join(f"word{i}" for i in range(60)) + ". Say ok."
            client.chat.completions.create(model=stack.model_folder.name, max_tokens=2, temperature=0,
                                           messages=[{"role": "user", "content": content}])
            events = stored_events(subscriber)
            if any(marker in tokenizer.decode(event.token_ids) for event in events if event.medium == "GPU"):
                break
        else:
            raise AssertionError(f"no BlockStored with the prompt's tokens after {MAX_TRIES} chats")
        for event in events:
            assert event.block_hashes and len(event.token_ids) == len(event.block_hashes) * event.block_size
            assert event.medium in ("GPU", "CPU")
    finally:
        subscriber.close()


def test_every_instance_serves_gaies_model_server_metrics(stack):
    for name in ("prefill-0", "decode-0"):
        samples = scrape(stack.stack.ready_info[name]["metrics_address"])
        for metric in GAIE_METRICS:
            assert labels_of(samples, metric), f"{name}: no {metric}"
        [lora] = labels_of(samples, "vllm:lora_requests_info")
        assert {"max_lora", "running_lora_adapters", "waiting_lora_adapters"} <= set(lora)
