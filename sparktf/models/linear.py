"""Linear regression ``y = W x + b`` on the book's 17-point data set (3.6).

Loss ``sum((y - y_)**2) / (2 N)``, plain SGD at learning rate 0.01 on the full batch for
1000 steps; ``W`` starts from a standard normal draw and ``b`` from zero.  The data set
is built in: :data:`BOOK_X`, :data:`BOOK_Y`, :func:`book_dataset`, and
:func:`least_squares_fit` gives the exact optimum to compare against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import keras
import numpy as np
import tensorflow as tf

from sparktf.models.export import Endpoint
from sparktf.models.optim import apply_gradients, current_learning_rate
from sparktf.models.task import Batch, Metrics, ModelTask, RegistryModel

__all__ = ["BOOK_X", "BOOK_Y", "LinearRegressionTask", "book_dataset", "least_squares_fit"]

BOOK_X = np.array(
    [3.3, 4.4, 5.5, 6.71, 6.93, 4.168, 9.779, 6.182, 7.59, 2.167,
     7.042, 10.791, 5.313, 7.997, 5.654, 9.27, 3.1],
    dtype=np.float32,
)  # fmt: skip
BOOK_Y = np.array(
    [1.7, 2.76, 2.09, 3.19, 1.694, 1.573, 3.366, 2.596, 2.53, 1.221,
     2.827, 3.465, 1.65, 2.904, 2.42, 2.94, 1.3],
    dtype=np.float32,
)  # fmt: skip


def book_dataset(batch_size: int = len(BOOK_X)) -> tf.data.Dataset:
    """The 17 points as a dataset of ``{"x": float32[B], "y": float32[B]}`` batches."""
    return tf.data.Dataset.from_tensor_slices({"x": BOOK_X, "y": BOOK_Y}).batch(batch_size)


def least_squares_fit(x: np.ndarray = BOOK_X, y: np.ndarray = BOOK_Y) -> tuple[float, float]:
    """The exact ``(W, b)`` minimising the squared error (float64)."""
    design = np.stack([np.asarray(x, np.float64), np.ones(len(x))], axis=1)
    (w, b), *_ = np.linalg.lstsq(design, np.asarray(y, np.float64), rcond=None)
    return float(w), float(b)


class LinearRegressionTask(ModelTask):
    family: ClassVar[str] = "linear_regression"
    kind: ClassVar[str] = "regression"
    description: ClassVar[str] = "y = W x + b on a 17-point data set"
    defaults: ClassVar[Mapping[str, Any]] = {
        "batch_size": len(BOOK_X),
        "epochs": None,
        "max_steps": 1000,
        "optimizer": {"name": "sgd"},
        "learning_rate": 0.01,
        "lr_schedule": "constant",
    }

    @property
    def features(self) -> tuple[str, ...]:
        return ("x", "y")

    @property
    def input_shape(self) -> tuple[()]:
        return ()

    def build_model(self) -> keras.Model:
        x = keras.Input((), dtype="float32", name="x")
        h = keras.ops.expand_dims(x, -1)
        h = keras.layers.Dense(
            1,
            kernel_initializer=keras.initializers.RandomNormal(stddev=1.0),
            bias_initializer="zeros",
            name="linear",
        )(h)
        y = keras.ops.squeeze(h, -1)
        return RegistryModel(x, y, self.name, self.config, name=self.name)

    def weights_and_bias(self, model: keras.Model) -> tuple[float, float]:
        """The fitted ``(W, b)``."""
        kernel, bias = model.get_layer("linear").get_weights()
        return float(kernel.reshape(())), float(bias.reshape(()))

    def _per_example(self, model: keras.Model, batch: Batch, training: bool) -> tf.Tensor:
        prediction = tf.cast(model(tf.cast(batch["x"], tf.float32), training=training), tf.float32)
        return 0.5 * tf.square(prediction - tf.cast(batch["y"], tf.float32))

    def train_step(
        self, model: keras.Model, optimizer: Any, batch: Batch, global_batch_size: int
    ) -> Metrics:
        with tf.GradientTape() as tape:
            per_example = self._per_example(model, batch, training=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        apply_gradients(optimizer, loss, tape, model.trainable_variables)
        return {
            "loss": tf.reduce_mean(per_example),
            "learning_rate": current_learning_rate(optimizer),
        }

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        return {"loss": tf.reduce_mean(self._per_example(model, batch, training=False))}

    def serving_endpoints(self, model: keras.Model) -> dict[str, Endpoint]:
        def predict(x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": model(x, training=False)}

        return {"serving_default": (predict, [tf.TensorSpec([None], tf.float32, name="x")])}

    def signature_info(self) -> dict[str, dict[str, dict[str, str]]]:
        return {"serving_default": {"inputs": {"x": "float32[B]"}, "outputs": {"y": "float32[B]"}}}

    def example_batch(self, batch_size: int, seed: int = 0) -> dict[str, tf.Tensor]:
        idx = np.random.default_rng(seed).integers(0, len(BOOK_X), size=batch_size)
        return {"x": tf.constant(BOOK_X[idx]), "y": tf.constant(BOOK_Y[idx])}
