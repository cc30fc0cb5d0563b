"""`pdserve up` gives every service a free /metrics port and prints where each one is
(stand-in services from tests/helpers/fake_service.py, a real Redis)."""

import re
from pathlib import Path

from services.launcher import LocalStack, StackConfig
from services.launcher.commands import gateway_argv, instance_argv
from services.launcher.report import describe
from tests.unit.metrics_scrape import scrape

FAKE_MODULES = {kind: "tests.helpers.fake_service" for kind in ("gateway", "prefill", "decode", "colocated")}


def test_every_service_is_started_with_a_free_metrics_port(tmp_path):
    config = StackConfig(gateway_port=0)
    ready = tmp_path / "ready.json"
    for argv in (instance_argv(config, "prefill-0", "prefill", "redis://x", ready),
                 instance_argv(config, "decode-0", "decode", "redis://x", ready),
                 gateway_argv(config, "redis://x", ready)):
        assert argv[argv.index("--metrics-port") + 1] == "0"


def test_the_report_names_each_services_metrics_url_and_they_answer(tmp_path: Path):
    config = StackConfig(num_prefill=1, num_decode=1, gateway_port=0, run_dir=tmp_path / "run",
                         ready_timeout_s=60.0, stop_grace_s=5.0, service_modules=FAKE_MODULES)
    with LocalStack(config) as stack:
        stack.start()
        report = describe(stack)
        urls = dict(re.findall(r"^  (\S+) .* metrics http://(\S+)/metrics$", report, re.MULTILINE))
        assert sorted(urls) == ["decode-0", "gateway", "prefill-0"], report
        for address in urls.values():
            assert any(name == "process_cpu_seconds_total" for name, _ in scrape(address))
