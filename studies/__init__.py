"""The CPT and MT studies (`xlscale demo`) on one skeleton: run, report, findings."""
