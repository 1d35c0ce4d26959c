"""Release the gradient functions ``tf.custom_gradient`` registers while a function is traced.

In graph mode (inside every ``tf.function`` trace) TensorFlow 2.21's
``tf.custom_gradient`` registers each call's gradient function under a new name
(``"CustomGradient-<uid>"``) in the process-wide gradient registry and never removes it
(tensorflow/tensorflow#27492, #97697). The function closes over the traced tensors, so
the traced ``FuncGraph`` -- and with it every eager tensor and variable the function
captured -- lives as long as the process. For the compiled sampler that was the carried
state, its gradient and the field's running moments (in ``tf.Variable`` s) and the
model's captured constants: after a 256³ run, ~8 fields per chain stayed resident under
everything that came after (export, diagnose, plot), with nothing in Python holding them.

:func:`releases_custom_gradients` wraps a function that is traced (not differentiated
afterwards): the gradients it takes inside are built during its trace, so the entries its
trace added can go when the trace returns. ``tests/ops/test_gradient_registry.py`` fails
if TensorFlow stops leaking (the workaround can then go) or if the workaround is removed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from tensorflow.python.framework import ops as tf_ops

__all__ = ["releases_custom_gradients"]

_PREFIX = "CustomGradient-"  # tensorflow/python/ops/custom_gradient.py, _graph_mode_decorator

F = TypeVar("F", bound=Callable)


def _registered() -> dict:
    # Private: the upstream leak has no public remedy (see the module docstring).
    return tf_ops._gradient_registry._registry  # noqa: SLF001


def releases_custom_gradients(fn: F) -> F:
    """``fn``, dropping the ``tf.custom_gradient`` registrations its calls add.

    For functions given to ``tf.function`` whose gradients are all taken inside them
    (a sampler's compiled step): once a trace returns, nothing reads those
    registrations again, and dropping them lets the traced graph, its captured tensors
    and variables be freed with the ``tf.function``. Do not use it on a function whose
    result is differentiated from outside (its backward pass would need them).

    Parameters
    ----------
    fn : callable

    Returns
    -------
    callable
        Same signature and result as ``fn``.
    """

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        registry = _registered()
        before = set(registry)
        try:
            return fn(*args, **kwargs)
        finally:
            for name in [k for k in registry if k not in before and k.startswith(_PREFIX)]:
                del registry[name]

    return wrapped  # type: ignore[return-value]
