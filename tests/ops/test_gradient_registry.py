"""fieldhmc.ops.gradient_registry: the workaround for TensorFlow's leaked custom gradients
(tensorflow/tensorflow#27492, #97697)."""

import gc
import weakref

import numpy as np
import tensorflow as tf

from fieldhmc.ops.gradient_registry import releases_custom_gradients

BIG = 1 << 16


@tf.custom_gradient
def _doubled(x):
    # A deliberately different gradient (3, not 2): shows the custom one is the one used.
    return 2.0 * x, lambda dy: 3.0 * dy


def _trace(fn):
    """Trace ``fn`` (a gradient taken inside, over a captured eager tensor) and call it;
    return its value and weak references to the traced graph and the captured tensor."""
    weights = tf.constant(np.ones(BIG, np.float32))  # captured, as a model's constants

    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(_doubled(x * weights))
        return tape.gradient(y, x)

    f = tf.function(fn(body), autograph=False)
    x = tf.ones([BIG])
    grad = f(x).numpy()
    return grad, (weakref.ref(f.get_concrete_function(x).graph), weakref.ref(weights))


def test_tensorflow_still_keeps_a_traced_custom_gradient_graph():
    """The upstream leak this module works around: when this fails, TensorFlow frees the
    graph by itself and ``releases_custom_gradients`` can go."""
    _, (graph, weights) = _trace(lambda body: body)
    gc.collect()
    assert graph() is not None and weights() is not None


def test_released_custom_gradients_free_the_graph_and_its_captures():
    grad, (graph, weights) = _trace(releases_custom_gradients)
    gc.collect()
    np.testing.assert_array_equal(grad, np.full(BIG, 3.0, np.float32))  # the custom gradient
    assert graph() is None and weights() is None
