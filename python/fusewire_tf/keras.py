"""Keras layers whose variables live on fusewire's parameter servers.

Each layer pulls its values in the forward pass and pushes their gradients in
the backward pass (the ops' registered gradients), so model.fit and custom
GradientTape loops train them with no extra code; the PS applies its own
optimizer (the model spec's). The layer owns one float scalar, `trigger`,
that is always zero: it puts the pull on the tape's gradient path. Keras's
optimizer sees only these zero-gradient scalars, which stay zero.

Layers given the same PullGroup pull together: in a traced step (model.fit,
a tf.function) the first of them to run pulls the dense variables of every
built layer of the group, plus its own rows, in one pull_many (one request
per PS), and their gradients go back in one push; the others take their
values from it. Embedding layers called after the first pull their own rows.
"""

import keras
import tensorflow as tf

import fusewire_tf


class PullGroup:
    """Fusewire layers that pull a step's values together (pass it as
    `group=` to each; one group per model). In a traced step the first of
    them to run pulls the dense variables of all the group's built layers
    with its own rows; in eager mode each layer pulls its own."""

    def __init__(self):
        self.layers = []
        self._graph = None  # the graph _values belong to (held, so never mistaken for a later one)
        self._values = {}

    def _join(self, layer):
        if layer not in self.layers:
            self.layers.append(layer)

    def _first(self):
        """True when no layer of the group pulled in the graph being traced."""
        return tf.compat.v1.get_default_graph() is not self._graph

    def _pull(self, trigger, rows=()):
        dense = [d for layer in self.layers if layer.built for d in layer._dense_vars()]
        values, pulled = fusewire_tf.pull_many(dense, list(rows), trigger=trigger)
        self._graph = tf.compat.v1.get_default_graph()
        self._values = {var: v for (var, _), v in zip(dense, values)}
        return pulled

    def _dense(self, layer, trigger):
        names = [var for var, _ in layer._dense_vars()]
        if tf.executing_eagerly():
            return fusewire_tf.pull_many(layer._dense_vars(), trigger=trigger)[0]
        if self._first() or any(var not in self._values for var in names):
            self._pull(trigger)
        return [self._values[var] for var in names]

    def _rows(self, layer, ids, trigger):
        if tf.executing_eagerly() or not self._first():
            return fusewire_tf.pull_rows(layer.var, ids, layer.dim, trigger=trigger)
        return self._pull(trigger, [(layer.var, ids, layer.dim)])[0]


class _PSLayer(keras.layers.Layer):
    def __init__(self, group=None, **kwargs):
        super().__init__(**kwargs)
        self.group = group
        if group is not None:
            group._join(self)

    def build(self, input_shape):
        self.trigger = self.add_weight(name="trigger", shape=(), initializer="zeros", trainable=True)
        super().build(input_shape)

    def _trigger(self):
        return tf.convert_to_tensor(self.trigger)

    def _dense_vars(self):
        return []


class Embedding(_PSLayer):
    """Rows of PS embedding `var` (declared in the model spec with this `dim`)
    by integer id: output shape ids.shape + [dim]."""

    def __init__(self, var, dim, group=None, **kwargs):
        super().__init__(group, **kwargs)
        self.var = var
        self.dim = int(dim)

    def call(self, ids):
        if self.group is not None:
            return self.group._rows(self, tf.cast(ids, tf.int64), self._trigger())
        return fusewire_tf.pull_rows(self.var, ids, self.dim, trigger=self._trigger())

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.dim,)

    def get_config(self):
        return {**super().get_config(), "var": self.var, "dim": self.dim}


class PSDense(_PSLayer):
    """A dense layer y = activation(x @ W + b) whose W ([in, units], variable
    `var` + "/kernel") and b ([units], `var` + "/bias") live on the PS."""

    def __init__(self, var, units, activation=None, use_bias=True, group=None, **kwargs):
        super().__init__(group, **kwargs)
        self.var = var
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias

    def build(self, input_shape):
        self.in_dim = int(input_shape[-1])
        super().build(input_shape)

    def _dense_vars(self):
        out = [(self.var + "/kernel", [self.in_dim, self.units])]
        if self.use_bias:
            out.append((self.var + "/bias", [self.units]))
        return out

    def call(self, x):
        if self.group is not None:
            values = self.group._dense(self, self._trigger())
        else:
            # Kernel and bias in one pull (one request per PS), their gradients in one push.
            values, _ = fusewire_tf.pull_many(self._dense_vars(), trigger=self._trigger())
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
