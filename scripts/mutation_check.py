"""Mutation check: does the test suite catch realistic one-line bugs?

Each mutant below replaces one exact piece of text in one file (it must occur there exactly once, else the mutant is
"stale" and the check fails, so a refactor that moves the code is noticed). Every mutant is applied on its own to a
fresh scratch copy of the checkout (the files `git ls-files` lists; the checkout itself is never touched), and its
test targets run there with `pytest -x`. A mutant is caught only when pytest exits 1 with a failing test; a clean
pass, a collection error or a timeout counts as survived. The run ends with a markdown table and exits non-zero if
any mutant survived or is stale.

    python scripts/mutation_check.py [--repo DIR] [--only NAME[,NAME]] [--json PATH] [--list] [--full]
                                     [--check-clean] [--timeout S]
"""

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


@dataclasses.dataclass(frozen=True)
class Mutant:
  name: str
  path: str
  original: str
  replacement: str
  bug: str
  targets: tuple[str, ...]


T = "tests/"
MUTANTS = [
    Mutant("fixed_shift", "hourglass_jax/model/hourglass/resampling.py",
           "shift_right(x_BxLxD, k - 1)", "shift_right(x_BxLxD, k - 2)",
           "fixed shortening shifts by k-2, so a shortened token sees one token ahead (causality leak)",
           (T + "test_causality.py::test_hourglass_is_causal",)),
    Mutant("fixed_upsample_future", "hourglass_jax/model/resampling/attention.py",
           "<= (np.arange(length) // k)[:, None]", "<= ((np.arange(length) + k - 1) // k)[:, None]",
           "attention upsampling lets position q read shortened token ceil(q/k), a future one (causality leak)",
           (T + "test_resampling.py::test_masks_brute_force", T + "test_causality.py::test_hourglass_is_causal")),
    Mutant("fixed_rope_offset", "hourglass_jax/model/resampling/attention.py",
           "stream_positions(length, outer) - (k - 1) * outer", "stream_positions(length, outer) - k * outer",
           "attention shortening gives its keys positions one shortened step too early (RoPE offset)",
           (T + "test_resampling.py::test_shorten_matches_numpy[attention_avg-2-1]",
            T + "test_resampling.py::test_shorten_matches_numpy[attention_linear-3-3]")),
    Mutant("dynamic_upsample_open_segment", "hourglass_jax/model/hourglass/dynamic/segments.py",
           "read_BxL = completed_BxL - 1", "read_BxL = completed_BxL",
           "dynamic upsampling reads the still-open segment r_t instead of r_t - 1 (causality leak)",
           (T + "test_dynamic_pooling.py::test_a_position_depends_only_on_earlier_positions_and_boundaries",
            T + "test_predictors.py::test_each_example_is_causal")),
    Mutant("dynamic_predictor_reads_next", "hourglass_jax/model/hourglass/dynamic/predictors/base.py",
           "jnp.concatenate([first_B[:, None], values_BxL[:, :-1]], axis=1)",
           "jnp.concatenate([values_BxL[:, 1:], first_B[:, None]], axis=1)",
           "routing / entropy predictors compare row t with row t+1 instead of t-1 (causality leak)",
           (T + "test_predictors.py::test_each_example_is_causal",)),
    Mutant("segment_ids_inclusive", "hourglass_jax/model/hourglass/dynamic/segments.py",
           "jnp.cumsum(b_BxL, axis=1) - b_BxL, max_segments - 1)", "jnp.cumsum(b_BxL, axis=1), max_segments - 1)",
           "segment_ids counts the boundary at t itself (off by one: the closing position joins the next segment)",
           (T + "test_dynamic_pooling.py::test_ops_follow_their_definitions",)),
    Mutant("multiscale_shift", "hourglass_jax/model/multiscale/resampling.py",
           "shift_right(x_BxLxD, k - 1), k,", "shift_right(x_BxLxD, k - 2), k,",
           "multi-scale downsampling shifts by k-2 (causality leak in top-down / bottom-up / retina)",
           (T + "test_multiscale.py::test_multiscale_is_causal[topdown-transposed_conv-avg-12]",
            T + "test_multiscale.py::test_multiscale_is_causal[retina-transposed_conv-conv-11]")),
    Mutant("kv_cache_write_step_late", "hourglass_jax/model/kv_cache.py",
           "= jnp.asarray(cache.start, jnp.int32)", "= jnp.asarray(cache.start + 1, jnp.int32)",
           "a KV cache written one entry at a time (a decoding step) writes it one entry after its position",
           (T + "test_decode.py::test_vanilla_decoding_matches_forward[rope]",
            T + "test_decode.py::test_hourglass_decoding_matches_forward")),
    Mutant("kv_cache_write_several_late", "hourglass_jax/model/kv_cache.py",
           "jnp.broadcast_to(cache.start, (batch,))", "jnp.broadcast_to(cache.start + 1, (batch,))",
           "a KV cache written several entries at once (prefill, extension, rows at their own positions) writes "
           "them one entry late",
           (T + "test_decode.py::test_hourglass_decoding_matches_forward",)),
    Mutant("block_attention_no_rescale", "hourglass_jax/ops/block_attention.py",
           "acc.at[qi].set(alpha[..., None] * acc[qi] + pv)", "acc.at[qi].set(acc[qi] + pv)",
           "block attention's online softmax forgets to rescale the accumulator when the running max grows",
           (T + "test_block_attention.py::test_block_matches_reference_values_and_gradients[None-0.0-causal]",)),
    Mutant("block_dropout_seed_reused", "hourglass_jax/ops/block_attention.py",
           "[plan.q_blocks * plan.nk + plan.k_blocks] if rate", "[plan.k_blocks] if rate",
           "block attention draws its dropout seed per key block only: every query block reuses the same mask",
           (T + "test_block_attention.py::test_block_matches_reference_values_and_gradients[relative-0.3-causal]",)),
    Mutant("fingerprints_not_compared", "hourglass_jax/train/checkpointing/checkpoint.py",
           "altered = integrity.mismatches(saved, integrity.array_fingerprints(state))",
           "altered = integrity.mismatches(saved, saved)",
           "restore compares the recorded fingerprints with themselves, so altered arrays load silently",
           (T + "test_checkpoint_integrity.py::test_changed_array_values_fail_the_fingerprint_check",)),
    Mutant("checkpoint_keep_ignored", "hourglass_jax/train/checkpointing/checkpoint.py",
           "preservation_policy=policies.LatestN(keep)", "preservation_policy=policies.LatestN(keep + 1)",
           "the run keeps one checkpoint more than checkpoint.keep",
           (T + "test_train_faults.py::test_unreadable_latest_checkpoint_is_moved_aside_and_the_previous_one_used",)),
    Mutant("optimizer_clip_order", "hourglass_jax/train/compiled/optimizer.py",
           "optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), adamw)",
           "optax.chain(adamw, optax.clip_by_global_norm(train.grad_clip_norm))",
           "global-norm clipping is applied to AdamW's updates instead of the gradients",
           (T + "test_train_optimizer.py::test_gradients_are_clipped_before_adamw",)),
    Mutant("workdir_lock_never_refuses", "hourglass_jax/train/checkpointing/workdir_lock.py",
           "if age > STALE_SECONDS:", "if age < STALE_SECONDS:",
           "a lock with a fresh heartbeat is taken for stale: a second run on a live workdir is never refused",
           (T + "test_workdir_lock.py::test_another_hosts_recent_lock_is_respected",
            T + "test_workdir_lock.py::test_a_live_run_refuses_a_second_writer_but_not_readers")),
    Mutant("split_boundary_moved", "hourglass_jax/data/catalog.py",
           "total * 90 // 100, total * 95 // 100", "total * 90 // 100, total * 96 // 100",
           "the validation / test boundary of the 90/5/5 split moves by 1%",
           (T + "test_data_text.py::test_fewer_than_three_documents_split_by_bytes",
            T + "test_data_enwik8.py::test_splits_hold_exactly_the_90_5_5_bytes_in_order")),
    Mutant("resume_skips_data_state", "hourglass_jax/train/loop/loop.py",
           "self.batches.set_state(data_state)", "self.batches = self.batches",
           "a resumed run restarts the data iterator instead of restoring its saved position",
           (T + "test_train_resume.py::test_resume_is_exact_and_moves_between_meshes",)),
    Mutant("preempted_exit_code", "hourglass_jax/cli/main.py",
           '{"preempted": preemption.EXIT_PREEMPTED,', '{"preempted": preemption.EXIT_INTERRUPTED,',
           "hourglass-train exits 130 instead of 75 after SIGTERM, so schedulers do not requeue it",
           (T + "test_train_faults.py::test_sigterm_and_ctrl_c_checkpoint_the_current_step[15-75-SIGTERM/preemption]",)),
    Mutant("cli_error_traceback", "hourglass_jax/cli/main.py",
           "except (ValueError, TrainError, OSError) as error:", "except (TrainError, OSError) as error:",
           "a bad setting (ValueError) ends hourglass-train in a traceback instead of one `error:` line",
           (T + "test_main.py::test_a_workdir_that_cannot_be_a_folder_ends_in_one_line",
            T + "test_train_errors.py::test_out_of_range_settings_end_the_command_before_compiling")),
    Mutant("eval_weights_ignored", "hourglass_jax/train/compiled/trainer.py",
           "loss_sum=(losses_BxL * weights_BxL).sum()", "loss_sum=losses_BxL.sum()",
           "evaluation sums every prediction's loss, also those its window weights exclude (overlaps, padding)",
           (T + "test_data_eval.py::test_evaluate_scores_the_whole_split_once_under_each_protocol",)),
    Mutant("top_k_drops_kth", "hourglass_jax/model/decode/filters.py",
           "jnp.where(logits_BxV < kth_Bx1,", "jnp.where(logits_BxV <= kth_Bx1,",
           "the top-k filter also drops the k-th largest logit (keeps k-1 tokens)",
           (T + "test_decode.py::test_top_k_and_top_p_allow_exactly_the_right_tokens",)),
    Mutant("coarse_tokens_all_rows", "hourglass_jax/model/kv_cache.py",
           "any_new = True if length >= k else jnp.any(", "any_new = True if length >= k else jnp.all(",
           "rows at their own positions run a shortened level only when every row completes a token, not any",
           (T + "test_decode.py::test_hourglass_decoding_matches_forward",)),
    Mutant("greedy_accepts_every_proposal", "hourglass_jax/model/decode/speculative.py",
           "jnp.cumprod(draft_BxK == best_BxK[:, :num], axis=1)", "jnp.cumprod(draft_BxK == draft_BxK, axis=1)",
           "greedy speculation keeps every proposal, right or wrong",
           (T + "test_speculative.py::test_the_self_draft_keeps_only_right_proposals_and_gives_plain_greedy_tokens",)),
    Mutant("self_draft_unfiltered_probabilities", "hourglass_jax/model/decode/drafts/heads.py",
           "probs.append(probs_BxV)", "probs.append(jax.nn.softmax(logits_BxV))",
           "the self-draft samples from its filtered distribution but reports the unfiltered one as q to p/q",
           (T + "test_speculative.py::test_speculative_samples_follow_the_target_distribution[self-filters2]",)),
    Mutant("eval_window_first_bytes", "hourglass_jax/data/batches/eval_windows.py",
           "weights[0 if index == 0 else self.context:", "weights[self.context:",
           "the first evaluation window skips its context bytes too, so they are never scored",
           (T + "test_data_eval.py::test_every_byte_but_the_first_is_scored_exactly_once",)),
]


def scratch_copy(repo: pathlib.Path) -> pathlib.Path:
  """A temp dir holding the files `git ls-files` lists in `repo` (as they are in its work tree)."""
  names = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], check=True, capture_output=True,
                         text=True).stdout.split("\0")
  root = pathlib.Path(tempfile.mkdtemp(prefix="mutation_"))
  for name in filter(None, names):
    source = repo / name
    if not source.exists() and not source.is_symlink():
      continue  # deleted in the work tree
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink():
      target.symlink_to(os.readlink(source))
    elif source.is_file():
      shutil.copy2(source, target)
  return root


def stale_reason(repo: pathlib.Path, m: Mutant) -> str | None:
  path = repo / m.path
  if not path.is_file():
    return f"stale: {m.path} not found"
  count = path.read_text().count(m.original)
  return None if count == 1 else ("stale: text not found" if count == 0 else f"stale: text occurs {count} times")


def pytest(root: pathlib.Path, targets, timeout: float, stop_first: bool = True) -> tuple[int | None, str]:
  """(exit code or None on timeout, output) of pytest on `targets` in `root`, in its own process group."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.environ.get(
      "JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(tempfile.gettempdir()) / "hourglass_mutation_jax_cache")))
  command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(["-x"] if stop_first else []),
             *targets]
  process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
  try:
    output = process.communicate(timeout=timeout)[0]
    return process.returncode, output
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    return None, process.communicate()[0]


def failed_tests(output: str) -> list[str]:
  return re.findall(r"^FAILED (tests/.+?)(?: - .*)?$", output, flags=re.M)


def run_mutant(repo: pathlib.Path, m: Mutant, full: bool, timeout: float) -> dict:
  result = dict(name=m.name, file=m.path, bug=m.bug, targets=list(m.targets))
  reason = stale_reason(repo, m)
  if reason:
    return dict(result, status=reason, caught_by=None, seconds=0.0)
  root = scratch_copy(repo)
  started = time.time()
  try:
    path = root / m.path
    path.write_text(path.read_text().replace(m.original, m.replacement))
    code, output = pytest(root, ["tests"] if full else m.targets, timeout)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  failed = failed_tests(output)
  if code is None:
    status = "survived: timeout"
  elif code == 1 and failed:
    status = "caught"
  elif code == 0:
    status = "survived"
  else:
    status = f"survived: pytest exit {code}"
  tail = "" if status == "caught" else output[-3000:]
  return dict(result, status=status, caught_by=failed[0] if status == "caught" else None,
              seconds=round(time.time() - started, 1), output_tail=tail)


def check_clean(repo: pathlib.Path, mutants, timeout: float) -> bool:
  """Runs every selected mutant's targets once on an unmutated copy: they must all pass."""
  targets = list(dict.fromkeys(t for m in mutants for t in m.targets))
  root = scratch_copy(repo)
  started = time.time()
  try:
    code, output = pytest(root, targets, timeout, stop_first=False)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  print(f"clean run of {len(targets)} targets: pytest exit {code} in {time.time() - started:.0f} s", flush=True)
  if code != 0:
    print(output[-5000:])
  return code == 0


def table(results) -> str:
  rows = ["| mutant | bug | seconds | caught by |", "|---|---|---:|---|"]
  for r in results:
    caught = f"`{r['caught_by']}`" if r["caught_by"] else f"**{r['status'].upper()}**"
    rows.append(f"| {r['name']} | {r['bug']} | {r['seconds']:.0f} | {caught} |")
  return "\n".join(rows)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repo", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1],
                      help="the checkout to copy (default: the one this script lives in)")
  parser.add_argument("--only", help="comma-separated mutant names")
  parser.add_argument("--json", type=pathlib.Path, help="write the results here")
  parser.add_argument("--list", action="store_true", help="list the mutants and exit")
  parser.add_argument("--full", action="store_true", help="run the whole suite for each mutant")
  parser.add_argument("--check-clean", action="store_true",
                      help="first run the selected mutants' targets on an unmutated copy; they must pass")
  parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)")
  args = parser.parse_args()
  repo = args.repo.resolve()
  mutants = MUTANTS
  if args.only:
    wanted = args.only.split(",")
    unknown = sorted(set(wanted) - {m.name for m in MUTANTS})
    if unknown:
      parser.error(f"unknown mutant(s) {', '.join(unknown)}; see --list")
    mutants = [m for m in MUTANTS if m.name in wanted]
  if args.list:
    for m in mutants:
      print(f"{m.name:32} {m.path}: {m.bug}\n{'':32} targets: {' '.join(m.targets)}")
    return 0
  if args.check_clean and not check_clean(repo, mutants, args.timeout):
    return 1
  results = []
  for i, m in enumerate(mutants, 1):
    print(f"[{i}/{len(mutants)}] {m.name} ...", end=" ", flush=True)
    r = run_mutant(repo, m, args.full, args.timeout)
    results.append(r)
    print(f"{r['seconds']:.0f} s, {r['caught_by'] or r['status']}", flush=True)
    if r.get("output_tail") and not r["status"].startswith("stale"):
      print(r["output_tail"])
  print("\n" + table(results))
  if args.json:
    args.json.write_text(json.dumps(results, indent=2) + "\n")
  bad = [r["name"] for r in results if r["status"] != "caught"]
  if bad:
    print(f"\nsurvived or stale: {', '.join(bad)}")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
