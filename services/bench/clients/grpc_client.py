"""`--backend pdserve-grpc`: streaming `Generate` on pdserve's gateway, prompts as token ids."""

import time
import uuid

import grpc

from services.bench.clients.base import ClientOptions
from services.bench.datasets import BenchPrompt
from services.bench.records import RequestRecord
from shared.pb.pdserve.v1 import gateway_pb2, gateway_pb2_grpc, generation_pb2


class GrpcGatewayClient:
    """One grpc.aio channel shared by every request of the run."""

    def __init__(self, options: ClientOptions):
        self.options = options
        self.channel = grpc.aio.insecure_channel(options.target)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self.run_id = uuid.uuid4().hex[:8]

    def build_request(self, prompt: BenchPrompt, index: int) -> gateway_pb2.GenerateRequest:
        sampling = generation_pb2.SamplingParams(
            max_tokens=prompt.output_len, temperature=self.options.temperature,
            ignore_eos=self.options.ignore_eos)
        return gateway_pb2.GenerateRequest(
            request_id=f"bench-{self.run_id}-{index}", model=self.options.model,
            token_ids=gateway_pb2.TokenIds(ids=prompt.prompt_token_ids), sampling=sampling)

    async def send(self, prompt: BenchPrompt, record: RequestRecord) -> None:
        started = time.perf_counter()
        try:
            call = self.stub.Generate(self.build_request(prompt, record.index), timeout=self.options.timeout_s)
            async for message in call:
                record.add_chunk(time.perf_counter() - started, len(message.token_ids))
                if message.HasField("usage"):
                    record.reported_output_len = message.usage.completion_tokens
        except grpc.aio.AioRpcError as error:
            record.error = f"{error.code().name}: {error.details()}"
        except Exception as error:  # a broken client must not stop the benchmark
            record.error = f"{type(error).__name__}: {error}"
        record.end_s = time.perf_counter() - started

    async def close(self) -> None:
        await self.channel.close()
