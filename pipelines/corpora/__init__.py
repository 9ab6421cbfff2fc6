"""Local corpora: Debian-shipped human-written text (and a committed UDHR fixture) in the on-disk
layout of docs/interfaces.md ("Data on disk")."""
