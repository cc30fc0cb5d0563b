"""The versions an instance registers beside its cache settings, for rolling upgrades.

`pdserve_version`: the installed pdserve package's version (informational: shown by
`pdserve status`, logged when a pair is refused). `kv_protocol_version`: the KV wire format
a prefill instance sends and a decode instance receives (shared.kv_transfer.ucx.protocol's
FORMAT_VERSION). Gateways pair only instances whose KV protocol versions agree; an instance
whose record carries none (a release before versions were registered) pairs with nobody.
"""

from importlib import metadata

from shared.kv_transfer.ucx.protocol import FORMAT_VERSION

KV_PROTOCOL_VERSION = FORMAT_VERSION
UNREGISTERED_PROTOCOL = 0


def installed_pdserve_version() -> str:
    try:
        return metadata.version("pdserve")
    except metadata.PackageNotFoundError:
        return "0+unknown"


PDSERVE_VERSION = installed_pdserve_version()
