"""`pdserve generate PROMPT [options]`: stream a completion from a running gateway.

The text goes to stdout as it arrives; a one-line summary (tokens, finish reason, cached
prompt tokens) goes to stderr. gRPC errors are reported on stderr with exit code 1.
"""

import argparse
import os
import sys

DEFAULT_GATEWAY = "127.0.0.1:50051"
GATEWAY_ENV_VAR = "PDSERVE_GATEWAY"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser("generate", help="stream a completion from a running gateway")
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens (default: 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 means greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: 1)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    parser.add_argument("--model", default="", help="model name (default: the gateway's)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="deadline (default: 300)")
    parser.add_argument("--gateway", default=os.environ.get(GATEWAY_ENV_VAR, DEFAULT_GATEWAY),
                        help=f"gateway address (default: ${GATEWAY_ENV_VAR} or {DEFAULT_GATEWAY})")
    parser.set_defaults(run=run)


def build_request(args: argparse.Namespace):
    """The GenerateRequest the flags describe."""
    from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2

    sampling = generation_pb2.SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    if args.top_p is not None:
        sampling.top_p = args.top_p
    if args.seed is not None:
        sampling.seed = args.seed
    request = gateway_pb2.GenerateRequest(model=args.model, sampling=sampling)
    if args.chat:
        request.chat.messages.add(role="user", content=args.prompt)
    else:
        request.text = args.prompt
    return request


def run(args: argparse.Namespace) -> int:
    import grpc

    from shared.pb.pdserve.v1 import gateway_pb2_grpc

    with grpc.insecure_channel(args.gateway) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        summary = _Summary()
        try:
            for message in stub.Generate(build_request(args), timeout=args.timeout_s):
                summary.show(message)
        except grpc.RpcError as error:
            if summary.num_tokens:
                sys.stdout.write("\n")
            print(f"pdserve generate: error: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    sys.stdout.write("\n")
    print(summary.line(), file=sys.stderr)
    return 0


class _Summary:
    """Writes each message's text to stdout and remembers what the summary line needs."""

    def __init__(self):
        self.num_tokens = 0
        self.finish_reason = 0
        self.cached_prompt_tokens = 0

    def show(self, message) -> None:
        sys.stdout.write(message.text)
        sys.stdout.flush()
        self.num_tokens += len(message.token_ids)
        self.finish_reason = message.finish_reason or self.finish_reason
        if message.HasField("usage"):
            self.cached_prompt_tokens = message.usage.cached_prompt_tokens

    def line(self) -> str:
        from shared.wire.outputs import finish_reason_from_proto

        name = finish_reason_from_proto(self.finish_reason) or "none"
        return (f"[{self.num_tokens} tokens, finish: {name}, "
                f"cached prompt tokens: {self.cached_prompt_tokens}]")
