"""Bad configurations fail before anything compiles, with a message naming the setting and the fix."""

import jax
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.reporting import metrics
from tests.helpers import run, tiny_config, train_command


@pytest.mark.parametrize("sections, mesh_cfg, message", [
    (dict(train=dict(learning_rte=1e-3)), None, r"train.learning_rte is not a known setting \(did you mean "
                                                 r"'learning_rate'\?\)"),
    (dict(train=dict(schedule="linear")), None, r"train.schedule='linear'; choose one of cosine, rsqrt, constant"),
    (dict(data=dict(name="enwik9")), None, r"data.name='enwik9' is unknown; choose one of .*enwik8.*stdlib_text"),
    (dict(data=dict(name="text_file")), None, r"data.name='text_file' needs data.path"),
    (dict(data=dict(batch_size=8), train=dict(grad_accum_steps=3)), None, r"not divisible by train.grad_accum"),
    (dict(), dict(data=-1, tensor=3), r"mesh.data=-1, mesh.fsdp=1, mesh.tensor=3 does not divide the 8 devices"),
    (dict(), dict(data=2, fsdp=2, tensor=1), r"uses 4 devices but 8 are available"),
    (dict(data=dict(batch_size=4)), dict(data=-1), r"data.batch_size=4 \(micro-batch 4\) is not divisible by the 8 "
                                                   r"data-parallel devices.*multiple of 8"),
    (dict(), dict(data=1, tensor=8), r"parameter .*attention/key/bias of shape \(1, 4, 8\): its 'heads' dimension "
                                     r"of 4 cannot be split evenly over mesh axes \('tensor',\) \(8 devices\)"),
    (dict(mesh=dict(rules=(("batch", "data"), ("embedings", "fsdp")))), None, r"logical axis 'embedings'"),
    (dict(train=dict(b2=1.5)), None, r"train.b2=1.5 must be in \[0, 1\) \(Adam's decay rate, usually 0.98\)"),
    (dict(train=dict(b1=1.0)), None, r"train.b1=1.0 must be in \[0, 1\)"),
    (dict(train=dict(b1=-0.1)), None, r"train.b1=-0.1 must be in \[0, 1\)"),
    (dict(train=dict(learning_rate=float("nan"))), None, r"train.learning_rate=nan must be a finite number"),
    (dict(train=dict(learning_rate=float("inf"))), None, r"train.learning_rate=inf must be a finite number"),
    (dict(train=dict(eps=float("nan"))), None, r"train.eps=nan must be a finite number"),
    (dict(train=dict(grad_clip_norm=float("-inf"))), None, r"train.grad_clip_norm=-inf must be a finite number"),
    (dict(train=dict(min_lr_ratio=2.0)), None, r"train.min_lr_ratio=2.0 must be in \[0, 1\]"),
])
def test_bad_settings_raise_before_compiling(sections, mesh_cfg, message):
  cfg = tiny_config(**sections)
  if mesh_cfg:
    cfg.mesh.update(mesh_cfg)
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))


@pytest.mark.parametrize("size, message", [
    (120, r"the train split of data.name='text_file' yields 5 training windows \(seq_len \+ 1 = 49 tokens each\), "
          r"fewer than one batch of data.batch_size=8; lower data.batch_size"),
    (600, r"the valid split of data.name='text_file' \(30 bytes\) is shorter than one eval window \+ 1 = 49 bytes"),
])
def test_a_corpus_too_small_for_a_batch_or_an_eval_window_is_refused_before_compiling(tmp_path, size, message):
  path = tmp_path / "small.txt"
  path.write_bytes(bytes(range(100)) * (size // 100) + bytes(size % 100))  # valid: bytes [0.9, 0.95) of the file
  cfg = tiny_config(data=dict(name="text_file", path=str(path)))
  with pytest.raises(ValueError, match=message):
    Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))


@pytest.mark.parametrize("override, message", [
    ("--config.train.b2=1.5", "error: train.b2=1.5 must be in [0, 1)"),
    ("--config.train.learning_rate=nan", "error: train.learning_rate=nan must be a finite number"),
])
def test_out_of_range_settings_end_the_command_before_compiling(tmp_path, override, message):
  bad = run(train_command(tmp_path, override), devices=1)
  assert bad.returncode != 0 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
  errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], bad.stderr[-3000:]
  assert "compile:" not in bad.stdout


def test_unknown_override_on_the_command_line_suggests_the_key(tmp_path):
  bad = run(train_command(tmp_path, "--config.train.learning_rte=0.1"), devices=1)
  assert bad.returncode != 0
  assert "learning_rte" in bad.stderr and "learning_rate" in bad.stderr


def test_mesh_fill_and_rules():
  assert sharding.mesh_shape(dict(data=-1, fsdp=2, tensor=2), 8) == (2, 2, 2)
  mesh = sharding.make_mesh(dict(data=2, fsdp=2, tensor=-1))
  assert dict(mesh.shape) == dict(data=2, fsdp=2, tensor=2)
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
  rules = sharding.logical_rules(tiny_config().mesh)
  assert sharding.batch_parallelism(mesh, rules) == 4


def test_a_step_larger_than_device_memory_is_refused():
  metrics.check_memory(2**30, None)  # CPU reports no limit: nothing to check
  with pytest.raises(TrainError, match=r"needs 2.00 GiB per device but the device has 1.00 GiB.*"
                                       r"model.remat_policy=nothing_saveable"):
    metrics.check_memory(2**31, 2**30)
