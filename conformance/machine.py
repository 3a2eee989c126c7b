"""The set-up the suite's state machines share: one target per run, opened by the machine's
``initialize`` rule and closed at teardown, and the adapter's capabilities at hand."""

from __future__ import annotations

from contextlib import AbstractContextManager

from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from routespec.testing.target import Adapter, Capability, Target, TargetConfig


class TargetMachine(RuleBasedStateMachine):
    """A machine that drives one target of ``adapter``; subclasses open it with ``open``."""

    def __init__(self, adapter: Adapter) -> None:
        super().__init__()
        self.adapter = adapter
        self.caps = adapter.capabilities
        self.context: AbstractContextManager[Target] | None = None
        self.target: Target

    def has(self, capability: Capability) -> bool:
        return capability in self.caps

    def diverges(self, check: str) -> bool:
        """Whether the adapter documents ``check`` (a check name, any parameters) as an
        expected failure: a step that would only repeat that known divergence is left out, so
        the machine goes on searching the rest (the check itself gives the verdict)."""
        return any(name.partition("[")[0] == check for name in self.adapter.expected_failures)

    def open(self, config: TargetConfig) -> Target:
        self.context = self.adapter.open(config)
        self.target = self.context.__enter__()
        return self.target

    def teardown(self) -> None:
        if self.context is not None:
            self.context.__exit__(None, None, None)

    @classmethod
    def run(cls, adapter: Adapter) -> None:
        """Run the machine under the current Hypothesis profile."""
        # Hypothesis accepts any factory returning a machine; its stub says type[...] only.
        factory = lambda: cls(adapter)  # noqa: E731
        run_state_machine_as_test(factory, settings=settings())  # type: ignore[arg-type]
