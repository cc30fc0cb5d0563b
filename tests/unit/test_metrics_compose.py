"""deploy/compose: every pdserve service serves /metrics on a container port it exposes."""

from tests.unit.test_compose_file import PDSERVE_SERVICES, config  # noqa: F401 - fixture


def test_every_service_exposes_its_metrics_port(config):  # noqa: F811
    for name in PDSERVE_SERVICES:
        service = config["services"][name]
        port = service["environment"]["PDSERVE_METRICS_PORT"]
        assert port == "9100", name
        assert port in [str(exposed) for exposed in service["expose"]], name
        assert service["environment"]["PDSERVE_LOG_FORMAT"] in ("text", "json")
