"""Weights that travel: a checkpoint's params exported as safetensors + config.json load back into build_model's
module bit for bit (bfloat16: closely), from the folder or the file alone; files that do not fit their card fail
with what is missing, extra or misshapen."""

import json
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import safetensors.numpy
import yaml

from hourglass_jax import hub_card, weights
from hourglass_jax.config import run_config
from hourglass_jax.train.checkpointing import model_source
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.loop.evaluate import evaluate_checkpoint
from hourglass_jax.train.reporting import run_files
from hourglass_jax.train.reporting.export import about_run, export_params
from tests.helpers import CONFIGS, FLAGS, quiet, run


@pytest.fixture(scope="module")
def exported_run(trained, tmp_path_factory):
  """The shared training run (conftest.py's `trained`): its workdir, config, step 4's params on the host, and its
  float32 export with the card."""
  workdir, cfg, _, state, _ = trained
  exported = tmp_path_factory.mktemp("exported") / "model"
  card = export_params(workdir, exported, log=quiet)
  return workdir, cfg, state.params, exported, card


def _logits(model, params):
  tokens_BxL = (jnp.arange(2 * 40, dtype=jnp.int32).reshape(2, 40) * 7) % model.cfg.vocab_size
  return np.asarray(jax.jit(model.apply)({"params": params}, tokens_BxL))


def test_an_export_carries_the_draft_heads(tmp_path):
  """A model with draft heads (model/draft_heads.py) exports them with the rest, its card records their settings,
  and it loads back into a model with the same heads (what hourglass-sample --draft=self reads)."""
  from hourglass_jax.model import build_model, decode
  from hourglass_jax.testing import random_variables
  from tests.helpers import small_config
  cfg = small_config(draft_heads=2, draft_heads_from="short", draft_loss_weight=0.3)
  params = decode.unbox_params(random_variables(build_model(cfg), jnp.zeros((1, 12), jnp.int32)))
  card = weights.save_params(params, cfg, tmp_path / "heads")
  assert {key: card["model"][key] for key in ("draft_heads", "draft_heads_from", "draft_loss_weight")} == dict(
      draft_heads=2, draft_heads_from="short", draft_loss_weight=0.3)
  model, loaded = weights.load_params(tmp_path / "heads")
  assert model.cfg.draft_heads == 2 and model.cfg.draft_heads_from == "short"
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


@pytest.mark.slow
def test_export_loads_back_bit_for_bit(exported_run):
  workdir, cfg, params, exported, card = exported_run
  assert sorted(p.name for p in exported.iterdir()) == ["README.md", "config.json", "model.safetensors"]
  assert json.loads((exported / "config.json").read_text()) == card
  assert card["step"] == 4 and card["seq_len"] == cfg.data.seq_len and card["weights_dtype"] == "float32"
  assert card["model"]["kind"] == "vanilla" and card["format_version"] == weights.FORMAT_VERSION
  assert card["num_params"] == sum(x.size for x in jax.tree.leaves(params))
  flat = safetensors.numpy.load_file(exported / "model.safetensors")
  assert "body/layers/blocks/attention/query/kernel" in flat and flat["head/kernel"].dtype == np.float32

  model, loaded = weights.load_params(exported)
  assert model.cfg.d_model == cfg.model.d_model
  jax.tree.map(np.testing.assert_array_equal, loaded, params)  # same tree, same bits
  np.testing.assert_array_equal(_logits(model, loaded), _logits(model, params))


@pytest.mark.slow
def test_the_card_says_what_trained_the_weights_and_what_they_score(exported_run, tmp_path):
  """The data set, steps, tokens seen, version, license and intended use; a whole-split score recorded for the step
  (hourglass-eval's) is in its model-index, the trainer's partial evaluation (eval_batches=1) is not."""
  workdir, cfg, _, _, card = exported_run
  tokens = cfg.data.batch_size * cfg.data.seq_len
  recipe = dict(learning_rate=cfg.train.learning_rate, schedule="constant", warmup_steps=cfg.train.warmup_steps,
                min_lr_ratio=0.0, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, grad_clip_norm=1.0, grad_accum_steps=1,
                dropout=cfg.model.dropout)
  assert card["training"] == dict(dataset="stdlib_text", source=None, steps=4, tokens_seen=4 * tokens,
                                  batch_size=cfg.data.batch_size, seq_len=cfg.data.seq_len, recipe=recipe)
  assert card["datasets"] == [] and card["library_name"] == "hourglass_jax"  # the embedded corpus has no Hub id
  assert card["hourglass_jax_version"] and card["license"] is None
  assert "Not evaluated for safety" in card["intended_use"]
  logged = [r for r in run_files.read_metrics(workdir) if r["step"] == 4 and r["split"] == "valid"]
  assert logged and not logged[0]["whole_split"] and card["model-index"][0]["results"] == []

  run_files.record_evaluation(workdir, 4, "test", dict(bits=2.5, loss=1.7, whole_split=True, metrics={}))
  run_files.record_evaluation(workdir, 2, "valid", dict(bits=3.0, loss=2.1, whole_split=True, metrics={}))
  card = export_params(workdir, tmp_path / "out", log=quiet, license_id="apache-2.0")
  (result,) = card["model-index"][0]["results"]  # step 4's only
  assert result == dict(task=dict(type="text-generation"), dataset=dict(name="stdlib_text", type="stdlib_text",
                                                                        split="test"),
                        metrics=[dict(type="bits_per_byte", value=2.5, name="test bits/byte, whole split")])
  assert card["license"] == "apache-2.0"
  assert weights.read_card(tmp_path / "out")["training"]["tokens_seen"] == 4 * tokens


def _front_matter(readme) -> tuple[dict, str]:
  """(the YAML front matter of a README.md, as the Hub parses it, and the Markdown body)."""
  empty, front, body = readme.read_text().split("---\n", 2)
  assert empty == "", "the front matter opens the file"
  return yaml.safe_load(front), body


@pytest.mark.slow
def test_the_readme_is_a_hub_card_with_the_json_cards_metadata(exported_run, tmp_path):
  """README.md's front matter parses as YAML into the Hub's fields: no license (and a one-line warning) until one is
  given, datasets only for a Hub id, model-index once a whole-split score is recorded, equal to config.json's."""
  workdir, cfg, _, exported, card = exported_run
  front, body = _front_matter(exported / "README.md")
  assert front == dict(library_name="hourglass_jax", pipeline_tag="text-generation",
                       tags=["hourglass_jax", "vanilla", "byte-level", "jax", "flax", "safetensors"])
  for part in ("# hourglass_jax vanilla 1@1, step 4", "## Usage", "hourglass-sample --workdir=.", "load_params(",
               "## Training data", "`stdlib_text`: The Python standard library's own source files",
               "## Training recipe", f"| learning rate | {cfg.train.learning_rate:g}, constant after", "## Evaluation",
               "No whole-split score was recorded", "## Limitations", "No license is stated"):
    assert part in body, (part, body)

  run = tmp_path / "run"
  shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("evaluations"))  # other tests record scores there
  run_files.record_evaluation(run, 4, "valid", dict(bits=2.25, loss=1.56, whole_split=True, metrics={}))
  lines = []
  card = export_params(run, tmp_path / "licensed", log=lines.append, license_id="apache-2.0")
  front, body = _front_matter(tmp_path / "licensed" / "README.md")
  assert front["license"] == "apache-2.0" and "datasets" not in front
  assert front["model-index"] == card["model-index"] and front["model-index"][0]["results"][0]["metrics"][0] == dict(
      type="bits_per_byte", value=2.25, name="valid bits/byte, whole split")
  assert "| valid | 2.2500 |" in body and "No license is stated" not in body
  assert not [line for line in lines if line.startswith("warning:")], lines
  export_params(run, tmp_path / "unlicensed", log=lines.append)
  (warning,) = [line for line in lines if line.startswith("warning:")]
  assert warning.startswith("warning: no --license given") and "\n" not in warning


def test_a_data_set_on_the_hub_is_named_by_its_hub_id(tmp_path):
  """enwik8's card names LTCB/enwik8 in datasets and in model-index's dataset type, and the front matter lists it."""
  record = dict(model=dict(kind="hourglass", vocab_size=256), seq_len=2049, batch_size=8,
                data=dict(name="enwik8", source=None), train=dict(learning_rate=4.1e-4))
  run_files.record_evaluation(tmp_path, 7, "test", dict(bits=1.2, loss=0.83, whole_split=True, metrics={}))
  about = about_run(tmp_path, 7, record)
  assert about["datasets"] == ["LTCB/enwik8"] and about["training"]["dataset"] == "enwik8"
  assert about["model-index"][0]["results"][0]["dataset"] == dict(name="enwik8", type="LTCB/enwik8", split="test")
  front = yaml.safe_load(hub_card.readme(dict(about, model=record["model"], num_params=1)).split("---\n")[1])
  assert front["datasets"] == ["LTCB/enwik8"] and "license" not in front


@pytest.mark.slow
def test_eval_scores_an_export_as_it_scores_its_checkpoint(exported_run, tmp_path):
  """The export folder as --workdir, in process and as the command: the checkpoint's score, the model from the
  card and the data from --config, and nothing written into the folder."""
  workdir, cfg, _, exported, _ = exported_run
  before = sorted(p.name for p in exported.iterdir())
  from_workdir = evaluate_checkpoint(run_config(cfg), str(workdir), "valid", log=quiet, max_batches=2)
  lines = []
  from_export = evaluate_checkpoint(run_config(model_source.export_config(exported, cfg)), str(exported), "valid",
                                    log=lines.append, max_batches=2, record=True)
  assert from_export["step"] == 4 and from_export["loss"] == from_workdir["loss"]
  done = run([sys.executable, "-c", "from hourglass_jax.cli.main import eval_entry; eval_entry()",
              f"--config={CONFIGS / 'tiny.py'}", f"--workdir={exported}", *FLAGS, "--split=valid", "--batches=2"])
  assert done.returncode == 0, done.stderr[-3000:]
  assert lines[-1] in done.stdout.splitlines(), (lines, done.stdout)
  assert sorted(p.name for p in exported.iterdir()) == before


@pytest.mark.slow
def test_bfloat16_export_is_half_the_size_and_close(exported_run, tmp_path):
  workdir, _, params, exported, _ = exported_run
  card = export_params(workdir, tmp_path / "bf16", dtype="bfloat16", log=quiet)
  assert card["weights_dtype"] == "bfloat16"
  size = (tmp_path / "bf16" / "model.safetensors").stat().st_size
  assert size < 0.6 * (exported / "model.safetensors").stat().st_size
  # The file alone is enough: its metadata carries the card.
  shutil.copy(tmp_path / "bf16" / "model.safetensors", tmp_path / "alone.safetensors")
  model, loaded = weights.load_params(tmp_path / "alone.safetensors")
  assert jax.tree.leaves(loaded)[0].dtype == np.float32  # widened back to the trained dtype
  np.testing.assert_allclose(_logits(model, loaded), _logits(model, params), atol=0.02, rtol=0)


@pytest.mark.slow
def test_an_earlier_step_and_the_command_line(exported_run, tmp_path):
  workdir, *_ = exported_run
  result = run([sys.executable, "-c", "from hourglass_jax.cli.main import export_entry; export_entry()",
                f"--workdir={workdir}", f"--output={tmp_path / 'out'}", "--step=2"], devices=1)
  assert result.returncode == 0, result.stderr
  assert "exported step 2:" in result.stdout
  assert json.loads((tmp_path / "out" / "config.json").read_text())["step"] == 2
  result = run([sys.executable, "-c", "from hourglass_jax.cli.main import export_entry; export_entry()",
                f"--workdir={workdir}", f"--output={tmp_path / 'out'}", "--step=3"], devices=1)
  assert result.returncode == 1 and result.stderr.strip() == (
      f"error: no checkpoint of step 3 under {workdir}/checkpoints; it holds steps 2, 4.")


def _rewrite(exported, target, change):
  """A copy of the export with its arrays changed by `change(flat)` (the card and metadata kept)."""
  with safetensors.safe_open(exported / "model.safetensors", framework="np") as f:
    metadata, flat = f.metadata(), {key: f.get_tensor(key) for key in f.keys()}
  change(flat)
  target.mkdir()
  safetensors.numpy.save_file(flat, target / "model.safetensors", metadata=metadata)
  shutil.copy(exported / "config.json", target)
  return target


@pytest.mark.parametrize("change, message", [
    (lambda flat: flat.pop("head/bias"), r"1 missing key\(s\) \(e\.g\. head/bias\)"),
    (lambda flat: flat.update({"head/extra": np.zeros(3, np.float32)}), r"1 unexpected key\(s\) \(e\.g\. head/extra"),
    (lambda flat: flat.update({"head/bias": flat["head/bias"][:-1]}),
     r"1 shape mismatch\(es\) \(e\.g\. head/bias: file \(255,\), model \(256,\)\)"),
], ids=["missing", "unexpected", "shape"])
@pytest.mark.slow
def test_arrays_that_do_not_fit_the_card_are_named(exported_run, tmp_path, change, message):
  exported = _rewrite(exported_run[3], tmp_path / "changed", change)
  with pytest.raises(ValueError, match=message + r".*Load it with the config.json it was exported with"):
    weights.load_params(exported)


@pytest.mark.slow
def test_a_card_that_does_not_match_the_weights(exported_run, tmp_path):
  exported = exported_run[3]
  folder = shutil.copytree(exported, tmp_path / "copy")
  card = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps(dict(card, model=dict(card["model"], d_ff=128))))
  with pytest.raises(ValueError, match=r"shape mismatch\(es\) \(e\.g\. body/layers/blocks/mlp/wi/bias: file "
                                       r"\(1, 64\), model \(1, 128\)"):
    weights.load_params(folder)
  # Same shapes, other function: caught against the card inside the file.
  (folder / "config.json").write_text(json.dumps(dict(card, model=dict(card["model"], hierarchy="1@1 1@2 1@1",
                                                                      kind="hourglass"))))
  with pytest.raises(ValueError, match=r"does not match the model .* was exported from \(model.kind: file "
                                       r"'vanilla', config.json 'hourglass'"):
    weights.load_params(folder)
  with pytest.raises(ValueError, match="unknown field"):
    weights.load_params(exported, no_such_field=1)
  model, _ = weights.load_params(exported, attention_impl="xla")  # settings that keep every shape may change
  assert model.cfg.attention_impl == "xla"


def test_workdirs_without_checkpoints(tmp_path):
  with pytest.raises(TrainError, match="is not a folder"):
    export_params(tmp_path / "missing", tmp_path / "out", log=quiet)
  with pytest.raises(TrainError, match=r"no checkpoints under .*checkpoints; --workdir must be a folder "
                                       "hourglass-train wrote"):
    export_params(tmp_path, tmp_path / "out", log=quiet)
  (tmp_path / "checkpoints").mkdir()
  with pytest.raises(TrainError, match="no checkpoint under .*; train first with hourglass-train"):
    export_params(tmp_path, tmp_path / "out", log=quiet)
  with pytest.raises(FileNotFoundError, match="pass the folder hourglass-export wrote"):
    weights.load_params(tmp_path)
  assert not (tmp_path / "out").exists()
