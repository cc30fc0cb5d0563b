"""Scraping a `/metrics` endpoint in tests: the samples as {(name, labels): value}."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels`."""
    found = [v for (n, sample_labels), v in samples.items() if n == name and set(labels.items()) <= sample_labels]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def labels_of(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(sample_labels) for (n, sample_labels) in samples if n == name]
