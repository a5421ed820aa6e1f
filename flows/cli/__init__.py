"""The command line: every `datagen` command, each a few lines that call the library."""
