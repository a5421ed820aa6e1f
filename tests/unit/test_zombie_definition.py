"""The dead-run automation is compared by what it does, not by the order its sets were dumped in."""

from __future__ import annotations

import json

from prefect.automations import Automation

from flows.orchestration.zombies import _definition, zombie_automation


def _reordered(automation: Automation) -> Automation:
    """The same automation with every list of its JSON reversed (how a server may give it back)."""

    def reverse(value: object) -> object:
        if isinstance(value, dict):
            return {key: reverse(item) for key, item in value.items()}
        if isinstance(value, list):
            return [reverse(item) for item in reversed(value)]
        return value

    return Automation.model_validate(reverse(json.loads(automation.model_dump_json())))


def test_an_automation_given_back_with_its_sets_in_another_order_is_up_to_date() -> None:
    wanted = zombie_automation()
    assert _definition(_reordered(wanted)) == _definition(wanted)
    changed = zombie_automation(missed=4)
    assert _definition(changed) != _definition(wanted)
