"""The suite's order (tests/conftest.py `longest_first`): the modules of the longest tests
first, in `LONGEST_FIRST`'s order, then the other modules holding a `slow` test, each module's
tests together, checked on this run's own collection."""

from pathlib import Path

from conftest import LONGEST_FIRST, SLOW_MARK

TESTS = Path(__file__).resolve().parent


def _module(item) -> str:
    return item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def _modules(items) -> list[str]:
    """The test modules of `items` in the order they run, one entry per run of one module."""
    names = [_module(item) for item in items]
    return [name for i, name in enumerate(names) if i == 0 or name != names[i - 1]]


def test_every_listed_module_exists():
    # A renamed or removed module would silently stop being scheduled first.
    assert [name for name in LONGEST_FIRST if not (TESTS / name).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_the_longest_tests_modules_run_first_each_module_whole(request):
    items = request.session.items
    order = _modules(items)
    assert len(order) == len(set(order)), "a module's tests are split: " + ", ".join(order)
    listed = [name for name in order if name in LONGEST_FIRST]
    assert order[: len(listed)] == sorted(listed, key=LONGEST_FIRST.index)
    slow = {_module(item) for item in items if item.get_closest_marker(SLOW_MARK) is not None}
    rest = order[len(listed) :]
    ranks = [0 if name in slow else 1 for name in rest]
    assert ranks == sorted(ranks), rest
