"""Small helpers that build one-sample metric families with a service's fixed labels."""

from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class FamilyMaker:
    """Builds gauge and counter families labelled with `labels` (plus any per-sample ones)."""

    def __init__(self, labels: Mapping[str, str]):
        self.names = list(labels)
        self.values = list(labels.values())

    def gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=self.names)
        family.add_metric(self.values, value)
        return family

    def counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        """`name` without `_total` (the exposition adds it)."""
        family = CounterMetricFamily(name, documentation, labels=self.names)
        family.add_metric(self.values, value)
        return family

    def labelled_counter(self, name: str, documentation: str, label: str,
                         values: Iterable[tuple[str, float]]) -> CounterMetricFamily:
        """One sample per (label value, count), e.g. failures by status code."""
        return self.labelled(CounterMetricFamily, name, documentation, (label,),
                             (((label_value,), count) for label_value, count in values))

    def labelled(self, kind, name: str, documentation: str, labels: tuple[str, ...],
                 rows: Iterable[tuple[tuple[str, ...], float]]):
        """A `kind` family (CounterMetricFamily, GaugeMetricFamily) with extra `labels`:
        one sample per (their values, number)."""
        family = kind(name, documentation, labels=[*self.names, *labels])
        for label_values, number in rows:
            family.add_metric([*self.values, *map(str, label_values)], number)
        return family
