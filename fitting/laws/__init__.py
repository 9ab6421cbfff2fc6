"""The papers' laws and their robust fits (log-sum-exp objectives, multi-start optimisation,
bootstrap), the downstream laws, saved fits read back, and synthetic runs from known laws; above
`fitting.readers`. Nothing is imported here."""
