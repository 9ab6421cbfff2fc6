"""The run directory as a contract: names, records, paper units, lease, checksums; any filesystem."""
