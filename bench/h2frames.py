"""What inspecting HTTP/2 would cost a GB in framing alone: ``python -m bench.h2frames``.

The issue asked whether ALPN h2 inspection with the ``h2`` library pays. Inspected TLS today is
HTTP/1.1 on both sides (the proxy offers only http/1.1), its bodies moved in 512 KiB TLS reads
with no per-frame work. An h2 proxy would parse every DATA frame (16 KiB unless the peer raises
SETTINGS_MAX_FRAME_SIZE) on one side and write it again on the other, with flow-control window
updates. Here a server and a client h2 state machine exchange 256 MiB on one stream with no I/O
and no TLS: the CPU is the framing's, on both ends, which is what a proxy pays (it is a server
to the guest and a client to the upstream).
"""

from __future__ import annotations

import resource
import time

import h2.config
import h2.connection
import h2.events
import h2.settings

TOTAL = 256 << 20
CHUNK = 256 << 10


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pair() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    client.increment_flow_control_window(2**31 - 1 - 65535)
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    request = [(":method", "GET"), (":path", "/"), (":scheme", "https"), (":authority", "x")]
    client.send_headers(1, request, end_stream=True)
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(":status", "200")])
    return server, client


def main() -> None:
    server, client = _pair()
    chunk = b"x" * CHUNK
    got = 0
    wall, cpu = time.perf_counter(), _cpu()
    for _ in range(TOTAL // CHUNK):
        frame = server.max_outbound_frame_size
        for off in range(0, CHUNK, frame):
            server.send_data(1, chunk[off : off + frame])
        for event in client.receive_data(server.data_to_send()):
            if isinstance(event, h2.events.DataReceived):
                got += len(event.data)
                client.acknowledge_received_data(event.flow_controlled_length, 1)
        server.receive_data(client.data_to_send())
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    assert got == TOTAL
    print(
        f"h2 framing, {frame}-byte DATA frames: {cpu / (TOTAL / 1e9):.2f} s CPU a GB (both"
        f" ends, no TLS, no I/O), {TOTAL / wall / 1e6:.0f} MB/s on one core"
    )


if __name__ == "__main__":
    main()
