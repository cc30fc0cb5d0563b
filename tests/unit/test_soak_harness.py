"""The soak benchmark's process-tree sampling and growth table: every process of a service's
tree gets its own stable name and row (an engine-core child included), a child that starts
late gets a row from its own samples, and the tree's total is reported beside them; the
instances' memory components are parsed and summarised per component."""

import os
import subprocess
import sys

from benchmarks.harness.process_tree import descendants, parent_pids, process_label, tree_resident_bytes
from benchmarks.harness.soak_report import MIB, rss_growth
from benchmarks.harness.soak_samples import MemorySample, parse_components
from benchmarks.soak_components import component_rows


def write_process(proc, pid: int, parent: int, argv: list[str], comm: str = "python3") -> None:
    folder = proc / str(pid)
    folder.mkdir()
    (folder / "stat").write_text(f"{pid} ({comm}) S {parent} {pid} 0 0 -1\n")
    (folder / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")


def test_descendants_are_found_at_every_depth_from_a_proc_listing(tmp_path):
    write_process(tmp_path, 10, 1, ["python", "-m", "services.prefill"])
    write_process(tmp_path, 12, 10, ["python", "-m", "shared.engine.core_process"], comm="a) b")
    write_process(tmp_path, 11, 10, ["/usr/bin/redis-server", "--port", "0"])
    write_process(tmp_path, 30, 12, ["python", "worker.py"])
    write_process(tmp_path, 20, 1, ["python", "-m", "services.decode"])
    (tmp_path / "self").mkdir()
    parents = parent_pids(tmp_path)
    assert parents == {10: 1, 11: 10, 12: 10, 20: 1, 30: 12}
    assert descendants(10, parents) == [11, 12, 30]
    assert descendants(20, parents) == []
    assert [process_label(pid, tmp_path) for pid in (10, 11, 12, 30, 99)] == [
        "prefill", "redis-server", "core_process", "worker.py", "99"]


def test_a_service_tree_reports_each_process_and_their_sum():
    child = subprocess.Popen([sys.executable, "-m", "json.tool"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        parents = {**parent_pids(), child.pid: os.getpid()}  # the child may not be listed yet
        rss = tree_resident_bytes("bench", os.getpid(), parents)
    finally:
        child.communicate(b"{}")
    assert rss["bench/tool"] > 0 and rss["bench"] > 0
    assert rss["bench (tree)"] == sum(value for name, value in rss.items() if name != "bench (tree)")


def test_growth_rows_cover_processes_that_appear_late():
    samples = [MemorySample(60.0 * minute, {"prefill-0": (1000 + 2 * minute) * MIB}) for minute in range(4)]
    for sample in samples[2:]:
        sample.rss_bytes["prefill-0/core_process"] = (500 + 10 * sample.elapsed_s / 60) * MIB
    rows = {row.process: row for row in rss_growth(samples, warmup_s=60.0)}
    assert abs(rows["prefill-0"].mib_per_minute - 2.0) < 1e-9
    assert abs(rows["prefill-0/core_process"].mib_per_minute - 10.0) < 1e-9
    assert rows["prefill-0/core_process"].start_mib == 520.0


def test_memory_components_and_arenas_are_read_from_metrics_text():
    text = ('pdserve:memory_bytes{component="kv_pool",instance="p"} 1.073741824e+09\n'
            'pdserve:memory_bytes{component="allocator_free",instance="p"} 2048.0\n'
            'pdserve:malloc_arenas{instance="p"} 5.0\n')
    assert parse_components(text) == {"kv_pool": 1 << 30, "allocator_free": 2048, "malloc_arenas": 5}


def test_component_rows_give_each_component_its_slope_after_the_warm_up():
    samples = [{"elapsed_s": 60.0 * minute, "rss_bytes": {},
                "components": {"prefill-0": {"allocator_free": (100 + 3 * minute) * MIB, "malloc_arenas": 4 + minute}}}
               for minute in range(5)]
    assert component_rows(samples, warmup_s=120.0, end_s=240.0) == [
        "| prefill-0 | allocator_free | 106 | 112 | 3.00 |", "| prefill-0 | malloc_arenas | 6 | 8 | 1.00 |"]
