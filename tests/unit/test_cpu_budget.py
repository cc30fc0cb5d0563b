"""CPU budget (affinity mask, cgroup quota), OpenMP environment, and the launcher's CPU plan."""

import os

import pytest

from services.launcher.commands import instance_argv
from services.launcher.config import StackConfig
from services.launcher.cpu_plan import InstanceCpus, cpus_for_new_instance, plan_instance_cpus, resolve_cpu_layout
from shared.errors import ConfigurationError
from shared.model import cpu_budget as budget


def fake_cgroup_v2(tmp_path, cpu_max: str | None):
    group = tmp_path / "user.slice" / "job"
    group.mkdir(parents=True)
    if cpu_max is not None:
        (group / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/user.slice/job\n")
    return tmp_path, proc


@pytest.mark.parametrize("cpu_max, expected", [("max 100000", None), ("150000 100000", 1.5), ("50000 100000", 0.5)])
def test_cgroup_v2_quota_is_read_from_cpu_max(tmp_path, cpu_max, expected):
    root, proc = fake_cgroup_v2(tmp_path, cpu_max)
    assert budget.cgroup_cpu_quota(root, proc) == expected


def test_a_quota_on_a_parent_cgroup_applies(tmp_path):
    root, proc = fake_cgroup_v2(tmp_path, None)
    (root / "user.slice" / "cpu.max").write_text("100000 100000\n")
    assert budget.cgroup_cpu_quota(root, proc) == 1.0


def test_cgroup_v1_quota_is_read_from_cfs_files(tmp_path):
    group = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text("300000\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("5:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    assert budget.cgroup_cpu_quota(tmp_path, proc) == 3.0


def test_budget_is_the_smaller_of_mask_and_quota_and_at_least_one(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "allowed_cpus", lambda: [0, 1, 2, 3])
    root, proc = fake_cgroup_v2(tmp_path, "250000 100000")
    assert budget.cpu_budget(root, proc) == 2
    (root / "user.slice" / "job" / "cpu.max").write_text("20000 100000\n")
    assert budget.cpu_budget(root, proc) == 1
    (root / "user.slice" / "job" / "cpu.max").write_text("max 100000\n")
    assert budget.cpu_budget(root, proc) == 4


def test_budget_never_exceeds_the_affinity_mask():
    assert 1 <= budget.cpu_budget() <= len(os.sched_getaffinity(0))


def test_default_threads_follow_omp_num_threads_when_set(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert budget.default_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "x")
    assert budget.default_num_threads() == budget.cpu_budget()


def test_omp_environment_bounds_spinning_unless_told_otherwise():
    assert budget.omp_environment(3, {}) == {"OMP_NUM_THREADS": "3", "GOMP_SPINCOUNT": "20000"}
    assert budget.omp_environment(1, {"GOMP_SPINCOUNT": "1000"}) == {"OMP_NUM_THREADS": "1"}
    assert budget.omp_environment(1, {"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_NUM_THREADS": "1"}


def plan(num_prefill=1, num_decode=1, cpus=(0, 1, 2, 3, 4), cpu_layout="disjoint", **kwargs):
    config = StackConfig(num_prefill=num_prefill, num_decode=num_decode, cpu_layout=cpu_layout, **kwargs)
    return plan_instance_cpus(config, config.instance_roles(), list(cpus))


def test_instances_get_disjoint_cores_and_one_thread_per_core():
    assert plan(num_prefill=1, num_decode=2) == {
        "prefill-0": InstanceCpus((0, 1), 2), "decode-0": InstanceCpus((2, 3), 2), "decode-1": InstanceCpus((4,), 1)}
    assert plan(cpus=(0, 1)) == {"prefill-0": InstanceCpus((0,), 1), "decode-0": InstanceCpus((1,), 1)}


def test_shared_layout_runs_every_instance_over_every_core():
    assert plan(cpus=(0, 1), cpu_layout="shared") == {"prefill-0": InstanceCpus((0, 1), 2),
                                                      "decode-0": InstanceCpus((0, 1), 2)}
    assert plan(cpus=(0, 1), cpu_layout="shared", num_threads=1)["decode-0"] == InstanceCpus((0, 1), 1)
    assert plan(cpus=(0, 1), cpu_layout="shared", prefill_cpus=(0,), decode_cpus=(1,)) == plan(
        cpus=(0, 1), prefill_cpus=(0,), decode_cpus=(1,))  # explicit lists win over the layout


def test_auto_layout_shares_cores_only_where_bf16_matmuls_run_in_hardware():
    assert resolve_cpu_layout("auto", frozenset({"avx512f", "avx512_bf16", "amx_bf16"})) == "shared"
    assert resolve_cpu_layout("auto", frozenset({"avx512f", "avx512_bf16"})) == "shared"
    assert resolve_cpu_layout("auto", frozenset({"avx2", "avx512f", "avx512_vnni"})) == "disjoint"
    assert resolve_cpu_layout("disjoint", frozenset({"amx_bf16"})) == "disjoint"
    assert resolve_cpu_layout("shared", frozenset()) == "shared"


def test_an_unknown_cpu_layout_is_refused_naming_the_setting():
    with pytest.raises(ConfigurationError, match="cpu_layout"):
        StackConfig(cpu_layout="pinned")


def test_up_cpu_layout_flag_reaches_the_stack_config():
    from services.cli import up_command
    from services.cli.main import build_parser
    from services.launcher.config import CPU_LAYOUTS
    assert up_command.CPU_LAYOUTS == CPU_LAYOUTS
    parse = build_parser().parse_args
    assert up_command.config_from_args(parse(["up"])).cpu_layout == "auto"
    assert up_command.config_from_args(parse(["up", "--cpu-layout", "shared"])).cpu_layout == "shared"
    with pytest.raises(SystemExit):
        parse(["up", "--cpu-layout", "pinned"])


def test_fewer_cores_than_instances_float_with_one_thread_each():
    assert plan(num_prefill=2, num_decode=2, cpus=(0, 1)) == {
        name: InstanceCpus(None, 1) for name in ("prefill-0", "prefill-1", "decode-0", "decode-1")}


def test_explicit_cpu_lists_are_shared_by_their_role_and_num_threads_wins():
    assert plan(num_prefill=2, prefill_cpus=(0, 1), decode_cpus=(2, 3, 4)) == {
        "prefill-0": InstanceCpus((0, 1), 1), "prefill-1": InstanceCpus((0, 1), 1),
        "decode-0": InstanceCpus((2, 3, 4), 3)}
    assert plan(num_threads=3)["decode-0"] == InstanceCpus((3, 4), 3)


def test_scale_out_instances_float_with_their_share_of_threads():
    config = StackConfig()
    assert cpus_for_new_instance(config, "decode", 3, [0, 1, 2, 3, 4, 5]) == InstanceCpus(None, 2)
    assert cpus_for_new_instance(StackConfig(decode_cpus=(1,)), "decode", 3, [0, 1]) == InstanceCpus((1,), 1)


def test_instance_command_line_carries_threads_and_deterministic(tmp_path):
    argv = instance_argv(StackConfig(deterministic=True), "decode-0", "decode", "redis://x", tmp_path / "r", 2)
    assert argv[argv.index("--num-threads") + 1] == "2" and "--deterministic" in argv
    assert "--deterministic" not in instance_argv(StackConfig(), "decode-0", "decode", "redis://x", tmp_path / "r")


def test_instances_get_a_larger_pool_and_batch_that_extra_args_override(tmp_path):
    def argv(role, **config):
        return instance_argv(StackConfig(**config), f"{role}-0", role, "redis://x", tmp_path / "r")

    for role in ("prefill", "decode"):
        line = argv(role)
        assert line[line.index("--kv-cache-memory-gb") + 1] == "3" and line[line.index("--max-num-seqs") + 1] == "256"
    assert "--max-num-seqs" not in argv("decode", instance_engine_args=())
    overridden = argv("decode", extra_args={"decode": ["--max-num-seqs", "64"]})
    assert overridden.index("64") > overridden.index("256")  # the last flag wins


def test_up_deterministic_flag_reaches_the_stack_config():
    from services.cli.main import build_parser
    from services.cli.up_command import config_from_args
    assert config_from_args(build_parser().parse_args(["up", "--deterministic"])).deterministic
    assert not config_from_args(build_parser().parse_args(["up"])).deterministic
