"""The package's version: written into session logs and exporters' resources."""

__version__ = "0.1.0"
