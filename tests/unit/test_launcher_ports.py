"""Ports fixed before their listener starts (Redis, an instance restarted on its own address)
come from below the kernel's ephemeral range: nothing that binds port 0 or connects out can
take one between the choice and the bind."""

import socket

from services.launcher import ports


def test_a_fixed_port_is_free_and_below_the_ephemeral_range():
    port = ports.find_free_port()
    assert ports.LOWEST_PORT <= port < ports.ephemeral_range_low()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", port))


def test_a_port_is_never_handed_out_twice():
    chosen = [ports.find_free_port() for _ in range(50)]
    assert len(set(chosen)) == len(chosen)


def test_a_port_something_listens_on_is_not_chosen(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", ports.LOWEST_PORT))
        taken.listen()
        # Only one candidate below the range, and it is taken: any free port instead.
        monkeypatch.setattr(ports, "ephemeral_range_low", lambda: ports.LOWEST_PORT + 1)
        port = ports.find_free_port()
    assert port != ports.LOWEST_PORT


def test_without_room_below_the_range_any_free_port_is_used(tmp_path, monkeypatch):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("1024\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", range_file)
    assert ports.ephemeral_range_low() == 1024
    assert ports.find_free_port() > 0
