"""The one-way layers of pyproject.toml's [tool.importlinter] contracts hold (issues 9, 29).

engine core <- disaggregation <- services <- bench load generator <- CLI, benchmarks on top;
the engine imports no transport; no cycles between the packages of shared/ or of services/;
services reach an engine only through its API (shared.engine_api), which imports none of the
implementation, the composition root that builds engines excepted; the KV connector's API
(shared.kv_transfer) sits in the engine tier and its UCX implementation (shared.kv_transfer.ucx)
in disaggregation, named by the engine only as a module path. The contracts are run by
import-linter's own `lint-imports` (no cache, about a second). The planted-violation
tests copy the source tree, add one bad import and check that the right contract breaks, so
a contract that stopped checking anything would fail here too.
"""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
SOURCE_PACKAGES = ("shared", "services", "benchmarks")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH first, so that a copied tree's packages shadow the editable install's.
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def copy_sources(into: Path) -> Path:
    shutil.copy(REPO_ROOT / "pyproject.toml", into / "pyproject.toml")
    for package in SOURCE_PACKAGES:
        shutil.copytree(REPO_ROOT / package, into / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "csrc"))
    return into


def test_contracts_are_kept():
    completed = lint_imports(REPO_ROOT)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 broken" in completed.stdout


@pytest.mark.parametrize("module, bad_import, broken_contract", [
    ("shared/core/request.py", "import grpc", "the engine core imports no transport"),
    ("shared/sampling/sampler.py", "import redis", "the engine core imports no transport"),
    ("shared/kv_cache/block_pool.py", "import shared.kv_transfer.ucx.stats", "never back"),
    # The connector API (engine tier) names its UCX implementation (disaggregation) by module path
    # only: importing it runs back up the layers, and brings ucxx into the engine.
    ("shared/engine/engine_core.py", "from shared.kv_transfer.ucx.connector import UCXConnector", "never back"),
    ("shared/kv_transfer/factory.py", "import shared.kv_transfer.ucx.connector", "the engine core imports no transport"),
    ("shared/kv_transfer/in_memory.py", "import shared.kv_transfer.ucx.stats", "every package of shared/ is in a tier"),
    ("shared/guided/bitmask.py", "import shared.core.request", "no import cycles"),
    # The packages every service shares (rpc, settings, ...) never import one that uses them.
    ("services/rpc/errors.py", "import services.instance.runtime", "no import cycles"),
    ("services/settings/flags.py", "import services.instance.settings", "no import cycles"),
    ("services/gateway/server.py", "import services.cli.main", "never back"),
    ("services/observability/instance_metrics.py", "import benchmarks.serve_compare", "benchmarks sit on top"),
    ("services/cli/bench_run.py", "import benchmarks.harness.netfault", "benchmarks sit on top"),
    ("services/gateway/router.py", "import shared.core.scheduler", "only through its API"),
    # Indirectly: the offline LLM imports the step-driven LLMEngine.
    ("services/decode/handler.py", "import shared.engine.llm", "only through its API"),
    ("shared/engine_api/outputs.py", "import shared.executor.base", "sits below the engine implementation"),
])
def test_a_planted_violation_breaks_its_contract(tmp_path, module, bad_import, broken_contract):
    root = copy_sources(tmp_path)
    path = root / module
    # A function-level import: import-linter counts those too, as the contracts intend.
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {bad_import}\n")
    completed = lint_imports(root)
    assert completed.returncode != 0, completed.stdout
    broken = [line for line in completed.stdout.splitlines() if " BROKEN" in line]
    assert any(broken_contract in line for line in broken), completed.stdout


def test_a_new_unlisted_shared_package_must_be_placed_in_a_tier(tmp_path):
    root = copy_sources(tmp_path)
    (root / "shared" / "newcomer").mkdir()
    (root / "shared" / "newcomer" / "__init__.py").write_text("")
    completed = lint_imports(root)
    assert completed.returncode != 0, completed.stdout
    assert "shared.newcomer" in completed.stdout


# Modules of the packages the services contract names piecemeal that services may import.
PUBLIC_TO_SERVICES = {
    "shared.core": {"scheduler_config"},
    "shared.kv_cache": {"block_hash", "blocks", "vllm_block_hash"},
    "shared.kv_transfer.ucx": {"protocol", "env", "lifecycle"},
}


def test_every_module_of_a_piecemeal_package_is_public_or_forbidden_to_services():
    """A module added to shared/core, shared/kv_cache or shared/kv_transfer/ucx must be placed:
    named in the services contract's forbidden_modules, or deliberately public (above)."""
    contracts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    forbidden = set(next(c for c in contracts if c["id"] == "services-use-the-engine-api")["forbidden_modules"])
    for package, public in PUBLIC_TO_SERVICES.items():
        folder = REPO_ROOT.joinpath(*package.split("."))
        modules = {path.stem for path in folder.glob("*.py") if path.stem != "__init__"}
        unplaced = {m for m in modules - public if f"{package}.{m}" not in forbidden}
        assert not unplaced, f"{package}: neither public nor forbidden to services: {sorted(unplaced)}"
        assert public <= modules, f"{package}: public modules that do not exist: {sorted(public - modules)}"



def tier_names(layer: str, prefix: str = "") -> set[str]:
    return {name.strip(" ()").removeprefix(prefix) for name in layer.split(":")}


def test_every_module_of_the_connector_api_is_placed_in_the_engine_tier_and_transport_free():
    """shared/kv_transfer is split across two tiers: its API modules sit in the engine tier, its
    UCX implementation (the subpackage ucx, which imports ucxx) in disaggregation. So the
    contracts name the API module by module, and a module added beside them must be named in
    each: the engine tier of both layers contracts, and the transport-free contract's sources."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["id"]: c for c in config["contracts"]}
    api_modules = {f"kv_transfer.{path.stem}" for path in (REPO_ROOT / "shared" / "kv_transfer").glob("*.py")
                   if path.stem != "__init__"}
    engine_tier = {
        "layers": tier_names(contracts["layers"]["layers"][-1], "shared."),
        "shared-tiers": tier_names(contracts["shared-tiers"]["layers"][-1]),
        "engine-transport-free": {m.removeprefix("shared.")
                                  for m in contracts["engine-transport-free"]["source_modules"]},
    }
    for contract, modules in engine_tier.items():
        assert api_modules <= modules, f"{contract}: not in the engine tier: {sorted(api_modules - modules)}"
        assert not any(m == "kv_transfer" or m.startswith("kv_transfer.ucx") for m in modules), contract
    assert "shared.kv_transfer.ucx" in tier_names(contracts["layers"]["layers"][-2])
    assert "kv_transfer.ucx" in tier_names(contracts["shared-tiers"]["layers"][-2])
