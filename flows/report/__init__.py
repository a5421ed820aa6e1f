"""What a run has done, read back from its files: status, the end-of-run report, exports, prompt previews."""
