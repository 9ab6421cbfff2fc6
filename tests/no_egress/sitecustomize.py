"""Puts the tests' no-egress guard into every Python subprocess whose PYTHONPATH starts here (the
GCS fixtures' environment does that); see `no_egress_guard`."""

import no_egress_guard

no_egress_guard.install()
