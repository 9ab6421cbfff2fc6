"""Tasks tokenized once into ArrayRecord shards and read by document index."""
