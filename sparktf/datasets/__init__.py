"""Training-ready datasets: Spark conversion of raw CIFAR-10, MNIST and PTB, and their readers.

- :mod:`sparktf.datasets.formats` — the one description of the on-disk format (feature spec,
  Parquet fields, manifest, id scheme) shared by writers and readers;
- :mod:`sparktf.datasets.sources` — parsers of the raw files, with errors that name the file
  and the byte offset or record index;
- :mod:`sparktf.datasets.conversion` — the Spark conversion (its command line is
  :mod:`sparktf.jobs.convert`), planned on the driver by :mod:`sparktf.datasets.conversion_plan`
  (options,
  shards, vocabulary, manifest) and run on executors by :mod:`sparktf.datasets.tasks`
  (unpacking, hashing, encoding, writing);
- :mod:`sparktf.datasets.readers` — ``tf.data`` readers (TFRecord and Parquet, local and HDFS);
- :mod:`sparktf.datasets.tfrecord` — TFRecord framing and tf.train.Example encoding without
  TensorFlow (executors write through sparktf.storage, HDFS included);
- :mod:`sparktf.datasets.petastorm_io` — everything that touches petastorm;
- :mod:`sparktf.datasets.columns` — which Spark column types can hold a feature or a model
  input;
- :mod:`sparktf.datasets.tables` — a DataFrame's feature, label and id columns written as a
  ``table`` dataset (what :class:`sparktf.ml.TFEstimator` trains on);
- :mod:`sparktf.datasets.synthetic` — synthetic raw files in the distribution formats (tests,
  benchmarks, the demo datasets of the training jobs).

The on-disk format is documented in docs/datasets.md.

Importing this package is light (no TensorFlow, no Spark): executors import only what a task
needs.
"""

__all__ = []
