"""sglang_launch."""
