"""Hostile inputs to the Python API (issue 45): the layer API checks what the LM checks, the sampling API refuses
what hourglass-sample refuses, settings that would be ignored or overflow are refused, and data preparation stays
inside the folder it is given. Issue 55: every<N> levels whose slots cannot hold their segments, or whose
segments outgrow the window, are refused, and text_files reads a file reached twice once. Issue 64: every setting
is checked by the typed section that declares it (type, range, choice) before anything compiles, and a divergence
names train.eps where the update alone is not finite."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.config.train_settings import CheckpointSettings, TrainSettings
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model import decode
from hourglass_jax.model.decode import drafts, filters, sampling
from hourglass_jax.nn import Hourglass, whitespace_boundaries
from hourglass_jax.runtime import compile_cache, files, paths
from hourglass_jax.train.compiled.trainer import Trainer
from tests.helpers import small_config

D = 32


@pytest.fixture(scope="module")
def body():
  """A fixed Hourglass body, its variables and an empty cache of 12 entries for 2 rows."""
  module = Hourglass(hierarchy="1@1 1@3 1@1", num_heads=4)
  x_BxLxD = jnp.ones((2, 12, D))
  variables = module.init(jax.random.key(0), x_BxLxD)
  return module, variables, module.new_cache(2, 12, D)


@pytest.mark.parametrize("position", [12, 40, -1])
def test_layer_api_refuses_a_cached_position_outside_the_cache(body, position):
  module, variables, cache = body
  with pytest.raises(ValueError, match=rf"position={position} is outside the cache.*\[0, 12\)"):
    module.apply(variables, jnp.ones((2, 1, D)), cache=cache, position=position)


def test_layer_api_gives_nan_for_a_traced_position_outside_the_cache(body):
  module, variables, cache = body
  step = jax.jit(lambda x, cache, t: module.apply(variables, x, cache=cache, position=t)[0])
  x_Bx1xD = jnp.ones((2, 1, D))
  assert np.isfinite(np.asarray(step(x_Bx1xD, cache, 0))).all()
  for position in (12, 40, -1):
    assert np.isnan(np.asarray(step(x_Bx1xD, cache, position))).all()


@pytest.mark.parametrize("x, message", [
    (jnp.zeros((2, 0, D)), "empty stream"),
    (jnp.zeros((2, 12), jnp.float32), r"stream x \[batch, length, width\], got shape \(2, 12\)"),
    (jnp.zeros((2, 12, D), jnp.int32), "float stream.*got dtype int32.*embedding"),
])
def test_layer_api_refuses_streams_it_cannot_take(body, x, message):
  module, variables, _ = body
  with pytest.raises(ValueError, match=message):
    module.apply(variables, x)


def test_lm_refuses_empty_tokens():
  cfg = small_config()
  model = build_model(cfg)
  with pytest.raises(ValueError, match=r"tokens has shape \(2, 0\): no positions"):
    model.init(jax.random.key(0), jnp.zeros((2, 0), jnp.int32))


def test_float16_on_the_cpu_names_bfloat16():
  with pytest.raises(ValueError, match="dtype='float16' does not run on the CPU.*'bfloat16'"):
    build_model(small_config(dtype="float16")).init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))


def test_whitespace_boundaries_refuses_floats():
  with pytest.raises(ValueError, match="integer byte ids.*float32"):
    whitespace_boundaries(jnp.zeros((2, 5), jnp.float32))


@pytest.mark.parametrize("settings, message", [
    (dict(temperature=math.nan), "temperature=nan must be a finite number"),
    (dict(temperature=math.inf), "temperature=inf must be a finite number"),
    (dict(temperature=-1.0), "temperature=-1.0"),
    (dict(top_k=-5), "top_k=-5 must be an integer >= 0"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
])
def test_generate_refuses_what_the_cli_refuses(settings, message):
  cfg = small_config()
  with pytest.raises(ValueError, match=message):
    sampling.generate({}, cfg, np.zeros((1, 2), np.int32), max_new_tokens=2, rng=0, **settings)


@pytest.mark.parametrize("settings, message", [
    (dict(rng="abc"), r"rng='abc' must be a PRNG key \(e.g. jax.random.key\(0\)\) or an integer seed in \[0, 2\*\*63\)"),
    (dict(rng=None), r"rng=None must be a PRNG key"),
    (dict(rng=2 ** 70), r"rng=1180591620717411303424 must be a PRNG key .* seed in \[0, 2\*\*63\)"),
    (dict(max_new_tokens=True), r"max_new_tokens=True must be an integer in \[1, "),
    (dict(max_new_tokens=0), r"max_new_tokens=0 must be an integer in \[1, "),
    (dict(max_new_tokens=10 ** 9), r"max_new_tokens: a decoding cache for 1 sequences of 1,000,000,000 tokens needs "
                                   r"[0-9,.]+ GiB, more than this host's memory"),
    (dict(end_token=1.5), r"end_token=1.5 must be an integer in \[0, 49\]"),
    (dict(end_token=50), r"end_token=50 must be an integer in \[0, 49\]"),
    (dict(params=None), r"params is None; pass the model's params"),
    (dict(draft="model"), r"draft='model' is not a draft name; use one of ngram, self, or drafts.Model\(cfg\)"),
    (dict(draft="self"), r"draft='self' drafts with the model's draft heads, and this model has none"),
    (dict(draft=drafts.Model(small_config()), draft_params="abc"),
     r"draft_params must be the model's params \(the dict `init` or weights.load_params gives\), got a str 'abc'"),
    (dict(draft=drafts.Model(small_config()), draft_params={"embed": {"embedding": np.zeros((3, 3))}}),
     r"draft_params do not fit the model \(hourglass 1@1 2@3 1@1, d_model 32\): body/.* missing"),
    (dict(draft_params={}), r"draft_params are the params of a draft model; pass draft=drafts.Model"),
    (dict(draft=3), r"draft=3 must be None, a draft name \(ngram, self\) or a drafts.Draft"),
    (dict(draft="self", draft_params={}), r"draft='self' drafts with this model's own params; leave draft_params unset"),
    (dict(draft="ngram", draft_tokens="4"), r"draft_tokens='4' must be an integer in \[1, 64\]"),
    (dict(draft="ngram", draft_tokens=2.0), r"draft_tokens=2.0 must be an integer in \[1, 64\]"),
    (dict(draft="ngram", fallback_below="1"), r"fallback_below='1' must be None or a number in \[0, draft_tokens"),
    (dict(draft="ngram", fallback_below=True), r"fallback_below=True must be None or a number in \[0, draft_tokens"),
    (dict(draft="ngram", draft_tokens=0), r"draft_tokens=0 must be an integer in \[1, 64\]"),
    (dict(draft="ngram", draft_tokens=65), r"draft_tokens=65 must be an integer in \[1, 64\]"),
    (dict(draft="ngram", fallback_below=9.0), r"fallback_below=9.0 must be None or a number in \[0, draft_tokens \+ 1 = 5\]"),
    (dict(draft=drafts.Model(small_config(vocab_size=60)), draft_params={}),
     r"the draft model's vocab_size=60 differs from the target's 50"),
    (dict(return_stats=True), r"return_stats=True reports speculative decoding; pass a draft"),
    (dict(fallback_below=1.0), r"fallback_below=1.0 applies to speculative decoding; pass a draft"),
])
def test_generate_names_the_argument_at_fault(settings, message):
  """Issue 55 and 53: every argument of generate is checked up front, with its valid range."""
  arguments = dict(params={}, max_new_tokens=2, rng=0) | settings
  with pytest.raises(ValueError, match=message):
    sampling.generate(arguments.pop("params"), small_config(), np.zeros((1, 1), np.int32), **arguments)


def test_a_draft_model_and_generate_refuse_a_dict_where_a_model_config_belongs():
  """Issue 64: a dict where a ModelConfig belongs gets one line naming the fix, not "'dict' object has no attribute
  'vocab_size'"."""
  with pytest.raises(ValueError, match=r"drafts.Model\(cfg=...\) takes the draft model's ModelConfig, got a dict; "
                                       r"pass drafts.Model\(ModelConfig.from_dict\(section\)\)"):
    drafts.Model(dict(small_config().__dict__))
  with pytest.raises(ValueError, match=r"cfg must be the model's ModelConfig, got a dict; pass "
                                       r"ModelConfig.from_dict\(section\)"):
    sampling.generate({}, dict(vocab_size=50), np.zeros((1, 1), np.int32), max_new_tokens=2, rng=0)


def test_generate_takes_numpy_integers_and_init_cache_refuses_a_cache_beyond_memory():
  cfg = small_config(kind="vanilla", hierarchy="1@1")
  params = build_model(cfg).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))
  out = sampling.generate(params, cfg, np.zeros((1, 2), np.int32), max_new_tokens=np.int64(3), rng=np.int32(1),
                          end_token=np.int64(7))
  assert out.shape == (1, 3)
  with pytest.raises(ValueError, match=r"max_len: a decoding cache for 2 sequences of 1,000,000,000,000 tokens "
                                       r"needs [0-9,.]+ GiB, more than this host's memory"):
    decode.init_cache(cfg, 2, 10 ** 12)


def test_top_k_filter_refuses_a_negative_k():
  with pytest.raises(ValueError, match="top_k=-5"):
    filters.top_k_filter(jnp.zeros((1, 4)), -5)


@pytest.mark.parametrize("field, value", [("segment_capacity", math.inf), ("segment_capacity", math.nan),
                                          ("gumbel_temperature", math.inf), ("boundary_loss_weight", math.nan)])
def test_dynamic_settings_must_be_finite(field, value):
  with pytest.raises(ValueError, match=f"model.{field}={value!r} must be a finite number"):
    small_config(shorten="dynamic", upsample="repeat", **{field: value})


@pytest.mark.parametrize("settings", [dict(boundaries="whitespace"), dict(segment_capacity=2.0),
                                      dict(segment_pooling="linear", gumbel_evaluation="sample")])
def test_dynamic_settings_on_a_fixed_model_are_refused(settings):
  with pytest.raises(ValueError, match=r"only apply to learned shortening \(shorten='dynamic'\).*shorten='avg'"):
    small_config(shorten="avg", upsample="repeat", **settings)


@pytest.mark.parametrize("hierarchy, boundaries, capacity, message", [
    ("1@1 2@4 1@1", "every3", 1.0, r"'every3' closes a segment every 3 positions, but its level shortens by 4, so "
                                   r"its model.segment_capacity=1.0 x L/4 slots cannot hold the L/3 segments .*"
                                   r"factor 3, or raise segment_capacity to >= 1.33"),
    ("1@1 2@2 1@1", "every2", 0.1, r"segment_capacity=0.1 x L/2 slots cannot hold the L/2 segments"),
    ("1@1 1@2 1@8 1@2 1@1", "whitespace,every2", 1.5, r"'every2' closes a segment every 2 positions, but level 2 "
                                                       r"shortens by 4"),
])
def test_every_n_that_cannot_fit_its_slots_is_refused(hierarchy, boundaries, capacity, message):
  """Issue 55: segments every N positions at a level of factor k > N x segment_capacity would overflow into the
  merged tail (segment_overflow 0.25 and more, seen only in the progress bar): refused before anything builds."""
  with pytest.raises(ValueError, match=message):
    small_config(shorten="dynamic", upsample="repeat", hierarchy=hierarchy, boundaries=boundaries,
                 segment_capacity=capacity)
  small_config(shorten="dynamic", upsample="repeat", hierarchy=hierarchy, boundaries=boundaries,
               segment_capacity=4.0)  # room enough


def test_segments_longer_than_the_window_or_a_huge_n_are_refused():
  from tests.helpers import load_config

  cfg = load_config("dynamic", "every1000")
  cfg.data.seq_len = 48
  with pytest.raises(ValueError, match=r"model.boundaries='every1000' with model.hierarchy='2@1 4@1000 2@1' needs "
                                       r"segments of 1,000 positions, longer than a window of data.seq_len=48.*"
                                       r"Raise data.seq_len to >= 1,000"):
    run_config(cfg)
  cfg.data.seq_len = 1000
  assert run_config(cfg).data.seq_len == 1000
  with pytest.raises(ValueError, match=r"every99999999999999999999.*2 <= N <= 1,048,576 .*got "
                                       r"N=99,999,999,999,999,999,999"):
    load_config("dynamic", "every99999999999999999999")


def test_a_fixed_model_with_default_dynamic_settings_still_builds():
  assert not ModelConfig(**{**small_config().__dict__, "shorten": "avg"}).dynamic


@pytest.mark.parametrize("workdir", ["", "  "])
def test_an_empty_workdir_is_refused(workdir):
  with pytest.raises(ValueError, match="--workdir is empty; pass a folder"):
    files.check_writable_location(workdir, "--workdir", create=True)


def test_compilation_cache_defaults_to_a_local_folder_for_a_bucket_workdir(monkeypatch, tmp_path):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compile_cache.default_location("gs://someone/run") == str(tmp_path / "hourglass_jax" / "xla")


def test_text_files_refuses_a_link_out_of_the_folder(tmp_path):
  from hourglass_jax.data.builders.text_files import find_documents

  secret = tmp_path / "secret.txt"
  secret.write_text("private\n")
  folder = tmp_path / "corpus"
  folder.mkdir()
  (folder / "a.txt").write_text("hello\n")
  (folder / "inside.txt").symlink_to(folder / "a.txt")  # a link within the folder is fine (read once: see below)
  assert [name for name, _ in find_documents([str(folder)])] == ["corpus/a.txt"]
  (folder / "b.txt").symlink_to(secret)
  with pytest.raises(ValueError, match="b.txt links to .*secret.txt, outside the folder"):
    find_documents([str(folder)])


def test_text_files_reads_each_file_once(tmp_path):
  """Issue 55: a link (or a hard link) to a file of the same folder, or a file named beside its folder, is one
  document, not two: the file itself, by its own name."""
  from hourglass_jax.data.builders.text_files import find_documents

  folder = tmp_path / "corpus"
  (folder / "sub").mkdir(parents=True)
  (folder / "b.txt").write_text("hello\n")
  (folder / "c.txt").write_text("other\n")
  (folder / "a_link.txt").symlink_to(folder / "b.txt")
  (folder / "sub" / "z_link.txt").symlink_to(folder / "c.txt")
  os.link(folder / "c.txt", folder / "d_hard.txt")
  documents = find_documents([str(folder), str(folder / "b.txt")])
  assert [name for name, _ in documents] == ["corpus/b.txt", "corpus/c.txt"]


def test_an_enwik8_archive_of_the_right_size_but_other_bytes_is_refused(tmp_path):
  import zipfile

  from hourglass_jax.data.builders import enwik8

  archive = tmp_path / "enwik8.zip"
  with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
    zf.writestr("enwik8", bytes(enwik8.ENWIK8_BYTES))  # 100 MB of zeros: size and CRC are right
  with pytest.raises(ValueError, match="has the right size but not enwik8's content.*download .* again"):
    enwik8.check_archive(archive)
  small = tmp_path / "small.zip"
  with zipfile.ZipFile(small, "w") as zf:
    zf.writestr("enwik8", b"abc")
  import hashlib
  enwik8.check_archive(small, 3, hashlib.sha256(b"abc").hexdigest())
  with pytest.raises(ValueError, match="not enwik8's content"):
    enwik8.check_archive(small, 3, "0" * 64)


@pytest.mark.parametrize("section, field, value, message", [
    ("train", "eps", 0.0, r"train.eps=0.0 must be > 0, and at least 1.2e-38 .*Adam divides by sqrt\(v\) \+ eps"),
    ("train", "eps", 1e-40, r"train.eps=1e-40 must be > 0, and at least 1.2e-38"),
    ("train", "seed", -1, r"train.seed=-1 must be an integer in \[0, 2\*\*32 - 1\]"),
    ("train", "seed", 2**32, r"train.seed=4294967296 must be an integer in \[0, 2\*\*32 - 1\]"),
    ("train", "steps", 2**31, r"train.steps=2147483648 must be < 2147483648 \(the step counter is a 32-bit"),
    ("train", "learning_rate", 0.0, r"train.learning_rate=0.0 must be > 0\."),
    ("train", "weight_decay", -0.1, r"train.weight_decay=-0.1 must be >= 0\."),
    ("train", "log_every", 0, r"train.log_every=0 must be an integer >= 1\."),
    ("checkpoint", "keep", 0, r"checkpoint.keep=0 must be an integer >= 1\."),
    ("checkpoint", "every_steps", -5, r"checkpoint.every_steps=-5 must be an integer >= 0\."),
    ("data", "seq_len", 0, r"data.seq_len=0 must be an integer >= 1\."),
    ("data", "eval_batches", -1, r"data.eval_batches=-1 must be an integer >= 0\."),
    ("data", "eval_split", "dev", r"data.eval_split='dev'; choose one of train, validation, test, valid\."),
])
def test_every_setting_is_checked_by_its_section_before_compiling(section, field, value, message):
  """Issue 64: each typed section checks its own ranges when built (train.eps=0 was accepted and diverged 78 s
  later, train.seed=-1 failed after the compile without naming it): the trainer refuses it before compiling."""
  from hourglass_jax.runtime import sharding
  from tests.helpers import tiny_config

  cfg = tiny_config(**{section: {field: value}})
  with pytest.raises(ValueError, match=message):
    run_config(cfg)


@pytest.mark.parametrize("section, field, value, kind", [
    (TrainSettings, "steps", 10.0, "an integer"),
    (TrainSettings, "seed", True, "an integer"), (TrainSettings, "learning_rate", "1e-3", "a number"),
    (DataSettings, "batch_size", 2.5, "an integer"), (DataSettings, "name", 3, "a string"),
    (CheckpointSettings, "async_save", 1, "true or false"),
])
def test_every_setting_has_its_declared_type(section, field, value, kind):
  """Issue 64: a setting of another type than its section declares (a config file is Python: it can set anything)
  is refused naming it; an integer is a number, a bool is not."""
  with pytest.raises(ValueError, match=rf"^{section.NAME}.{field}={value!r} is a {type(value).__name__}; it must be "
                                       rf"{kind}\.$"):
    section(**{field: value})
  TrainSettings(learning_rate=1, eps=1)  # an int where a float is declared


def test_a_divergence_names_eps_when_the_update_alone_is_not_finite():
  """Issue 64: gradients finite but Adam's update not (a division by sqrt(v) + eps): the message names train.eps,
  not the learning rate; a non-finite gradient still points at the learning rate."""
  from hourglass_jax.train.loop.loop import _divergence_message

  nan = float("nan")
  update = _divergence_message(7, dict(loss=2.0, grad_norm=0.5, update_norm=nan), 5, None, None, eps=1e-9)
  assert update.endswith("The last checkpoint (step 5) is intact. The gradients are finite but the optimizer's "
                         "update is not: Adam divides by sqrt(v) + train.eps, and train.eps=1e-09 lets a near-zero "
                         "second moment blow an update up; raise it (--config.train.eps=1e-8), then rerun.")
  tiny = _divergence_message(7, dict(loss=nan, grad_norm=nan, update_norm=nan), None, None, None, eps=1e-20)
  assert "train.eps=1e-20" in tiny and "learning_rate" not in tiny
  grads = _divergence_message(7, dict(loss=nan, grad_norm=nan, update_norm=nan), None, None, None, eps=1e-9)
  assert "train.eps" not in grads and "Lower train.learning_rate" in grads
