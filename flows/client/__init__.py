"""Talking to one endpoint: requests and retries, responses, error classes, sampling, health."""
