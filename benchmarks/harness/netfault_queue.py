"""A packet delayer on an NFQUEUE: latency, jitter, reordering, loss and a bandwidth cap for
the packets iptables hands it (benchmarks.harness.netfault starts one per fault).

    python -m benchmarks.harness.netfault_queue --queue 4242 --delay-ms 200 --jitter-ms 50

Why not tc netem: this machine's kernel has neither netem nor prio compiled in
(CONFIG_NET_SCH_NETEM is off; `tc qdisc add ... netem` says "Specified qdisc kind is
unknown"), but it has NFQUEUE. iptables queues the chosen packets to this process, which
gives each its verdict (accept or drop) when its time comes, out of order when they should
overtake each other. Each packet is delayed `delay_ms` plus a uniform draw in +-`jitter_ms`;
`reorder_percent` of them go at once instead (they overtake the delayed ones); `loss_percent`
are dropped; with `mbit` the packets also leave no faster than that rate (paced by their IP
length). It prints "ready" once bound; on SIGUSR1 it prints what it has done so far, one line
`stats queued=N delayed=N dropped=N longest_hold_ms=X` (a delayed packet: one held past its
arrival; the fault's verification reads it); on SIGTERM or SIGINT it releases every packet it
still holds before it exits (its iptables rules have `--queue-bypass`: with nobody listening,
packets pass untouched).

The netlink messages are nfnetlink_queue's (linux/netfilter/nfnetlink_queue.h), built here
with struct: no C library needed.
"""

import argparse
import heapq
import itertools
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQNL_CFG_CMD_BIND = 1
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQA_CFG_F_FAIL_OPEN = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_PAYLOAD = 1, 2, 10
NFQNL_COPY_PACKET = 2
NLM_F_REQUEST, NLMSG_ERROR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1
COPY_BYTES = 40  # enough for the IPv4 or IPv6 header's length field
MAX_QUEUED = 65536
_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("!BBH")
_NLATTR = struct.Struct("=HH")


def _attribute(kind: int, data: bytes) -> bytes:
    padded = data + b"\0" * (-len(data) % 4)
    return _NLATTR.pack(_NLATTR.size + len(data), kind) + padded


def _message(msg_type: int, queue: int, attributes: bytes, family: int = socket.AF_UNSPEC) -> bytes:
    body = _NFGENMSG.pack(family, 0, queue) + attributes
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, NLM_F_REQUEST, 0, 0)
    return header + body


def _attributes(data: bytes) -> dict[int, bytes]:
    found, offset = {}, 0
    while offset + _NLATTR.size <= len(data):
        length, kind = _NLATTR.unpack_from(data, offset)
        if length < _NLATTR.size:
            break
        found[kind & 0x3FFF] = data[offset + _NLATTR.size:offset + length]
        offset += (length + 3) & ~3
    return found


def _packet_length(payload: bytes) -> int:
    """The packet's length from its IP header (IPv4 total length, IPv6 payload length + 40)."""
    if len(payload) >= 4 and payload[0] >> 4 == 4:
        return struct.unpack_from("!H", payload, 2)[0]
    if len(payload) >= 6 and payload[0] >> 4 == 6:
        return struct.unpack_from("!H", payload, 4)[0] + 40
    return len(payload)


class PacketQueue:
    """One bound NFQUEUE: `packets()` yields (packet id, length); `verdict(id, accept)` answers."""

    def __init__(self, queue: int):
        self.queue = queue
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))
        self._send(NFQNL_MSG_CONFIG, _attribute(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)))
        self._send(NFQNL_MSG_CONFIG, _attribute(NFQA_CFG_PARAMS, struct.pack("!IB", COPY_BYTES, NFQNL_COPY_PACKET))
                   + _attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", MAX_QUEUED)))
        self._send(NFQNL_MSG_CONFIG, _attribute(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))
                   + _attribute(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)))

    def _send(self, msg_type: int, attributes: bytes) -> None:
        self.sock.send(_message(msg_type, self.queue, attributes))

    def verdict(self, packet_id: int, accept: bool) -> None:
        verdict = struct.pack("!II", NF_ACCEPT if accept else NF_DROP, packet_id)
        self._send(NFQNL_MSG_VERDICT, _attribute(NFQA_VERDICT_HDR, verdict))

    def packets(self) -> list[tuple[int, int]]:
        """The packets in one receive (non-blocking: [] when none)."""
        try:
            data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as error:  # ENOBUFS: the kernel dropped messages; carry on
            print(f"netfault_queue: {error}", file=sys.stderr, flush=True)
            return []
        found, offset = [], 0
        while offset + _NLMSGHDR.size <= len(data):
            length, msg_type, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                break
            if msg_type == NLMSG_ERROR:
                code = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)[0]
                if code:
                    raise OSError(-code, f"nfnetlink_queue refused a message (queue {self.queue})")
            elif msg_type & 0xFF == NFQNL_MSG_PACKET:
                attributes = _attributes(data[offset + _NLMSGHDR.size + _NFGENMSG.size:offset + length])
                if NFQA_PACKET_HDR in attributes:
                    packet_id = struct.unpack_from("!I", attributes[NFQA_PACKET_HDR])[0]
                    found.append((packet_id, _packet_length(attributes.get(NFQA_PAYLOAD, b""))))
            offset += (length + 3) & ~3
        return found


class Schedule:
    """When each packet leaves (or that it is dropped), from the fault's parameters."""

    def __init__(self, delay_ms: float, jitter_ms: float, reorder_percent: float, loss_percent: float,
                 mbit: float, seed: int):
        self.delay_s, self.jitter_s = delay_ms / 1e3, jitter_ms / 1e3
        self.reorder, self.loss = reorder_percent / 100, loss_percent / 100
        self.bytes_per_s = mbit * 1e6 / 8 if mbit > 0 else 0.0
        self.random = random.Random(seed)
        self._paced_until = 0.0

    def release_time(self, now: float, num_bytes: int) -> float | None:
        """When to accept a packet arriving `now`; None: drop it."""
        if self.loss and self.random.random() < self.loss:
            return None
        release = now
        if not (self.reorder and self.random.random() < self.reorder):
            release += max(0.0, self.delay_s + self.random.uniform(-self.jitter_s, self.jitter_s))
        if self.bytes_per_s:
            self._paced_until = max(self._paced_until, release) + num_bytes / self.bytes_per_s
            release = self._paced_until
        return release


@dataclass
class Stats:
    """What the delayer did so far (printed on SIGUSR1)."""

    queued: int = 0
    delayed: int = 0  # held past their arrival
    dropped: int = 0
    longest_hold_s: float = 0.0

    def count(self, now: float, release: float | None) -> None:
        self.queued += 1
        if release is None:
            self.dropped += 1
        elif release > now:
            self.delayed += 1
            self.longest_hold_s = max(self.longest_hold_s, release - now)

    @classmethod
    def parse(cls, line: str) -> "Stats":
        """The line `line()` printed."""
        fields = dict(word.split("=", 1) for word in line.split()[1:])
        return cls(int(fields["queued"]), int(fields["delayed"]), int(fields["dropped"]),
                   float(fields["longest_hold_ms"]) / 1000)

    def line(self) -> str:
        return (f"stats queued={self.queued} delayed={self.delayed} dropped={self.dropped} "
                f"longest_hold_ms={1000 * self.longest_hold_s:.1f}")


def serve(queue: PacketQueue, schedule: Schedule) -> None:
    held: list[tuple[float, int, int]] = []  # (release time, arrival order, packet id)
    order = itertools.count()
    stats, stopping, stats_asked = Stats(), [], []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    signal.signal(signal.SIGUSR1, lambda *_: stats_asked.append(True))
    # A signal wakes the select below at once (Python retries a select a signal interrupted,
    # so without this a long hold would keep the packets until the next one arrived).
    wakeup, wakeup_writer = socket.socketpair()
    wakeup_writer.setblocking(False)
    signal.set_wakeup_fd(wakeup_writer.fileno())
    print("ready", flush=True)
    while not stopping:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else 0.5
        try:
            select.select([queue.sock, wakeup], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for packet_id, num_bytes in queue.packets():
            release = schedule.release_time(now, num_bytes)
            stats.count(now, release)
            if release is None:
                queue.verdict(packet_id, accept=False)
            else:
                heapq.heappush(held, (release, next(order), packet_id))
        while held and held[0][0] <= time.monotonic():
            queue.verdict(heapq.heappop(held)[2], accept=True)
        while stats_asked:
            stats_asked.pop()
            print(stats.line(), flush=True)
    for _, _, packet_id in sorted(held):  # healed: what is still held goes now, in order
        queue.verdict(packet_id, accept=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue", type=int, required=True, help="NFQUEUE number (iptables --queue-num)")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--reorder-percent", type=float, default=0.0)
    parser.add_argument("--loss-percent", type=float, default=0.0)
    parser.add_argument("--mbit", type=float, default=0.0, help="bandwidth cap (0 = none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    schedule = Schedule(args.delay_ms, args.jitter_ms, args.reorder_percent, args.loss_percent, args.mbit, args.seed)
    serve(PacketQueue(args.queue), schedule)


if __name__ == "__main__":
    main()
