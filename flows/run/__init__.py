"""The run: prompts streamed into shards, pumped through the limiter, regenerated, turned into rows."""
