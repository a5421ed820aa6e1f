"""``python -m sglang_launch.simulator --port P [--max-total-tokens N ...]``: serve in the foreground."""

from sglang_launch.simulator.cli import config_from_args
from sglang_launch.simulator.server import serve

if __name__ == "__main__":
    serve(config_from_args())
