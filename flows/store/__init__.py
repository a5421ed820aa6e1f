"""The checkpoint store: exactly-once parquet shards, the run manifest, the declared row schemas."""
