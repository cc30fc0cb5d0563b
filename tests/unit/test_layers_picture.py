"""docs/layers.svg is drawn from the code (scripts/draw_layers.py): it must name every package
of the import-linter `layers` contract, so a package added to a tier without redrawing fails."""

import re
from pathlib import Path

from scripts.draw_layers import ROOT, layer_tiers


def test_the_layers_picture_names_every_package_of_the_layers_contract():
    svg = (ROOT / "docs" / "layers.svg").read_text()
    labels = set(re.findall(r">([A-Za-z_][\w.]*)<", svg))
    packages = [package for tier in layer_tiers() for package in tier]
    missing = [p for p in packages if (p.split(".", 1)[1] if "." in p else p) not in labels]
    assert not missing, f"docs/layers.svg is stale (run: python scripts/draw_layers.py); missing {missing}"


def parts_of(package: Path) -> set[str]:
    """The modules and subpackages directly inside `package`, by their dotted names."""
    dotted = ".".join(package.relative_to(ROOT).parts)
    modules = {f"{dotted}.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    return modules | {f"{dotted}.{d.name}" for d in package.iterdir() if (d / "__init__.py").exists()}


def test_every_package_of_shared_is_in_a_tier():
    """Each package of shared/ is placed whole, or (split across tiers, as shared.kv_transfer: its
    connector API in the engine tier, its UCX implementation above) each of its parts is."""
    packages = {p for tier in layer_tiers() for p in tier}
    on_disk = [d for d in Path(ROOT / "shared").iterdir() if d.is_dir() and (d / "__init__.py").exists()]
    unplaced = {f"shared.{d.name}" for d in on_disk
                if f"shared.{d.name}" not in packages and not parts_of(d) <= packages}
    assert not unplaced, unplaced
