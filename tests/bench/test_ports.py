"""`bench.harness.free_port`: the ports the tests' and benchmarks' servers start on."""

from __future__ import annotations

import socket

from bench.harness import FIXED_PORTS_FROM, ephemeral_ports, free_port
from tests.cluster.components import fixed_ports
from tests.cluster.layout import Layout


def test_a_free_port_lies_below_the_range_connections_take_their_ports_from() -> None:
    ephemeral = ephemeral_ports()
    ports = {free_port() for _ in range(500)}
    assert all(FIXED_PORTS_FROM <= port < ephemeral.start for port in ports), ports
    # Never one handed out before: servers picked together may not have bound them yet.
    assert len(ports) == 500
    # Free indeed: a server binds it.
    with socket.create_server(("127.0.0.1", ports.pop())):
        pass


def test_no_free_port_is_one_the_test_cluster_listens_on() -> None:
    assert all(port < FIXED_PORTS_FROM for port in fixed_ports(Layout())), fixed_ports(Layout())
