"""Prefect: the flow a run is, its link to the API (which may fail without failing the run), crashed
runs, and a local server with its UI. The only room that imports Prefect; every other module runs
without it."""
