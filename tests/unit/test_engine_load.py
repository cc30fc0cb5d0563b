"""The load an engine reports (shared.engine.introspection.engine_load): of its running
requests, those still without a first token count as prefilling; a gateway's admission limit
counts them with the queue, and not a colocated instance's decoding requests (which used to fill
the limit of 16 "waiting" prompts on a colocated instance at 4 requests/s, shedding 29 of 64)."""

from shared.engine import LLM, SamplingParams
from shared.engine.introspection import engine_load

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def test_running_requests_without_a_first_token_are_prefilling(tiny_llama_folder):
    llm = LLM(model=str(tiny_llama_folder), dtype="float32", block_size=4, num_blocks=64,
              max_num_batched_tokens=8, enable_prefix_caching=False)
    engine = llm.engine
    engine.add_request([11, 12, 13], GREEDY)  # fits one step
    engine.add_request(list(range(20, 40)), GREEDY)  # 20 tokens: three chunks of the step budget
    load = engine_load(engine.core)
    assert (load.num_waiting, load.num_running, load.num_prefilling) == (2, 0, 0)
    engine.step()
    load = engine_load(engine.core)
    assert (load.num_running, load.num_prefilling) == (2, 1)  # the short prompt decodes, the long one is mid-prompt
    while engine.has_unfinished_requests():
        engine.step()
    load = engine_load(engine.core)
    assert (load.num_running, load.num_prefilling, load.num_free_blocks) == (0, 0, load.num_total_blocks)
