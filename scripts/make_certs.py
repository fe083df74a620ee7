"""Generate a private CA and a SuperLink TLS certificate signed by it (for tests and trials).

    python scripts/make_certs.py <folder> [--host 127.0.0.1 --host superlink.example.org]

Writes ``ca.crt`` (give it to SuperNodes as ``--root-certificates`` and to the flwr CLI as
``root-certificates``), ``ca.key``, ``server.pem`` and ``server.key`` (give them to
``flower-superlink --ssl-certfile/--ssl-keyfile``, with ``--ssl-ca-certfile ca.crt``). Every
``--host`` becomes a subjectAltName (an IP address or a DNS name); SuperNodes must reach
the SuperLink under one of them. Uses the ``cryptography`` package (installed with flwr).
For production use certificates from your organisation's CA, not these.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(folder: str | Path, hosts: list[str] = ("127.0.0.1", "localhost"), days: int = 30) -> dict[str, Path]:
    """Write ca.crt, ca.key, server.pem, server.key into ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedpcd test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {name: folder / name for name in ("ca.crt", "ca.key", "server.pem", "server.key")}
    paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["ca.key"].write_bytes(_key_pem(ca_key))
    paths["server.pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["server.key"].write_bytes(_key_pem(key))
    for name in ("ca.key", "server.key"):
        paths[name].chmod(0o600)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--host", action="append", help="IP or DNS name of the SuperLink (repeatable)")
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args()
    for name, path in make_certs(args.folder, args.host or ["127.0.0.1", "localhost"], args.days).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
