"""The Spark driver's side of a run: :func:`~sparktf.train.driver.fit.fit` plans it, brings its
cluster up on Spark, watches it and returns the result. Nothing here runs on an executor.
"""

__all__: list[str] = []
