"""`hourglass-export`'s flags (defined on import, by main.export_entry only: --output is also hourglass-sample's)
and the call of hourglass_jax.train.reporting.export.export_params they make."""

from absl import flags

from hourglass_jax.runtime import files
from hourglass_jax.weights import DTYPES

_OUTPUT = flags.DEFINE_string("output", None, "Folder to write model.safetensors and config.json into (created).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", DTYPES, "Array dtype in the file: float32 as trained, or bfloat16 "
                           "for half the size.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace another export already in --output.")
_LICENSE = flags.DEFINE_string("license", None, "The card's license: a Hugging Face license id such as apache-2.0 "
                               "(default: none stated; the training data's terms may restrict it).")


def run(workdir: str) -> dict:
  files.check_writable_location(_OUTPUT.value, "--output", create=True)
  from hourglass_jax.train.reporting.export import export_params  # pylint: disable=import-outside-toplevel

  return export_params(workdir, _OUTPUT.value, _STEP.value, _DTYPE.value, overwrite=_OVERWRITE.value,
                       license_id=_LICENSE.value)
