"""Io: bytes on disk and at URLs — the TBL file's format, opening it as a dataset, this host's
part of one, the sources a conversion reads, the conversion itself, staging to local disk."""
