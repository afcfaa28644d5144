"""A QUIC client (aioquic) for pirated's testbeds: IN_FLIGHT requests at a time on one
connection, each on a stream of its own, for SECONDS; it times each request itself (sent to
answer read) and prints "PIRATE <mean seconds> <requests>".

usage: client.py HOST PORT IN_FLIGHT SECONDS
"""

import asyncio
import ssl
import sys
import time

from aioquic.asyncio import QuicConnectionProtocol, connect
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamDataReceived

HOST, PORT, IN_FLIGHT, SECONDS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])


class Asking(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waiting = {}

    def quic_event_received(self, event):
        if isinstance(event, StreamDataReceived) and event.end_stream and event.stream_id in self.waiting:
            self.waiting.pop(event.stream_id).set_result(None)

    async def ask(self):
        stream_id = self._quic.get_next_available_stream_id()
        answered = asyncio.get_running_loop().create_future()
        self.waiting[stream_id] = answered
        self._quic.send_stream_data(stream_id, b"q" * 40, end_stream=True)
        self.transmit()
        await answered


async def main():
    config = QuicConfiguration(is_client=True, alpn_protocols=["pirate"], verify_mode=ssl.CERT_NONE)
    times = []
    async with connect(HOST, PORT, configuration=config, create_protocol=Asking) as client:
        end = time.monotonic() + SECONDS

        async def worker():
            while time.monotonic() < end:
                start = time.perf_counter()
                await client.ask()
                times.append(time.perf_counter() - start)

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    print("PIRATE", sum(times) / len(times), len(times), flush=True)


asyncio.run(main())
