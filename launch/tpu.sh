#!/usr/bin/env bash
# Cloud TPU VMs and pod slices: create one (directly or as a queued resource), install this project on every
# worker, train on all workers with the workdir on GCS, follow or collect the logs, relaunch a preempted spot slice
# (training resumes from the newest checkpoint in the workdir), delete it. Run with --help.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
# shellcheck source=launch/common.sh
source "$HERE/common.sh"

usage() {
  cat <<'EOF'
usage: launch/tpu.sh COMMAND [flags] [-- hourglass-train flags]

commands
  create     create the TPU VM / pod slice (with --queued: a queued resource, waiting until it is ACTIVE)
  install    copy this checkout to every worker and install it (.[tpu,gcs]) into ~/hourglass_jax/.venv
  train      start hourglass-train on all workers (detached; --attach streams the output instead)
  logs       follow worker --worker's log (~/hourglass_train.log)
  collect    copy every worker's log to WORKDIR/logs/
  stop       SIGTERM the trainer on all workers (it saves a checkpoint, then exits)
  status     print the slice's state
  delete     delete the slice (and its queued resource)
  up         create + install + train
  relaunch   delete + up: for a preempted spot slice; training resumes from the newest checkpoint
  watch      poll every --interval seconds; relaunch when preempted, stop when training has finished

flags (each also read from the environment variable in brackets)
  --project=ID           GCP project [HOURGLASS_PROJECT] (required)
  --zone=ZONE            e.g. us-central2-b (v4), us-west4-a (v5e) [HOURGLASS_ZONE] (required)
  --accelerator=TYPE     v4-8, v4-32, v5litepod-8, v5litepod-16, v5p-8, v6e-8, ... [HOURGLASS_ACCELERATOR]
                         (required by create / up / relaunch)
  --name=NAME            TPU (and queued resource) name [HOURGLASS_TPU_NAME] (default hourglass-$USER)
  --runtime-version=V    TPU software version [HOURGLASS_RUNTIME_VERSION] (default: by accelerator family)
  --spot | --preemptible spot / preemptible capacity [HOURGLASS_PROVISIONING=spot|preemptible|standard]
  --queued               use a queued resource [HOURGLASS_QUEUED=1]
  --config=FILE[:PRESET] config, relative to the repo [HOURGLASS_CONFIG] (required by train)
  --workdir=gs://B/DIR   checkpoints + TensorBoard on GCS [HOURGLASS_WORKDIR] (required by train, collect)
  --data-dir=gs://B/DIR  TFDS data_dir with the prepared datasets [HOURGLASS_DATA_DIR] (optional); `train`
                         first copies it to each worker's ~/hourglass_data (array_record reads local files)
  --worker=N             worker whose log `logs` follows [HOURGLASS_WORKER] (default 0)
  --interval=SECONDS     `watch` poll interval (default 300)
  --attach               `train` in the foreground, streaming every worker's output
  --dry-run              print the exact commands instead of running them [HOURGLASS_DRY_RUN=1]

example
  launch/tpu.sh up --project=my-proj --zone=us-central2-b --accelerator=v4-32 --spot \
    --config=configs/enwik8.py:pod --workdir=gs://my-bucket/runs/enwik8 --data-dir=gs://my-bucket/tfds
EOF
}

PROJECT="${HOURGLASS_PROJECT:-}"
ZONE="${HOURGLASS_ZONE:-}"
ACCELERATOR="${HOURGLASS_ACCELERATOR:-}"
NAME="${HOURGLASS_TPU_NAME:-hourglass-${USER:-tpu}}"
RUNTIME="${HOURGLASS_RUNTIME_VERSION:-}"
PROVISIONING="${HOURGLASS_PROVISIONING:-standard}"
QUEUED="${HOURGLASS_QUEUED:-0}"
CONFIG="${HOURGLASS_CONFIG:-}"
WORKDIR="${HOURGLASS_WORKDIR:-}"
DATA_DIR="${HOURGLASS_DATA_DIR:-}"
WORKER="${HOURGLASS_WORKER:-0}"
INTERVAL=300
ATTACH=0
REMOTE_DIR=hourglass_jax
# Paths on the workers, expanded there (~ by the worker's shell at a word's start, else by hourglass-train).
# shellcheck disable=SC2088
LOCAL_DATA_DIR='~/hourglass_data'
# shellcheck disable=SC2016
LOG='$HOME/hourglass_train.log' PID_FILE='$HOME/hourglass_train.pid' STATUS_FILE='$HOME/hourglass_train.status'
# shellcheck disable=SC2016
STOPPED_FILE='$HOME/hourglass_train.stopped'  # `stop` was asked for: `watch` must not restart the run
# hourglass-train's exit code after saving a checkpoint on SIGTERM / a preemption notice (resume by rerunning it)
EXIT_PREEMPTED=75

TRAIN_ARGS=()

[[ $# -gt 0 ]] || { usage >&2; exit 2; }
COMMAND="$1"
shift
case "$COMMAND" in
  -h|--help|help) usage; exit 0 ;;
  create|install|train|logs|collect|stop|status|delete|up|relaunch|watch) ;;
  *) die "unknown command '$COMMAND'; choose create, install, train, logs, collect, stop, status, delete, up, \
relaunch or watch (see --help)" ;;
esac
while [[ $# -gt 0 ]]; do
  case "$1" in
    --project=*) PROJECT="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --accelerator=*) ACCELERATOR="${1#*=}" ;;
    --name=*) NAME="${1#*=}" ;;
    --runtime-version=*) RUNTIME="${1#*=}" ;;
    --spot) PROVISIONING=spot ;;
    --preemptible) PROVISIONING=preemptible ;;
    --queued) QUEUED=1 ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --data-dir=*) DATA_DIR="${1#*=}" ;;
    --worker=*) WORKER="${1#*=}" ;;
    --interval=*) INTERVAL="${1#*=}" ;;
    --attach) ATTACH=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) unknown_argument "$1" ;;
  esac
  shift
done

# --- settings, checked before anything runs ---------------------------------------------------------------------

require "$PROJECT" "--project / HOURGLASS_PROJECT" "the GCP project that owns the TPU (gcloud config get-value project)"
require "$ZONE" "--zone / HOURGLASS_ZONE" "a zone with capacity for the accelerator, e.g. us-central2-b for v4"
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
  || die "--name=$NAME: TPU names are lowercase letters, digits and dashes, starting with a letter"
case "$PROVISIONING" in
  standard|spot|preemptible) ;;
  *) die "HOURGLASS_PROVISIONING=$PROVISIONING; choose standard, spot or preemptible" ;;
esac
[[ "$QUEUED" == 1 && "$PROVISIONING" == preemptible ]] \
  && die "queued resources offer --spot, not --preemptible; use --spot with --queued"
[[ "$WORKER" =~ ^[0-9]+$ ]] || die "--worker=$WORKER must be a worker index (0, 1, ...)"
[[ "$INTERVAL" =~ ^[0-9]+$ ]] || die "--interval=$INTERVAL must be a number of seconds"

needs_accelerator() {
  require "$ACCELERATOR" "--accelerator / HOURGLASS_ACCELERATOR" "the slice type, e.g. v4-8, v4-32, v5litepod-16, v6e-8"
  [[ "$ACCELERATOR" =~ ^v[0-9]+[a-z]*-[0-9]+$ ]] \
    || die "--accelerator=$ACCELERATOR is not a TPU type; use e.g. v4-8, v4-32, v5litepod-16, v5p-8, v6e-8"
  if [[ -z "$RUNTIME" ]]; then
    case "$ACCELERATOR" in
      v4-*) RUNTIME=tpu-ubuntu2204-base ;;
      v5litepod-*|v5e-*) RUNTIME=v2-alpha-tpuv5-lite ;;
      v5p-*) RUNTIME=v2-alpha-tpuv5 ;;
      v6e-*) RUNTIME=v2-alpha-tpuv6e ;;
      *) die "no default runtime version for $ACCELERATOR; pass --runtime-version (see gcloud compute tpus \
versions list --zone=$ZONE)" ;;
    esac
  fi
}

needs_workdir() {
  require "$WORKDIR" "--workdir / HOURGLASS_WORKDIR" \
    "a gs:// directory for checkpoints and logs, e.g. gs://my-bucket/runs/enwik8"
  [[ "$WORKDIR" == gs://?* ]] || die "--workdir=$WORKDIR must be on GCS (gs://bucket/path): every worker writes its \
shards of each checkpoint there, and a spot slice's local disks vanish when it is preempted"
}

needs_training() {
  needs_workdir
  require "$CONFIG" "--config / HOURGLASS_CONFIG" "a config file relative to the repo, e.g. configs/enwik8.py:pod"
  [[ -f "$REPO/${CONFIG%%:*}" ]] || die "--config=$CONFIG: no file ${CONFIG%%:*} in $REPO"
  [[ -z "$DATA_DIR" || "$DATA_DIR" == gs://?* ]] \
    || die "--data-dir=$DATA_DIR must be on GCS (gs://bucket/path) so every worker reads the same prepared data"
}

GCLOUD_SCOPE=("--project=$PROJECT" "--zone=$ZONE")

ssh_workers() {  # ssh_workers WORKER|all REMOTE_COMMAND
  run gcloud compute tpus tpu-vm ssh "$NAME" "${GCLOUD_SCOPE[@]}" "--worker=$1" "--command=$2"
}

# --- commands -----------------------------------------------------------------------------------------------------

do_create() {
  needs_accelerator
  local capacity=()
  [[ "$PROVISIONING" == standard ]] || capacity=("--$PROVISIONING")
  if [[ "$QUEUED" == 1 ]]; then
    run gcloud compute tpus queued-resources create "$NAME" "--node-id=$NAME" "${GCLOUD_SCOPE[@]}" \
      "--accelerator-type=$ACCELERATOR" "--runtime-version=$RUNTIME" ${capacity[@]+"${capacity[@]}"}
    wait_active
  else
    run gcloud compute tpus tpu-vm create "$NAME" "${GCLOUD_SCOPE[@]}" "--accelerator-type=$ACCELERATOR" \
      "--version=$RUNTIME" ${capacity[@]+"${capacity[@]}"}
  fi
}

state() {
  local format=value\(state\) kind=tpu-vm
  [[ "$QUEUED" == 1 ]] && format=value\(state.state\) kind=queued-resources
  run gcloud compute tpus "$kind" describe "$NAME" "${GCLOUD_SCOPE[@]}" "--format=$format"
}

wait_active() {
  if [[ "$DRY_RUN" == 1 ]]; then
    state
    echo "# (repeated every 60 s until the state is ACTIVE)"
    return
  fi
  local now
  while true; do
    now="$(state 2>/dev/null || echo MISSING)"
    case "$now" in
      ACTIVE) return ;;
      FAILED|SUSPENDED|MISSING) die "queued resource $NAME is $now; see gcloud compute tpus queued-resources \
describe $NAME --project=$PROJECT --zone=$ZONE" ;;
    esac
    echo "queued resource $NAME: $now; waiting" >&2
    sleep 60
  done
}

do_install() {
  local tarball
  tarball="${TMPDIR:-/tmp}/hourglass_jax-$NAME.tar.gz"
  run tar -czf "$tarball" -C "$REPO" --exclude=./.venv --exclude=./.git --exclude=./workdirs \
    --exclude=./.pytest_cache --exclude=__pycache__ --exclude='*.egg-info' .
  run gcloud compute tpus tpu-vm scp "$tarball" "$NAME:hourglass_jax.tar.gz" "${GCLOUD_SCOPE[@]}" --worker=all
  ssh_workers all "mkdir -p $REMOTE_DIR && tar -xzf hourglass_jax.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR && \
bash launch/remote_setup.sh tpu"
}

train_command() {  # one command group, so a redirection after it takes every step's output
  local args=(.venv/bin/hourglass-train "--config=$CONFIG" "--workdir=$WORKDIR" --distributed=on) copy=""
  if [[ -n "$DATA_DIR" ]]; then
    # The array_record reader opens local files only: each worker syncs the bucket's datasets to its own disk.
    copy="mkdir -p $LOCAL_DATA_DIR && gcloud storage rsync --recursive $(quote "$DATA_DIR") $LOCAL_DATA_DIR && "
    args+=("--config.data.data_dir=$LOCAL_DATA_DIR")
  fi
  args+=(${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"})
  # The persistent compilation cache on GCS makes a relaunched slice skip recompiling the same program.
  printf '{ %sJAX_COMPILATION_CACHE_DIR=%s %s; }' "$copy" "$(quote "$WORKDIR/jax_cache")" \
    "$(join_quoted "${args[@]}")"
}

do_train() {
  needs_training
  local train
  train="$(train_command)"
  if [[ "$ATTACH" == 1 ]]; then
    ssh_workers all "cd $REMOTE_DIR && $train 2>&1 | tee $LOG"  # $train is one { ...; } group
  else
    # Detached from the ssh session (which may drop); the exit status lands in $STATUS_FILE for `watch`.
    local script="$train > $LOG 2>&1; echo \$? > $STATUS_FILE"
    ssh_workers all "cd $REMOTE_DIR && rm -f $STATUS_FILE $STOPPED_FILE && setsid nohup bash -c $(quote "$script") \
> /dev/null 2>&1 < /dev/null & echo \$! > $PID_FILE"
    [[ "$DRY_RUN" == 1 ]] || echo "training started on every worker of $NAME; follow it with: launch/tpu.sh logs \
--name=$NAME --project=$PROJECT --zone=$ZONE" >&2
  fi
}

do_delete() {
  if [[ "$QUEUED" == 1 ]]; then
    run gcloud compute tpus queued-resources delete "$NAME" "${GCLOUD_SCOPE[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$NAME" "${GCLOUD_SCOPE[@]}" --quiet
  fi
}

do_up() {
  needs_accelerator
  needs_training
  do_create
  do_install
  do_train
}

do_relaunch() {
  needs_accelerator
  needs_training
  do_delete || echo "(nothing to delete)" >&2
  do_up
}

finished_check() {  # prints worker 0's last exit status ('running' while it runs), then 'stopped' if `stop` ran
  ssh_workers 0 "cat $STATUS_FILE 2>/dev/null || echo running; [[ -e $STOPPED_FILE ]] && echo stopped || true"
}

do_watch() {
  needs_accelerator
  needs_training
  if [[ "$DRY_RUN" == 1 ]]; then
    state
    echo "# when the state is PREEMPTED, TERMINATED, SUSPENDED or FAILED (or the slice is gone): relaunch"
    do_relaunch
    echo "# when it is READY / ACTIVE: stop watching once worker 0's run exited 0 (finished) or was stopped; on exit \
$EXIT_PREEMPTED (checkpoint saved on SIGTERM, e.g. a maintenance event) train again"
    finished_check
    echo "# then sleep $INTERVAL s and poll again"
    return
  fi
  local now result
  while true; do
    now="$(state 2>/dev/null || echo MISSING)"
    case "$now" in
      PREEMPTED|TERMINATED|SUSPENDED|FAILED|MISSING)
        echo "$NAME is $now: relaunching; training resumes from the newest checkpoint in $WORKDIR" >&2
        do_relaunch ;;
      READY|ACTIVE)
        result="$(finished_check 2>/dev/null || true)"
        case "$(echo "$result" | tr '\n' ' ')" in
          "0 "*)
            echo "training on $NAME has finished; delete the slice with: launch/tpu.sh delete --name=$NAME \
--project=$PROJECT --zone=$ZONE" >&2
            return 0 ;;
          *stopped*)
            echo "training on $NAME was stopped with launch/tpu.sh stop; not restarting it" >&2
            return 0 ;;
          "$EXIT_PREEMPTED "*)
            echo "training on $NAME saved a checkpoint on SIGTERM and exited $EXIT_PREEMPTED; training again" >&2
            do_train ;;
          "running "*|"") ;;
          *)
            echo "error: training on $NAME failed (exit status ${result%%[[:space:]]*}); see launch/tpu.sh logs \
--name=$NAME --project=$PROJECT --zone=$ZONE" >&2
            return 1 ;;
        esac ;;
    esac
    sleep "$INTERVAL"
  done
}

case "$COMMAND" in
  create) do_create ;;
  install) do_install ;;
  train) do_train ;;
  logs) ssh_workers "$WORKER" "tail -n 200 -F $LOG" ;;
  collect)
    needs_workdir
    ssh_workers all "gcloud storage cp $LOG $(quote "$WORKDIR")/logs/\$(hostname).log" ;;
  stop) ssh_workers all "touch $STOPPED_FILE && kill -TERM -- -\$(cat $PID_FILE)" ;;  # the trainer's process group
  status) state ;;
  delete) do_delete ;;
  up) do_up ;;
  relaunch) do_relaunch ;;
  watch) do_watch ;;
esac
