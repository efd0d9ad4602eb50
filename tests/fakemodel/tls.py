"""A test certificate authority and a server certificate for the fake model server over TLS.

Made with the ``openssl`` command once per directory and reused (an image that trusts the CA
is built from it: tests/e2e/conftest.py), so that the gateway is proven on HTTPS, as real
model APIs are reached. Nothing here is a secret: the key never leaves the test machine.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

CA_NAME = "harness-worker test CA"


@dataclass(frozen=True)
class TestCA:
    directory: Path

    @property
    def ca_pem(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key(self) -> Path:
        return self.directory / "server.key"

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_pem))


def make_test_ca(directory: Path, names: tuple[str, ...]) -> TestCA:
    """The CA and a server certificate for ``names`` in ``directory`` (made when missing or
    made for other names)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = TestCA(directory)
    wanted = ",".join(f"DNS:{n}" for n in names)
    stamp = directory / "names"
    if ca.cert.exists() and ca.ca_pem.exists() and stamp.exists() and stamp.read_text() == wanted:
        return ca

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "3650", "-subj", f"/CN={CA_NAME}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", f"/CN={names[0]}",
    )  # fmt: skip
    (directory / "server.ext").write_text(
        f"subjectAltName={wanted}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "3650", "-extfile", "server.ext",
    )  # fmt: skip
    stamp.write_text(wanted)
    return ca
