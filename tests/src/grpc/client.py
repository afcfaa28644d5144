"""pirate-tests' gRPC client: IN_FLIGHT tasks, each calling /pirate.Test/Sleep (raw bytes, no
protobuf) one call after another, all on one channel (one HTTP/2 connection), for SECONDS.
Each call is timed from the call to its response; prints "PIRATE <mean seconds> <calls>".

Usage: client.py TARGET IN_FLIGHT SECONDS
"""

import asyncio
import sys
import time

import grpc


async def main(target, in_flight, seconds):
    # The testbed has no proxy; one set in the environment must not take the connection.
    async with grpc.aio.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)]) as channel:
        await channel.channel_ready()
        call = channel.unary_unary("/pirate.Test/Sleep")
        times = []
        end = time.perf_counter() + seconds

        async def calls():
            while time.perf_counter() < end:
                began = time.perf_counter()
                await call(b"x" * 100)
                times.append(time.perf_counter() - began)

        await asyncio.gather(*(calls() for _ in range(in_flight)))
    if not times:
        sys.exit("no call completed")
    print(f"PIRATE {sum(times) / len(times):.9f} {len(times)}")


asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
