"""Datasets on disk, through the one door to TFDS (build a dataset, open one split's records), with TFDS's own
builders run without TensorFlow and the `hourglass-data prepare` command."""
