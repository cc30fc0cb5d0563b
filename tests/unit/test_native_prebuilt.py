"""Prebuilt C++ kernels (what the container image carries instead of a compiler): the CPU's
flags pick the best target it runs, a prebuilt library wins over compiling, one built from
another source is never loaded, and the portable build computes decode attention right."""

import ctypes
import platform

import pytest
import torch

from shared.attention.native_decode import SOURCE, NativePagedDecode
from shared.model.cpu_layer_ops import SOURCE as LAYER_OPS_SOURCE
from shared.native import build
from shared.native.prebuild import kernel_sources, main as prebuild_main
from shared.native.targets import cpu_flags, machine_targets, runnable_targets
from tests.unit.test_native_decode import paged_inputs, reference_decode

V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave", "sse4_2"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
x86_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 targets")


def target(name: str):
    return next(t for t in machine_targets("x86_64") if t.name == name)


def names(targets) -> list[str]:
    return [target.name for target in targets]


def test_the_cpu_runs_the_best_target_its_flags_allow():
    assert names(runnable_targets(frozenset(V4 | {"avx512_bf16", "amx_tile", "amx_bf16"}), "x86_64")) == [
        "x86-64-v4-amx", "x86-64-v4-bf16", "x86-64-v4", "x86-64-v3", "x86-64"]
    assert names(runnable_targets(frozenset(V4 | {"avx512_bf16"}), "x86_64"))[0] == "x86-64-v4-bf16"
    assert names(runnable_targets(frozenset(V4), "x86_64"))[0] == "x86-64-v4"
    assert names(runnable_targets(frozenset(V3 | {"avx512_bf16"}), "x86_64"))[0] == "x86-64-v3"
    assert names(runnable_targets(frozenset(), "x86_64")) == ["x86-64"]
    assert names(runnable_targets(frozenset({"fp", "asimd"}), "aarch64")) == ["generic"]
    assert machine_targets("riscv64") == ()


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert cpu_flags(x86) == {"fpu", "avx2", "avx512f"}
    assert cpu_flags(arm) == {"fp", "asimd"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_every_kernel_source_is_prebuilt():
    assert {SOURCE, LAYER_OPS_SOURCE} <= set(kernel_sources())


@x86_only
def test_the_best_prebuilt_this_cpu_runs_is_loaded_and_the_compiler_is_not_used(tmp_path, monkeypatch):
    baseline, v4 = target("x86-64"), target("x86-64-v4")
    for built in (baseline, v4):
        (tmp_path / build.prebuilt_name(SOURCE, built)).write_bytes(b"")
    monkeypatch.setenv(build.PREBUILT_DIR_ENV_VAR, str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(V4))
    assert build.shared_library(SOURCE) == tmp_path / build.prebuilt_name(SOURCE, v4)
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(V3))
    assert build.shared_library(SOURCE) == tmp_path / build.prebuilt_name(SOURCE, baseline)


@x86_only
def test_a_prebuilt_of_another_source_is_never_loaded(tmp_path, monkeypatch):
    edited = tmp_path / SOURCE.name
    edited.write_text(SOURCE.read_text() + "\n// edited\n")
    baseline = target("x86-64")
    (tmp_path / build.prebuilt_name(SOURCE, baseline)).write_bytes(b"")
    monkeypatch.setenv(build.PREBUILT_DIR_ENV_VAR, str(tmp_path))
    assert build.prebuilt_name(edited, baseline) != build.prebuilt_name(SOURCE, baseline)
    assert build.prebuilt_library(edited) is None


@x86_only
def test_the_portable_prebuilt_kernel_matches_the_reference(tmp_path, monkeypatch):
    assert prebuild_main(["--out", str(tmp_path), "--target", "x86-64"]) == 0
    monkeypatch.setenv(build.PREBUILT_DIR_ENV_VAR, str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    library = build.shared_library(SOURCE)
    assert library is not None and library.parent == tmp_path
    kernel = NativePagedDecode(ctypes.CDLL(str(library)))
    assert kernel.available_paths(9, 3, 64, 16, torch.float32) == ["portable"]
    inputs = paged_inputs([1, 17, 40], 9, 3, 64, 16, torch.float32)
    output = kernel(*inputs, scale=64 ** -0.5)
    torch.testing.assert_close(output.double(), reference_decode(*inputs), atol=1e-5, rtol=1e-5)


def test_without_a_prebuilt_folder_the_machine_builds_its_own(monkeypatch):
    monkeypatch.delenv(build.PREBUILT_DIR_ENV_VAR, raising=False)
    assert build.prebuilt_library(SOURCE) is None
    assert "-march=native" in build.COMPILE_FLAGS
