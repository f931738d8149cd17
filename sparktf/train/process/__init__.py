"""The executor's side of a run: the Spark task that starts a TensorFlow process
(:mod:`~sparktf.train.process.launcher`), and that process (:mod:`~sparktf.train.process.main`)
with its training loop. Nothing here imports the driver's side or Spark.
"""

__all__: list[str] = []
