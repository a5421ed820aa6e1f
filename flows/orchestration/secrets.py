"""API keys kept in Prefect Secret blocks (``api_key_secret``): read at run time, never stored elsewhere.

The key goes straight to the endpoint's client. It is not a flow parameter, not in the config
snapshot (which holds the block's name), not logged: Prefect's own UI masks the block's value.
"""

from __future__ import annotations

from prefect.blocks.system import Secret


async def load_secret(name: str) -> str:
    """The string a Secret block holds (``Secret.load(name).get()``); raises when there is none."""
    block: Secret[str] = await Secret.aload(name)
    value = block.get()
    if not isinstance(value, str) or not value:
        raise ValueError("the block holds no non-empty string")
    return value
