"""Draw the layers of pdserve as import-linter enforces them: docs/layers.svg.

The tiers and their packages come from the `layers` contract in pyproject.toml (top imports
bottom, never back); each box is a package with its size in lines; each arrow is the number of
import statements from one tier down to another, counted by grimp (import-linter's own graph).
`python scripts/draw_layers.py` rewrites the picture; tests/unit/test_layers_picture.py checks
that the committed one names every package of the contract.
"""

import argparse
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIER_NAMES = ["CLI", "bench load generator", "services", "disaggregation", "engine core"]


def layer_tiers(pyproject: Path = ROOT / "pyproject.toml") -> list[list[str]]:
    """The `layers` contract's tiers, top first, each a list of module names."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c["id"] == "layers"]
    return [[name.strip(" ()") for name in layer.replace("|", ":").split(":")] for layer in contract["layers"]]


def closed_to_services(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """Engine packages a `forbidden` contract closes to services/ (they use the engine's API)."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    closed = set()
    for contract in config["contracts"]:
        if contract["type"] == "forbidden" and any(s.split(".")[0] == "services" for s in contract["source_modules"]):
            closed |= {m for m in contract["forbidden_modules"] if m.startswith("shared.")}
    return closed


def package_lines(module: str) -> int:
    path = ROOT / Path(*module.split("."))
    files = list(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
    return sum(sum(1 for line in f.read_text().splitlines() if line.strip()) for f in files if f.exists())


def imports_between_tiers(tiers: list[list[str]]) -> Counter:
    """(from tier, to tier) -> import statements, for every pair of different tiers."""
    import grimp

    graph = grimp.build_graph("shared", "services", "benchmarks", cache_dir=None)
    tier_of = {}
    for index, tier in enumerate(tiers):
        for package in tier:
            for module in {package} | set(graph.find_descendants(package)):
                tier_of[module] = index
    counts = Counter()
    for module, source in tier_of.items():
        for imported in graph.find_modules_directly_imported_by(module):
            target = tier_of.get(imported)
            if target is not None and target != source:
                counts[(source, target)] += 1
    return counts


def draw(tiers: list[list[str]], arrows: Counter, closed: set[str], out: Path, per_row: int = 8) -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable, testable
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    rows = [max(1, -(-len(tier) // per_row)) for tier in tiers]
    height = sum(rows) * 1.0 + len(tiers) * 0.9
    gutter = per_row * 1.6 + 2.3  # arrows run down the right-hand margin
    fig, ax = plt.subplots(figsize=(16, height * 0.9))
    ax.set_xlim(0, gutter + 0.4 * len(arrows) + 0.4)
    ax.set_ylim(0, height)
    ax.axis("off")
    top, centers = height, []
    for index, tier in enumerate(tiers):
        band = rows[index] * 1.0 + 0.6
        bottom = top - band
        ax.add_patch(FancyBboxPatch((0.05, bottom + 0.05), per_row * 1.6 + 2.1, band - 0.1,
                                    boxstyle="round,pad=0.02", fc="#eef3f8" if index % 2 else "#f8f4ec", ec="#888"))
        ax.text(0.2, top - 0.3, TIER_NAMES[index] if index < len(TIER_NAMES) else f"tier {index}",
                fontsize=11, weight="bold", va="center")
        for slot, package in enumerate(tier):
            row, column = divmod(slot, per_row)
            x, y = 2.0 + column * 1.6, top - 0.55 - (row + 1) * 1.0 + 0.15
            is_closed = any(package == c or package.startswith(c + ".") or c.startswith(package + ".") for c in closed)
            ax.add_patch(FancyBboxPatch((x, y), 1.45, 0.75, boxstyle="round,pad=0.02",
                                        fc="#f3dede" if is_closed else "white", ec="#446"))
            name = package.split(".", 1)[1] if "." in package else package
            # A split package's modules have long names (kv_transfer.in_memory): smaller, to fit the box.
            ax.text(x + 0.72, y + 0.48, name, ha="center", va="center", fontsize=8.5 * min(1.0, 15 / len(name)))
            ax.text(x + 0.72, y + 0.2, f"{package_lines(package) / 1000:.1f}k lines", ha="center", va="center",
                    fontsize=7, color="#555")
        centers.append((bottom, top))
        top = bottom - 0.3
    for slot, ((source, target), count) in enumerate(sorted(arrows.items())):
        if target < source:
            raise SystemExit(f"an import runs up the layers: tier {source} -> {target}; lint-imports should fail")
        x = gutter + 0.4 * slot
        ax.annotate("", xy=(x, centers[target][1] - 0.05), xytext=(x, centers[source][0] + 0.05),
                    arrowprops=dict(arrowstyle="->", color="#a33", lw=1.0))
        ax.text(x + 0.05, (centers[source][0] + centers[target][1]) / 2, str(count), fontsize=7, color="#a33")
    ax.set_title("pdserve's layers (pyproject.toml, enforced by lint-imports): each tier imports only tiers "
                 "below it; arrows: import statements between tiers"
                 + ("; shaded: engine internals services/ may not import" if closed else ""), fontsize=10)
    fig.savefig(out, format=out.suffix.lstrip("."), bbox_inches="tight",
                metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "layers.svg")
    args = parser.parse_args(argv)
    tiers = layer_tiers()
    draw(tiers, imports_between_tiers(tiers), closed_to_services(), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
