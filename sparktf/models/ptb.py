"""Word-level LSTM language model on PTB (book 11.2; Zaremba et al. 2014).

Embedding -> dropout -> ``num_layers`` x (LSTM -> dropout) -> softmax over the
vocabulary.  All weights start uniform in ``[-init_scale, init_scale]`` (LSTM biases at
zero, no forget-gate bias), dropout rate ``1 - keep_prob``.  Trained with plain SGD at
learning rate 1.0, multiplied by ``lr_decay`` every epoch after ``max_epoch``, the
gradient clipped to global norm ``max_grad_norm``; the optimised cost is the
cross-entropy summed over the unrolled steps and averaged over the batch, as in the book.

A batch carries ``tokens`` int64 [B, num_steps + 1]: consecutive chunks of B parallel
token streams, so ``x = tokens[:, :-1]`` and ``y = tokens[:, 1:]``.  The LSTM state is
carried from one batch to the next in state variables held by the model (one copy per
replica); see :class:`PTBLanguageModel`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.export import Endpoint
from sparktf.models.layers import SERIALIZABLE_PACKAGE, count_params
from sparktf.models.optim import apply_gradients, current_learning_rate
from sparktf.models.task import Batch, Metrics, ModelTask, RegistryConfigMixin

__all__ = ["LSTMState", "PTBLanguageModel", "PTBTask"]

logger = logging.getLogger(__name__)

LSTMState = list[list[tf.Tensor]]  # per layer: [h, c], each [B, hidden_size]


def _state_variable(shape: Sequence[int], name: str) -> tf.Variable:
    """A non-trainable zero variable that each replica (or PS worker) owns privately."""
    strategy = tf.distribute.get_strategy()
    initial = tf.zeros(shape, tf.float32)
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        if getattr(strategy, "_cluster_coordinator", None) is not None:
            return tf.Variable(initial, trainable=False, name=name, per_worker_variable=True)
        logger.warning(
            "ParameterServerStrategy without a ClusterCoordinator: the LSTM state %s is "
            "shared by all workers; create the coordinator before building the model",
            name,
        )
    return tf.Variable(
        initial,
        trainable=False,
        name=name,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


class _StateHolder:
    """Plain (untracked) container, so the state stays out of weights, checkpoints and
    SavedModels: it is per-replica scratch, not a parameter."""

    def __init__(self, variables: list[list[tf.Variable]]) -> None:
        self.variables = variables


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class PTBLanguageModel(RegistryConfigMixin, keras.Model):
    """LSTM language model.

    ``model(tokens)`` runs from a zero state and returns logits [B, T, vocab_size];
    ``model(tokens, initial_state=s, return_state=True)`` returns ``(logits, state)``.

    The carried state lives in variables of shape [state_batch_size, hidden_size]
    (:meth:`create_state`, done by ``build_model``): :meth:`read_state`,
    :meth:`write_state` and :meth:`reset_states` use them; the task's ``train_step`` /
    ``eval_step`` read the state before and write it after every batch.
    """

    def __init__(self, task_name: str, task_config: Mapping[str, Any], **kwargs: Any) -> None:
        kwargs.setdefault("name", task_name)
        super().__init__(**kwargs)
        self._set_task(task_name, task_config)
        c = task_config
        scale = float(c["init_scale"])
        rate = 1.0 - float(c["keep_prob"])

        def init() -> keras.initializers.Initializer:
            return keras.initializers.RandomUniform(-scale, scale)

        self.hidden_size = int(c["hidden_size"])
        self.num_layers = int(c["num_layers"])
        self.embedding = keras.layers.Embedding(
            int(c["vocab_size"]), self.hidden_size, embeddings_initializer=init(), name="embedding"
        )
        self.input_dropout = keras.layers.Dropout(rate, name="embedding_dropout")
        self.lstm_layers = [
            keras.layers.LSTM(
                self.hidden_size,
                return_sequences=True,
                return_state=True,
                kernel_initializer=init(),
                recurrent_initializer=init(),
                bias_initializer="zeros",
                unit_forget_bias=False,
                name=f"lstm_{i}",
            )
            for i in range(self.num_layers)
        ]
        self.output_dropouts = [
            keras.layers.Dropout(rate, name=f"lstm_{i}_dropout") for i in range(self.num_layers)
        ]
        # TensorFlow checkpoints do not follow Keras' layer lists: name each LSTM as an
        # attribute too, so tf.train.Checkpoint(model=...) holds its weights.
        for i, layer in enumerate(self.lstm_layers):
            setattr(self, f"lstm_{i}", layer)
        self.softmax = keras.layers.Dense(
            int(c["vocab_size"]),
            kernel_initializer=init(),
            bias_initializer=init(),
            dtype="float32",  # logits in float32 under a mixed precision policy
            name="softmax",
        )
        self._state = _StateHolder([])

    def call(
        self,
        tokens: tf.Tensor,
        training: bool | None = None,
        initial_state: LSTMState | None = None,
        return_state: bool = False,
    ) -> tf.Tensor | tuple[tf.Tensor, LSTMState]:
        x = self.embedding(tokens)
        x = self.input_dropout(x, training=training)
        final_state = []
        for i, (lstm, dropout) in enumerate(zip(self.lstm_layers, self.output_dropouts)):
            state = None if initial_state is None else list(initial_state[i])
            x, h, c = lstm(x, initial_state=state, training=training)
            x = dropout(x, training=training)
            final_state.append([h, c])
        logits = self.softmax(x)
        return (logits, final_state) if return_state else logits

    # -- carried state -----------------------------------------------------------------

    def create_state(self, batch_size: int) -> None:
        """Creates the state variables for ``batch_size`` streams (per replica)."""
        self._state = _StateHolder(
            [
                [
                    _state_variable([batch_size, self.hidden_size], f"{self.name}_lstm_{i}_{part}")
                    for part in ("h", "c")
                ]
                for i in range(self.num_layers)
            ]
        )

    @property
    def state_batch_size(self) -> int | None:
        if not self._state.variables:
            return None
        return int(self._state.variables[0][0].shape[0])

    def check_state(self, batch_size: int | None) -> None:
        if not self._state.variables:
            raise SparktfValueError(
                "the model has no state variables; build it with task.build_model()"
            )
        if batch_size is not None and batch_size != self.state_batch_size:
            raise SparktfValueError(
                f"PTB batch has {batch_size} rows per replica but the LSTM state holds "
                f"{self.state_batch_size}; batches must be exactly config batch_size / "
                "num_replicas_in_sync rows (use drop_remainder=True)"
            )

    def read_state(self, reset: tf.Tensor | None = None) -> LSTMState:
        """The carried state; rows where ``reset`` [B] is nonzero start from zero."""
        self.check_state(None)
        state = [[tf.identity(v) for v in layer] for layer in self._state.variables]
        if reset is not None:
            keep = 1.0 - tf.cast(tf.reshape(reset, [-1, 1]) != 0, tf.float32)
            state = [[v * keep for v in layer] for layer in state]
        return state

    def write_state(self, state: LSTMState) -> None:
        for variables, values in zip(self._state.variables, state):
            for variable, value in zip(variables, values):
                variable.assign(tf.cast(value, variable.dtype))  # 16-bit under mixed precision

    def reset_states(self) -> None:
        """Zeroes the carried state (all replicas when called outside ``strategy.run``)."""
        for layer in self._state.variables:
            for variable in layer:
                variable.assign(tf.zeros_like(variable))


_SMALL: Mapping[str, Any] = {
    "vocab_size": 10000,
    "num_layers": 2,
    "hidden_size": 200,
    "num_steps": 20,
    "keep_prob": 1.0,
    "init_scale": 0.1,
    "max_grad_norm": 5.0,
    "batch_size": 20,
    "learning_rate": 1.0,
    "lr_decay": 0.5,
    "max_epoch": 4,
    "epochs": 13,
}


class PTBTask(ModelTask):
    family: ClassVar[str] = "ptb_lstm"
    kind: ClassVar[str] = "language_model"
    description: ClassVar[str] = "PTB word-level LSTM language model (11.2)"
    defaults: ClassVar[Mapping[str, Any]] = {
        **_SMALL,
        "max_steps": None,
        "optimizer": {"name": "sgd"},
        "lr_schedule": "epoch_decay",
    }
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "ptb_small": _SMALL,
        "ptb_medium": {
            "num_layers": 2, "hidden_size": 650, "num_steps": 35, "keep_prob": 0.5,
            "init_scale": 0.05, "max_grad_norm": 5.0, "lr_decay": 0.8, "max_epoch": 6,
            "epochs": 39,
        },
        "ptb_large": {
            "num_layers": 2, "hidden_size": 1500, "num_steps": 35, "keep_prob": 0.35,
            "init_scale": 0.04, "max_grad_norm": 10.0, "lr_decay": 1 / 1.15, "max_epoch": 14,
            "epochs": 55,
        },
    }  # fmt: skip

    @property
    def features(self) -> tuple[str, ...]:
        return ("tokens",)

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def num_steps(self) -> int:
        """Unrolled LSTM steps; a batch's ``tokens`` has ``num_steps + 1`` columns."""
        return int(self.config["num_steps"])

    @property
    def seq_len(self) -> int:
        return self.num_steps + 1

    @property
    def input_shape(self) -> tuple[int]:
        return (self.num_steps,)

    def validate(self) -> None:
        if not 0.0 < self.config["keep_prob"] <= 1.0:
            raise SparktfValueError(f"keep_prob must be in (0, 1], got {self.config['keep_prob']}")

    def build_model(self) -> keras.Model:
        """The model plus its state variables, sized per replica: ``batch_size /
        num_replicas_in_sync`` of the strategy in scope (``batch_size`` under a
        ParameterServerStrategy, whose workers each take whole batches)."""
        model = PTBLanguageModel(self.name, self.config)
        model(tf.zeros([1, 1], tf.int64))  # creates the weights
        strategy = tf.distribute.get_strategy()
        replicas = strategy.num_replicas_in_sync
        if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            replicas = 1
        if self.batch_size % replicas:
            raise SparktfValueError(
                f"batch_size {self.batch_size} is not divisible by the {replicas} replicas"
            )
        model.create_state(self.batch_size // replicas)
        logger.info(
            "built %s: %d trainable parameters, state for %d streams per replica",
            self.name,
            count_params(model.trainable_weights),
            model.state_batch_size,
        )
        return model

    def _split(self, batch: Batch) -> tuple[tf.Tensor, tf.Tensor]:
        tokens = tf.cast(batch["tokens"], tf.int64)
        return tokens[:, :-1], tokens[:, 1:]

    def _step(
        self, model: PTBLanguageModel, batch: Batch, training: bool
    ) -> tuple[tf.Tensor, LSTMState]:
        inputs, targets = self._split(batch)
        model.check_state(inputs.shape[0])
        state = model.read_state(batch.get("reset"))
        logits, final_state = model(
            inputs, training=training, initial_state=state, return_state=True
        )
        cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=targets, logits=tf.cast(logits, tf.float32)
        )
        return cross_entropy, final_state

    def train_step(
        self, model: keras.Model, optimizer: Any, batch: Batch, global_batch_size: int
    ) -> Metrics:
        """One truncated-BPTT step; the final LSTM state is stored for the next batch.

        Optional batch feature ``reset`` [B] (nonzero: that stream starts afresh)."""
        with tf.GradientTape() as tape:
            cross_entropy, final_state = self._step(model, batch, training=True)
            per_sequence = tf.reduce_sum(cross_entropy, axis=1)
            loss = tf.nn.compute_average_loss(per_sequence, global_batch_size=global_batch_size)
        apply_gradients(
            optimizer, loss, tape, model.trainable_variables, self.config["max_grad_norm"]
        )
        model.write_state(final_state)
        mean = tf.reduce_mean(cross_entropy)
        return {
            "loss": mean,
            "perplexity": tf.exp(mean),
            "learning_rate": current_learning_rate(optimizer),
        }

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        cross_entropy, final_state = self._step(model, batch, training=False)
        model.write_state(final_state)
        mean = tf.reduce_mean(cross_entropy)
        return {"loss": mean, "perplexity": tf.exp(mean)}

    def serving_endpoints(self, model: keras.Model) -> dict[str, Endpoint]:
        def next_word(tokens: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = tf.cast(model(tokens, training=False), tf.float32)
            return {"log_probs": tf.nn.log_softmax(logits, axis=-1)}

        return {
            "serving_default": (next_word, [tf.TensorSpec([None, None], tf.int64, name="tokens")])
        }

    def signature_info(self) -> dict[str, dict[str, dict[str, str]]]:
        return {
            "serving_default": {
                "inputs": {"tokens": "int64[B,T] (from a zero LSTM state)"},
                "outputs": {"log_probs": f"float32[B,T,{self.vocab_size}] (next word)"},
            }
        }

    def example_batch(self, batch_size: int, seed: int = 0) -> dict[str, tf.Tensor]:
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, self.vocab_size, size=(batch_size, self.seq_len), dtype=np.int64)
        return {"tokens": tf.constant(tokens)}
