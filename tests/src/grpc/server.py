"""pirate-tests' gRPC server: one unary method, /pirate.Test/Sleep, answering every call with 100
bytes after a fixed service time. Raw bytes in and out through generic handlers (no protobuf,
no generated code); asyncio, so that every call in flight is served at once, or, with
`one-at-a-time`, one after another as a server of a single worker serves them.

Usage: server.py PORT SERVICE_SECONDS [one-at-a-time]
"""

import asyncio
import sys

import grpc


async def main(port, service, one_at_a_time):
    worker = asyncio.Lock()

    async def sleep(_request, _context):
        if one_at_a_time:
            async with worker:
                await asyncio.sleep(service)
        else:
            await asyncio.sleep(service)
        return b"x" * 100

    server = grpc.aio.server()
    methods = {"Sleep": grpc.unary_unary_rpc_method_handler(sleep)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("pirate.Test", methods),))
    server.add_insecure_port(f"[::]:{port}")
    await server.start()
    await server.wait_for_termination()


asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:] == ["one-at-a-time"]))
