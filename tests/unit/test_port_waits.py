"""devstack waits out a client connection holding a stack port, not a listener."""

from __future__ import annotations

import socket
import threading

from devstack.procs import port_busy, wait_while_only_connections_hold


def _listener() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _client_from_a_free_port(server: socket.socket) -> tuple[socket.socket, int]:
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.bind(("127.0.0.1", 0))
    client.connect(server.getsockname())
    return client, client.getsockname()[1]


def test_a_port_held_by_a_closing_connection_is_waited_for() -> None:
    said: list[str] = []
    with _listener() as server:
        client, port = _client_from_a_free_port(server)
        accepted, _ = server.accept()
        assert port_busy(port)  # the premise: the connection keeps a listener off its port
        # The server ends it first, as a stopping stack does: the client's end then closes
        # without TIME_WAIT (which, without SO_REUSEADDR on the client, holds the port 60 s;
        # devstack waits long enough for that too).
        closer = threading.Timer(0.7, lambda: (accepted.close(), client.close()))
        closer.start()
        try:
            assert wait_while_only_connections_hold(port, 10.0, said.append)
        finally:
            closer.cancel()
            client.close()
            accepted.close()
    assert len(said) == 1 and f"port {port}" in said[0] and "waiting up to 10s" in said[0]
    # Free means a server can now listen there.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_a_connection_that_stays_is_waited_for_only_so_long() -> None:
    with _listener() as server:
        client, port = _client_from_a_free_port(server)
        accepted, _ = server.accept()
        with client, accepted:
            assert not wait_while_only_connections_hold(port, 1.0, lambda _: None)


def test_a_listener_is_not_waited_for() -> None:
    said: list[str] = []
    with _listener() as server:
        port = server.getsockname()[1]
        assert not wait_while_only_connections_hold(port, 30.0, said.append)
    assert said == []
