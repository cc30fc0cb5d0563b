"""A service's whole process tree, read from /proc: the service process and every process it
started (an engine-core child, its rank workers), each with a name that stays the same across
samples, for the soak benchmark's per-process RSS."""

import os
from collections import Counter
from pathlib import Path

from shared.memory.process import resident_bytes

PROC = Path("/proc")


def parent_pids(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid of every process visible now (processes that vanish mid-read are left out)."""
    parents = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int, parents: dict[int, int]) -> list[int]:
    """Every process below `pid`, breadth first, in pid order within each level."""
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    found, level = [], [pid]
    while level:
        level = sorted(child for parent in level for child in children.get(parent, []))
        found += level
    return found


def process_label(pid: int, proc: Path = PROC) -> str:
    """What a process runs: the module of `python -m MODULE` (its last part), else the program's name."""
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    args = [arg.decode(errors="replace") for arg in argv if arg]
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1].rsplit(".", 1)[-1]
    if args and os.path.basename(args[0]).startswith("python") and len(args) > 1:
        return os.path.basename(args[1])  # a script
    return os.path.basename(args[0]) if args else str(pid)


def tree_resident_bytes(name: str, pid: int, parents: dict[int, int], proc: Path = PROC) -> dict[str, int]:
    """RSS of `name`'s process and of each of its descendants ("NAME/LABEL", "NAME/LABEL#2" for a
    second of the same label), plus "NAME (tree)", their sum, when there is more than one."""
    rss = {name: resident_bytes(pid)}
    seen: Counter[str] = Counter()
    for child in descendants(pid, parents):
        label, child_bytes = process_label(child, proc), resident_bytes(child)
        if not child_bytes:  # exited since the listing
            continue
        seen[label] += 1
        rss[f"{name}/{label}" + (f"#{seen[label]}" if seen[label] > 1 else "")] = child_bytes
    if len(rss) > 1:
        rss[f"{name} (tree)"] = sum(rss.values())
    return rss
