"""A QUIC server (aioquic) for pirated's testbeds: on each bidirectional stream, a request
(whatever the client sends, up to the end of its stream), answered after a fixed service time
with 100 bytes and the stream's end. Raw QUIC streams under TLS 1.3, ALPN "pirate"; a
self-signed certificate made at start.

usage: server.py ADDRESS PORT SERVICE_SECONDS DIR

Bound to ADDRESS, not every address: with the answers on another route than the requests (the
testbeds' return path), an unbound socket would answer from that route's address, which the
client does not know.
"""

import asyncio
import datetime
import os
import sys

from aioquic.asyncio import QuicConnectionProtocol, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamDataReceived
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ADDRESS, PORT, SERVICE, DIR = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]


def certificate():
    """A self-signed P-256 certificate and its key, written to DIR; their paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pirate")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = os.path.join(DIR, "cert.pem"), os.path.join(DIR, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return cert_path, key_path


class Answering(QuicConnectionProtocol):
    def quic_event_received(self, event):
        if isinstance(event, StreamDataReceived) and event.end_stream:
            asyncio.get_running_loop().call_later(SERVICE, self.answer, event.stream_id)

    def answer(self, stream_id):
        self._quic.send_stream_data(stream_id, b"r" * 100, end_stream=True)
        self.transmit()


async def main():
    config = QuicConfiguration(is_client=False, alpn_protocols=["pirate"])
    config.load_cert_chain(*certificate())
    await serve(ADDRESS, PORT, configuration=config, create_protocol=Answering)
    print("listening", flush=True)
    await asyncio.Future()


asyncio.run(main())
