"""A development certificate authority and certificates for a pdserve stack (`pdserve certs`).

`write_dev_certs(folder, hosts)` writes, as PEM files:
  ca.pem / ca-key.pem             the stack's CA (instances trust only clients it signed)
  gateway.pem / gateway-key.pem   the gateway: its public TLS ports and its client
                                  certificate towards the instances
  instance.pem / instance-key.pem every prefill, decode and colocated instance
Every certificate names `hosts` (DNS names or IP addresses) as subject alternative names,
plus localhost and the loopback addresses. EC P-256 keys, valid for `days`. For development
and tests: production deployments bring certificates from their own CA.
"""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
COMPOSE_HOSTS = ("gateway", "prefill", "decode", "colocated")


@dataclass(frozen=True)
class _Issued:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pdserve development"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alternative_names(hosts) -> x509.SubjectAlternativeName:
    names = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _builder(subject: str, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def make_ca(days: int) -> _Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (_builder("pdserve development CA", _name("pdserve development CA"), key.public_key(), days)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .sign(key, hashes.SHA256()))
    return _Issued(certificate, key)


def issue(ca: _Issued, common_name: str, hosts, days: int) -> _Issued:
    """A leaf certificate good for TLS servers and clients alike."""
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    certificate = (_builder(common_name, ca.certificate.subject, key.public_key(), days)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(_alternative_names(hosts), critical=False)
                   .sign(ca.key, hashes.SHA256()))
    return _Issued(certificate, key)


def _write(folder: Path, stem: str, issued: _Issued) -> None:
    (folder / f"{stem}.pem").write_bytes(issued.certificate.public_bytes(serialization.Encoding.PEM))
    key_path = folder / f"{stem}-key.pem"
    key_path.write_bytes(issued.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    key_path.chmod(0o600)


def write_dev_certs(folder: Path, hosts=(), days: int = 365) -> list[Path]:
    """Write the CA, gateway and instance certificates; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    all_hosts = tuple(DEFAULT_HOSTS) + tuple(COMPOSE_HOSTS) + tuple(hosts)
    ca = make_ca(days)
    _write(folder, "ca", ca)
    _write(folder, "gateway", issue(ca, "pdserve gateway", all_hosts, days))
    _write(folder, "instance", issue(ca, "pdserve instance", all_hosts, days))
    return sorted(folder.glob("*.pem"))
