"""Which model a run's endpoints serve: read when the run starts, checked when an endpoint comes back.

The model names the run's data twice: the fingerprint hashes it (a resume with another model is
refused) and every row carries it (SGLang answers under whatever name it is asked, so a row says the
name the run asked for, not what the server served). So a model is never guessed: it is the one the
config names, else the one the endpoints that answer list first. An endpoint that does not answer at
the start is left out, not waited for (its model would be a guess); it joins once it answers and is
seen to list the run's model. Whichever endpoint answers first, the model is the same, or the run is
refused (endpoints serving different models) or the latecomer is kept out: the fingerprint never
depends on which one it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from flows.client.endpoint import first_model
from flows.client.errors import FatalEndpointError, TransientRequestError
from flows.client.guard import Endpoint
from flows.say import SAY

log = logging.getLogger(__name__)

POLL_S = 2.0
"""How often the endpoints are asked again while none of them answers at the start."""


class ModelsDiffer(RuntimeError):
    """The endpoints that answer serve different models (one run, one model)."""


@dataclass
class Listing:
    """What one endpoint said about its models: the ids (None: it answers, but lists none we can read,
    a gateway without ``/v1/models``), or why it did not answer."""

    endpoint: Endpoint
    models: list[str] | None = None
    down: TransientRequestError | None = None


async def listing(endpoint: Endpoint) -> Listing:
    """One ``GET /v1/models``; a refusal (a bad key, no such route) is the endpoint's misconfiguration,
    raised, except where the config names the model: then the listing only checked it."""
    try:
        return Listing(endpoint, await endpoint.client.listed_models())
    except TransientRequestError as error:
        return Listing(endpoint, down=error)
    except FatalEndpointError as error:
        if endpoint.client.model is None:
            raise
        log.warning(
            "cannot check which models %s serves (%s): its requests ask for %s",
            endpoint.client.endpoint,
            error,
            endpoint.client.model,
            extra=SAY,
        )
        return Listing(endpoint)


class NoEndpointAnswers(RuntimeError):
    """No endpoint answered within ``outage_patience_s`` of the start: nothing was sent. Not a
    ``RequestError``: no request failed, and its count of the looks at the endpoints ("(attempt 2)")
    read as if one had been retried; the message says which endpoints, how long and what to check."""


async def first_answers(endpoints: list[Endpoint], patience_s: float) -> list[Listing]:
    """Every endpoint's listing, once at least one answers: waited for up to ``patience_s`` while none
    does (said at once, in one warning), then ``NoEndpointAnswers`` with the last reasons."""
    deadline = time.monotonic() + patience_s
    listings = await asyncio.gather(*(listing(e) for e in endpoints))
    if any(entry.down is None for entry in listings):
        return listings
    log.warning(
        "%s: the run waits up to %.0f s (outage_patience_s) for %s",
        "; ".join(not_answering(entry) for entry in listings),
        patience_s,
        "it" if len(endpoints) == 1 else "one of them",
        extra=SAY,
    )
    while time.monotonic() < deadline:
        await asyncio.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
        listings = await asyncio.gather(*(listing(e) for e in endpoints))
        if any(entry.down is None for entry in listings):
            return listings
    one = len(endpoints) == 1
    raise NoEndpointAnswers(
        f"cannot use the endpoint{'' if one else 's'}: no answer{'' if one else ' from any'} in "
        f"{patience_s:.0f} s ([retry] outage_patience_s): {'; '.join(not_answering(e) for e in listings)}. "
        f"Check that {'its server is' if one else 'their servers are'} running and reachable from this "
        f"machine at {'that URL' if one else 'those URLs'}; nothing was sent, and the same command starts "
        f"the run once {'it' if one else 'one'} answers"
    )


def not_answering(entry: Listing) -> str:
    """An endpoint that did not answer, and why, in words."""
    reason = entry.down.reason if entry.down is not None else "?"
    return f"{entry.endpoint.client.endpoint} does not answer ({reason})"


def run_model(listings: list[Listing]) -> str:
    """The model of the run: the one configured, else the first listed by the endpoints that answer;
    ``ModelsDiffer`` where two of them differ."""
    models = {
        entry.endpoint.client.model or first_model(entry.models or [])
        for entry in listings
        if entry.down is None or entry.endpoint.client.model is not None
    }
    if len(models) > 1:
        raise ModelsDiffer(f"the endpoints serve different models: {sorted(models)}")
    return models.pop()


class ServedModel:
    """Whether one endpoint serves the run's model, at the start and whenever it comes back.

    A model named in its ``[[endpoints]]`` is what its requests ask for and its rows say: one the
    server does not list is warned about once (it may be the same weights under another name, a
    path for a hub id; a refusal would also block the resume of a run started so), not refused. A
    model read from the other endpoints must be listed here, or the endpoint gets no prompt.
    """

    def __init__(self, endpoint: Endpoint, model: str, *, configured: bool) -> None:
        self.endpoint = endpoint
        self.model = model
        self.configured = configured
        self._said: list[str] | None = None

    async def admit(self) -> bool:
        """The guard's check before the endpoint takes requests again."""
        try:
            entry = await listing(self.endpoint)
        except FatalEndpointError as error:
            log.error("%s cannot be used: %s", self.endpoint.client.endpoint, error, extra=SAY)
            return False
        return entry.down is None and self.check(entry.models)

    def check(self, listed: list[str] | None) -> bool:
        """Whether ``listed`` lets the endpoint serve the run; said once for each listing that does not."""
        if listed is None or self.model in listed:
            return True
        said, self._said = self._said == listed, listed
        url = self.endpoint.client.endpoint
        if self.configured:
            if not said:
                log.warning(
                    "%s lists %s, not %s (the model its [[endpoints]] names): the server answers for the "
                    "model it runs and every row says %s; if that is not the same model, set model to "
                    "what it serves (or leave model out: it is read from the server)",
                    url,
                    listed,
                    self.model,
                    self.model,
                    extra=SAY,
                )
            return True
        if not said:
            log.error(
                "%s answers but serves %s, not %s (the model of the run): it gets no prompt until it "
                "serves %s",
                url,
                listed,
                self.model,
                self.model,
                extra=SAY,
            )
        return False
