"""Keras layers whose variables live on fusewire's parameter servers.

Each layer pulls its values in the forward pass and pushes their gradients in
the backward pass (the ops' registered gradients), so model.fit and custom
GradientTape loops train them with no extra code; the PS applies its own
optimizer (the model spec's). The layer owns one float scalar, `trigger`,
that is always zero: it puts the pull on the tape's gradient path. Keras's
optimizer sees only these zero-gradient scalars, which stay zero.
"""

import keras
import tensorflow as tf

import fusewire_tf


class _PSLayer(keras.layers.Layer):
    def build(self, input_shape):
        self.trigger = self.add_weight(name="trigger", shape=(), initializer="zeros", trainable=True)
        super().build(input_shape)

    def _trigger(self):
        return tf.convert_to_tensor(self.trigger)


class Embedding(_PSLayer):
    """Rows of PS embedding `var` (declared in the model spec with this `dim`)
    by integer id: output shape ids.shape + [dim]."""

    def __init__(self, var, dim, **kwargs):
        super().__init__(**kwargs)
        self.var = var
        self.dim = int(dim)

    def call(self, ids):
        return fusewire_tf.pull_rows(self.var, ids, self.dim, trigger=self._trigger())

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.dim,)

    def get_config(self):
        return {**super().get_config(), "var": self.var, "dim": self.dim}


class PSDense(_PSLayer):
    """A dense layer y = activation(x @ W + b) whose W ([in, units], variable
    `var` + "/kernel") and b ([units], `var` + "/bias") live on the PS."""

    def __init__(self, var, units, activation=None, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.var = var
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias

    def build(self, input_shape):
        self.in_dim = int(input_shape[-1])
        super().build(input_shape)

    def call(self, x):
        # Kernel and bias in one pull (one request per PS), their gradients in one push.
        dense = [(self.var + "/kernel", [self.in_dim, self.units])]
        if self.use_bias:
            dense.append((self.var + "/bias", [self.units]))
        values, _ = fusewire_tf.pull_many(dense, trigger=self._trigger())
        y = tf.matmul(x, values[0])
        if self.use_bias:
            y = y + values[1]
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "var": self.var, "units": self.units,
                "activation": keras.activations.serialize(self.activation), "use_bias": self.use_bias}


def dense_spec(var, in_dim, units, use_bias=True, init=None):
    """The model-spec entries PSDense(var, units) on `in_dim` inputs needs."""
    init = init or {"type": "uniform", "a": -0.05, "b": 0.05, "seed": 1}
    out = [{"name": var + "/kernel", "kind": "dense", "shape": [in_dim, units], "init": init}]
    if use_bias:
        out.append({"name": var + "/bias", "kind": "dense", "shape": [units]})
    return out
