"""How a check cites requirements and reports a violation of one.

A check fails on a requirement through ``require`` (or one of its structured forms,
``require_equal``, ``require_compare``, ``require_false``): the violation carries the
requirement ID, the check's own words, and, where the check states them, the expected and
the actual value as separate fields. The plugin adds the requirement's sentence from the
registry and the calls the check made on its target (see ``RecordingTarget``).
"""

from __future__ import annotations

import operator
import reprlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Final, TypeVar

import pytest
from hypothesis import currently_in_test_context

from routespec.testing.target import Adapter, Capability, ObservedError, Target, TargetConfig

F = TypeVar("F", bound=Callable[..., object])


class RequirementViolation(AssertionError):
    """A check observed behaviour that contradicts one requirement.

    ``expected`` and ``actual`` are texts (``None`` when the check did not state them
    separately; ``detail`` then says both in words).
    """

    def __init__(
        self,
        requirement_id: str,
        detail: str,
        *,
        expected: str | None = None,
        actual: str | None = None,
    ) -> None:
        self.requirement_id = requirement_id
        self.detail = detail
        self.expected = expected
        self.actual = actual
        message = f"{requirement_id}: {detail}"
        if expected is not None:
            message += f"\nexpected: {expected}"
        if actual is not None:
            message += f"\nactual:   {actual}"
        super().__init__(message)


_evidence: set[str] = set()


def take_evidence() -> set[str]:
    """The IDs checked since the last call (the plugin calls this around each check)."""
    taken = set(_evidence)
    _evidence.clear()
    return taken


def exercised(*requirement_ids: str) -> None:
    """Record that the running check observed behaviour governed by these requirements."""
    _evidence.update(requirement_ids)


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Final = _Unset()


def as_text(value: object) -> str | None:
    """How ``expected=``/``actual=`` values appear in a report: text as is, else ``repr``."""
    if value is UNSET:
        return None
    return value if isinstance(value, str) else repr(value)


def require(
    requirement_id: str,
    condition: bool,
    detail: str,
    *,
    expected: object = UNSET,
    actual: object = UNSET,
) -> None:
    """Fail the enclosing check on ``requirement_id`` unless ``condition`` holds.

    ``expected`` and ``actual``, when given, are reported as separate fields (a ``str`` as
    written, any other value as its ``repr``). Either way the requirement counts as
    exercised: a check that cites an ID but never evaluates it (its steps needed
    capabilities the adapter lacks) reports SKIP for that ID.
    """
    _evidence.add(requirement_id)
    if not condition:
        raise RequirementViolation(
            requirement_id, detail, expected=as_text(expected), actual=as_text(actual)
        )


def require_equal(requirement_id: str, actual: object, expected: object, detail: str) -> None:
    """``require(requirement_id, actual == expected, detail)``, reporting both values."""
    _evidence.add(requirement_id)
    equal = actual == expected
    if not equal:
        raise RequirementViolation(
            requirement_id, detail, expected=repr(expected), actual=repr(actual)
        )


_COMPARISONS: Final[Mapping[str, Callable[[Any, Any], object]]] = {
    "!=": operator.ne,
    "is": operator.is_,
    "is not": operator.is_not,
    "in": lambda item, container: item in container,
    "not in": lambda item, container: item not in container,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def require_compare(
    requirement_id: str, actual: object, comparison: str, bound: object, detail: str
) -> None:
    """``require(requirement_id, actual <comparison> bound, detail)`` for a comparison
    operator other than ``==`` (``"!="``, ``"is"``, ``"is not"``, ``"in"``, ``"not in"``,
    ``"<"``, ``"<="``, ``">"``, ``">="``), reporting the actual value and what was expected
    of it (``None`` for ``is None``, else the operator and the bound)."""
    _evidence.add(requirement_id)
    if not _COMPARISONS[comparison](actual, bound):
        expected = repr(bound) if comparison == "is" else f"{comparison} {bound!r}"
        raise RequirementViolation(requirement_id, detail, expected=expected, actual=repr(actual))


def require_false(requirement_id: str, actual: object, detail: str) -> None:
    """``require(requirement_id, not actual, detail)``, reporting the actual value."""
    _evidence.add(requirement_id)
    if actual:
        raise RequirementViolation(
            requirement_id, detail, expected="false or empty", actual=repr(actual)
        )


def covers(*requirement_ids: str) -> Callable[[F], F]:
    """Mark a check with the requirement IDs it tests (string literals: docs read them)."""
    return pytest.mark.covers(*requirement_ids)


def requires(*capabilities: Capability) -> Callable[[F], F]:
    """Mark a check with the adapter capabilities it needs; without them it is SKIP."""
    return pytest.mark.requires(*capabilities)


# Steps: the calls a check made on its target, for the report of a violation.

MAX_STEPS: Final = 100
MAX_STEP_CHARS: Final = 400
_steps: deque[str] = deque(maxlen=MAX_STEPS)
_step_count = 0


def take_steps() -> tuple[int, tuple[str, ...]]:
    """How many target calls were recorded since the last call, and the last ``MAX_STEPS``
    of them as ``"method(args) -> result"`` lines (the plugin calls this around each check)."""
    taken = (_step_count, tuple(_steps))
    _forget_steps()
    return taken


def _forget_steps() -> None:
    global _step_count
    _steps.clear()
    _step_count = 0


def _record(line: str) -> None:
    global _step_count
    _step_count += 1
    if len(line) > MAX_STEP_CHARS:
        line = line[: MAX_STEP_CHARS - 1] + "…"
    _steps.append(line)


def _bounded_repr() -> reprlib.Repr:
    """``repr`` that stays short however large the value (a step is one line)."""
    shown = reprlib.Repr()
    shown.maxlevel = 4
    shown.maxstring = shown.maxother = 200
    shown.maxlist = shown.maxtuple = shown.maxset = shown.maxfrozenset = shown.maxdict = 8
    return shown


_SHOW: Final = _bounded_repr()


def _call_text(prefix: str, name: str, args: tuple[object, ...], kwargs: dict[str, Any]) -> str:
    shown = [_SHOW.repr(a) for a in args] + [f"{k}={_SHOW.repr(v)}" for k, v in kwargs.items()]
    return f"{prefix}{name}({', '.join(shown)})"


_SHORT_RESULT: Final = 120


class _Recording:
    """Delegates to ``wrapped``; each public method call is recorded as a step."""

    def __init__(self, wrapped: object, prefix: str) -> None:
        self._wrapped = wrapped
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._wrapped, name)
        if name.startswith("_") or not callable(attribute):
            return attribute

        def recorded(*args: object, **kwargs: Any) -> object:
            line = _call_text(self._prefix, name, args, kwargs)
            try:
                result = attribute(*args, **kwargs)
            except BaseException as error:
                _record(f"{line} raised {type(error).__name__}: {error}")
                raise
            result = self._wrap_result(name, result)
            if result is None:
                _record(line)
            else:
                shown = _SHOW.repr(result)
                if len(shown) > _SHORT_RESULT:
                    shown = shown[: _SHORT_RESULT - 1] + "…"
                _record(f"{line} -> {shown}")
            return result

        return recorded

    def _wrap_result(self, name: str, result: object) -> object:
        return result

    def __repr__(self) -> str:
        return repr(self._wrapped)


class RecordingTarget(_Recording):
    """A ``Target`` whose calls (and those on the host and discovery targets it opens) are
    recorded as the check's steps."""

    def _wrap_result(self, name: str, result: object) -> object:
        if name == "open_host" and not isinstance(result, ObservedError):
            return _Recording(result, "host.")
        if name == "open_discovery":
            return _Recording(result, "discovery.")
        return result


class RecordingAdapter:
    """An ``Adapter`` whose targets record the calls made on them."""

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter

    @property
    def name(self) -> str:
        return self.adapter.name

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.adapter.capabilities

    @property
    def expected_failures(self) -> Mapping[str, str]:
        return self.adapter.expected_failures

    def open(self, config: TargetConfig) -> AbstractContextManager[Target]:
        return self._open(config)

    @contextmanager
    def _open(self, config: TargetConfig) -> Iterator[Target]:
        if currently_in_test_context():
            _forget_steps()  # a new Hypothesis example: the steps are this example's
        _record(f"open({config!r})")
        with self.adapter.open(config) as target:
            yield RecordingTarget(target, "")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)

    def __repr__(self) -> str:
        return repr(self.adapter)
