"""The commands behind benchmarks.harness.netfault: iptables rules in the OUTPUT chain of
`lo`, cgroup-v2 groups that let a rule name a process tree, and `ss` to find and abort
connections.

Everything here is tagged so that a crashed run's leftovers can be found and removed
(netfault.remove_leftovers): every iptables rule carries a comment starting with RULE_TAG,
every cgroup lives under CGROUP_PARENT, and both names start with the pid of the process that
made them (`owned_name`), so that one run never removes what another, live run injected (a
test run beside a chaos benchmark).

Why these mechanisms. Every pdserve process on one machine talks over 127.0.0.1, so an address
cannot tell two instances apart; ports and processes can. A rule picks packets by port, in
both directions (a port's own packets by source port, its peers' by destination port), and
hands them to a delayer (NFQUEUE, benchmarks.harness.netfault_queue), drops them or answers
them with a reset. iptables also matches the sending socket's cgroup (`-m cgroup --path`), so a
rule can drop only what one process tree sends to another's ports: a partition of one pair
while the others still talk. On `lo` a packet is seen once on the way out (OUTPUT), which is
where the rules go.
"""

import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

DEVICE = "lo"
RULE_TAG = "pdserve-netfault"
CGROUP_PARENT = "pdserve-netfault"
MULTIPORT_MAX = 15  # ports per iptables multiport match
IPTABLES = ("iptables", "ip6tables")
OWNER_SEPARATOR = "."


class NetFaultError(RuntimeError):
    """A fault could not be injected or healed (the command and its message are named)."""


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetFaultError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


# ---- iptables: OUTPUT rules on lo, tagged ---------------------------------------------------

def port_groups(ports: Sequence[int]) -> list[str]:
    """`ports` as multiport lists of at most MULTIPORT_MAX."""
    ordered = sorted(set(ports))
    return [",".join(map(str, ordered[i:i + MULTIPORT_MAX])) for i in range(0, len(ordered), MULTIPORT_MAX)]


def rule_specs(tag: str, action: Sequence[str], cgroup: str | None, dports: Sequence[int] = (),
               sports: Sequence[int] = ()) -> list[list[str]]:
    """OUTPUT rules (without the table command) that apply `action` to TCP packets leaving
    `cgroup` (None: any process) for `dports`, or from `sports`; neither: all its packets."""
    owner = ["-m", "cgroup", "--path", cgroup] if cgroup else []
    comment = ["-m", "comment", "--comment", f"{RULE_TAG}:{tag}"]
    matches = [["-m", "multiport", "--dports", group] for group in port_groups(dports)]
    matches += [["-m", "multiport", "--sports", group] for group in port_groups(sports)]
    if not dports and not sports:
        matches = [[]]
    return [["OUTPUT", "-o", DEVICE, "-p", "tcp", *owner, *match, *comment, "-j", *action] for match in matches]


def insert_rules(specs: Iterable[list[str]]) -> list[list[str]]:
    """Insert each rule at the top of OUTPUT for IPv4 and IPv6; returns what was inserted (to delete)."""
    inserted = []
    for spec in specs:
        for table in IPTABLES:
            run([table, "-I", *spec])
            inserted.append([table, *spec])
    return inserted


def delete_rules(inserted: Iterable[list[str]]) -> None:
    for table, *spec in inserted:
        run([table, "-D", *spec], check=False)


def tagged_rules(table: str) -> list[list[str]]:
    """Our rules (any process's) still in `table`'s OUTPUT chain, as specs for `-D`."""
    listing = run([table, "-S", "OUTPUT"], check=False).stdout.splitlines()
    return [shlex.split(line)[1:] for line in listing if RULE_TAG in line and line.startswith("-A ")]


def owned_name(name: str) -> str:
    """`name` prefixed with this process's pid: a rule's tag, a cgroup's name."""
    return f"{os.getpid()}{OWNER_SEPARATOR}{name}"


def name_owner(name: str) -> int | None:
    """The pid an `owned_name` starts with (None: not one)."""
    owner, separator, _ = name.partition(OWNER_SEPARATOR)
    return int(owner) if separator and owner.isdigit() else None


def rule_owner(spec: Sequence[str]) -> int | None:
    """The pid that inserted a tagged rule (its comment's owned name), None if it names none."""
    for word in spec:
        if word.startswith(f"{RULE_TAG}:"):
            return name_owner(word.removeprefix(f"{RULE_TAG}:"))
    return None


def is_dead(pid: int | None) -> bool:
    """Whether `pid` names no live process (None, a name without an owner: not known dead)."""
    return pid is not None and not Path(f"/proc/{pid}").exists()


def rule_packets(table: str, tag: str) -> int:
    """Packets the rules tagged `tag` have matched in `table`'s OUTPUT chain."""
    listing = run([table, "-L", "OUTPUT", "-v", "-x", "-n"], check=False).stdout.splitlines()
    return sum(int(line.split()[0]) for line in listing if f"{RULE_TAG}:{tag} " in line + " ")


# ---- cgroups (v2) that name a process tree -------------------------------------------------

def cgroup2_root() -> Path | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup/unified on a hybrid host."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def current_cgroup(pid: int) -> str | None:
    """The v2 cgroup path of `pid` ("/" = the root), None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        return None
    return "/"


def move_to_cgroup(root: Path, path: str, pids: Iterable[int]) -> None:
    """Move each live pid (its whole thread group) into `path` (relative to `root`)."""
    procs = root / path.lstrip("/") / "cgroup.procs"
    for pid in pids:
        try:
            procs.write_text(str(pid))
        except ProcessLookupError:
            continue  # exited meanwhile
        except OSError as error:
            if error.errno != 3:  # ESRCH
                raise NetFaultError(f"cannot move pid {pid} into cgroup {path}: {error}") from error


def make_cgroup(root: Path, name: str) -> str:
    """A new empty cgroup under CGROUP_PARENT; returns its path for `iptables -m cgroup --path`."""
    path = f"{CGROUP_PARENT}/{name}"
    (root / path).mkdir(parents=True, exist_ok=True)
    return path


def remove_cgroup(root: Path, path: str) -> None:
    """Move any process still inside to the root cgroup, then remove the group."""
    directory = root / path
    if not directory.exists():
        return
    leftover = [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
    move_to_cgroup(root, "/", leftover)
    directory.rmdir()


# ---- processes and their listening ports ---------------------------------------------------

_SS_PID = re.compile(r"pid=(\d+)")


def listening_ports(pids: Iterable[int]) -> tuple[int, ...]:
    """TCP ports any of `pids` listens on (IPv4 and IPv6), sorted."""
    wanted = set(pids)
    ports = set()
    for line in run(["ss", "-ltnpH"]).stdout.splitlines():
        fields = line.split()
        if len(fields) < 6 or not wanted.intersection(int(p) for p in _SS_PID.findall(line)):
            continue
        ports.add(int(fields[3].rsplit(":", 1)[1]))
    return tuple(sorted(ports))


def established_connections(pids: Iterable[int], remote_ports: Iterable[int]) -> list[tuple[str, str]]:
    """(local "host:port", remote "host:port") of the TCP connections `pids` hold to `remote_ports`."""
    wanted, remote = set(pids), set(remote_ports)
    found = []
    for line in run(["ss", "-tnpH", "state", "established"]).stdout.splitlines():
        fields = line.split()
        if len(fields) < 5 or not wanted.intersection(int(p) for p in _SS_PID.findall(line)):
            continue
        local, peer = fields[2], fields[3]
        if int(peer.rsplit(":", 1)[1]) in remote:
            found.append((local, peer))
    return found


def kill_connection(local: str, peer: str) -> None:
    """Abort one TCP connection (both ends get a reset) with `ss -K`."""
    local_port, peer_port = local.rsplit(":", 1)[1], peer.rsplit(":", 1)[1]
    run(["ss", "-K", "-tn", "state", "established", f"( sport = :{local_port} and dport = :{peer_port} )"],
        check=False)


def missing_prerequisite() -> str | None:
    """Why faults cannot be injected here (not root, a tool missing, no cgroup v2), or None."""
    if os.geteuid() != 0:
        return "network faults need root (iptables, NFQUEUE, cgroups)"
    for tool in ("iptables", "ip6tables", "ss"):
        if run(["sh", "-c", f"command -v {tool}"], check=False).returncode != 0:
            return f"network faults need `{tool}` (Debian packages iproute2 and iptables)"
    if cgroup2_root() is None:
        return "network faults between processes need the cgroup v2 hierarchy mounted"
    return None
