"""The ``spark`` input mode: DataFrame rows into the TensorFlow processes, at Spark's speed
(the driver's :mod:`~sparktf.train.feed.job`, the chunks of :mod:`~sparktf.train.feed.chunks`).
"""

__all__: list[str] = []
