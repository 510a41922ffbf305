"""kvprobe: is a KV-cache setting worth deploying? Measured against a gold reference, with evidence."""

__version__ = "0.1.0"

from kvprobe.client import Client, Generation
from kvprobe.config import Bars, Config, Server, load_config
from kvprobe.errors import ConfigError, KvprobeError, ServerError, Unreachable

__all__ = [
    "Bars",
    "Client",
    "Config",
    "ConfigError",
    "Generation",
    "KvprobeError",
    "Server",
    "ServerError",
    "Unreachable",
    "__version__",
    "load_config",
]
