"""Builds the connector an engine config names, by module path ("package.module:Class"), so the
engine layer never imports a transport."""

import importlib

from shared.errors import InvalidRequestError
from shared.kv_transfer.base import KVCacheAccess, KVConnector
from shared.kv_transfer.types import KVTransferConfig


def connector_class(path: str) -> type[KVConnector]:
    module_name, separator, class_name = path.partition(":")
    if not separator or not module_name or not class_name:
        raise InvalidRequestError("kv_connector", f"expected 'package.module:Class', got {path!r}")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise InvalidRequestError("kv_connector", f"cannot load {path!r}: {error}") from error
    if not (isinstance(found, type) and issubclass(found, KVConnector)):
        raise InvalidRequestError("kv_connector", f"{path!r} is not a KVConnector")
    return found


def create_connector(config: KVTransferConfig, kv_access: KVCacheAccess) -> KVConnector:
    return connector_class(config.connector)(config, kv_access)
