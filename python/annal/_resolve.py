"""Resolves the futures of the ``_async`` methods on their event loop."""


def resolve_many(items):
    for future, ok, value in items:
        if future.cancelled():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
