"""A gs:// workdir end to end, against a local GCS emulator (tests/gcs_emulator.py): hourglass-train writes its
checkpoints and TensorBoard events to the bucket, resumes from it past a damaged checkpoint (moved aside within the
bucket), and hourglass-eval reads it back. pathlib would have turned gs://bucket/run into a local gs:/bucket/run."""

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.gcs_emulator import client_environment
from tests.helpers import command_env, free_port, train_command

pytest.importorskip("gcp_storage_emulator", reason="the [test] extra installs the GCS emulator")
pytest.importorskip("gcsfs", reason="the [test] extra installs gcsfs")

pytestmark = pytest.mark.slow  # one jax process at a time (and the emulator): slow, not multiprocess

BUCKET = "bucket"


@pytest.fixture
def emulator(tmp_path_factory):
  port, log = free_port(), tmp_path_factory.mktemp("emulator") / "requests.log"
  with open(log, "w") as stderr:  # a file, not a pipe: the server logs every request and would block on a full pipe
    server = subprocess.Popen([sys.executable, "-m", "tests.gcs_emulator", str(port), BUCKET],
                              stdout=subprocess.DEVNULL, stderr=stderr, env=command_env())
  deadline = time.monotonic() + 60
  while True:
    try:
      urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b/{BUCKET}", timeout=2).close()
      break
    except OSError:
      if server.poll() is not None or time.monotonic() > deadline:
        server.kill()
        server.wait()
        pytest.fail(f"the GCS emulator did not start: {log.read_text()[-2000:]}")
      time.sleep(0.1)
  try:
    yield port
  finally:
    server.kill()
    server.wait()


def _bucket(port: int):
  from google.auth.credentials import AnonymousCredentials
  from google.cloud import storage

  client = storage.Client(project="test", credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": f"http://127.0.0.1:{port}"})
  return client.bucket(BUCKET)


def _run(port: int, cwd, *flags: str, entry: str = "train_entry") -> str:
  env = dict(command_env(), **client_environment(port))
  command = train_command(f"gs://{BUCKET}/run", *flags, entry=entry)
  # A stuck client prints where every thread is before the test gives up on it.
  command[2] = f"import faulthandler; faulthandler.dump_traceback_later(360, exit=True); {command[2]}"
  done = subprocess.run(command, capture_output=True, text=True, timeout=420, env=env, cwd=cwd)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  return done.stdout


def test_train_resume_and_evaluate_with_a_gcs_workdir(emulator, tmp_path):
  bucket = _bucket(emulator)
  _run(emulator, tmp_path, "--config.train.steps=4", "--config.checkpoint.every_steps=2")
  names = [blob.name for blob in bucket.list_blobs(prefix="run/")]
  assert {n.split("/")[2] for n in names if n.startswith("run/checkpoints/")} == {"2", "4"}
  assert any(re.fullmatch(r"run/events\.out\.tfevents\..+", n) for n in names)
  assert not list(tmp_path.iterdir())  # nothing written locally (pathlib would have made gs:/bucket/run here)

  for blob in bucket.list_blobs(prefix="run/checkpoints/4/state/"):  # damage checkpoint 4: its array data
    if "/d/" in blob.name:
      blob.delete()
  out = _run(emulator, tmp_path, "--config.train.steps=6", "--config.checkpoint.every_steps=2")
  assert "checkpoint step 4 under gs://bucket/run/checkpoints is unreadable" in out
  assert "resuming from step 2" in out
  names = [blob.name for blob in bucket.list_blobs(prefix="run/")]
  assert {n.split("/")[2] for n in names if n.startswith("run/checkpoints/")} == {"4", "6"}  # 4 retrained; keep=2
  assert any(re.match(r"run/checkpoints_unreadable/4-\d+/", n) for n in names)
  # metrics.jsonl, rewritten whole in a bucket: steps 2 and 4 of the first run, then 4 and 6 from step 2 on.
  steps = [json.loads(line)["step"] for line in bucket.blob("run/metrics.jsonl").download_as_text().splitlines()]
  assert steps == [2, 4, 6, 6], steps  # the last: step 6's evaluation

  out = _run(emulator, tmp_path, entry="eval_entry")
  assert re.search(r"step 6: valid bits/byte [0-9.]+", out), out
