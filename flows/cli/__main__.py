"""`python -m flows.cli ...` is `datagen ...`."""

from flows.cli.main import app

app()
