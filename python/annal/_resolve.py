"""Resolves the futures of the ``_async`` methods on their event loop."""


def resolve(future, ok, value):
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
