"""A local Google Cloud Storage for tests: gcp-storage-emulator, patched where tensorstore (Orbax's array writer)
relies on GCS behaviour the emulator lacks. Not a test module; tests/test_gcs_workdir.py runs it as

  python -m tests.gcs_emulator PORT BUCKET

and points the clients at it with `client_environment(port)`. The patches:
1. objects.list honours startOffset / endOffset; unpatched, tensorstore's range delete (list a key range, delete
   what is listed) deletes every object in the bucket;
2. media downloads carry the x-goog-generation header; unpatched, tensorstore reads generation 0 and its next
   conditional write of a checkpoint's manifest fails ("Malformed StorageGeneration");
3. objects.moveTo exists (gcsfs tries it first for each renamed object; unpatched, a 501 it retries with backoff).
"""

import sys
from http import HTTPStatus


def client_environment(port: int) -> dict[str, str]:
  """Environment variables that send gcsfs, google-cloud-storage and tensorstore to the emulator, no credentials."""
  url = f"http://127.0.0.1:{port}"
  return dict(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url, FSSPEC_GCS_TOKEN="anon",
              GOOGLE_CLOUD_PROJECT="test", GOOGLE_AUTH_TOKEN_FOR_TESTING="fake",
              GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")  # else gcsfs probes the bucket over gRPC, 60 s per call


def _patch_and_serve(port: int, bucket: str) -> None:
  from gcp_storage_emulator.exceptions import NotFound
  from gcp_storage_emulator.handlers import objects  # patched before server.py builds its routing table

  def query(request, name):
    return (request.query.get(name) or [None])[0]

  list_objects, get_object, download_object = objects.ls, objects.get, objects.download

  def ls(request, response, storage, *args, **kwargs):
    start, end = query(request, "startOffset"), query(request, "endOffset")
    if start or end:
      write_json = response.json

      def in_range(name):
        return (not start or name >= start) and (not end or name < end)

      response.json = lambda body: write_json(dict(body, items=[i for i in body.get("items", [])
                                                                if in_range(i["name"])],
                                                   prefixes=[p for p in body.get("prefixes", []) if in_range(p)]))
    return list_objects(request, response, storage, *args, **kwargs)

  def download(request, response, storage, *args, **kwargs):
    try:
      found = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
      response["x-goog-generation"] = str(found["generation"])
      response["x-goog-metageneration"] = str(found.get("metageneration", "1"))
    except NotFound:
      pass  # the handler answers 404
    return download_object(request, response, storage, *args, **kwargs)

  def get(request, response, storage, *args, **kwargs):
    if query(request, "alt") == "media":
      return download(request, response, storage)
    return get_object(request, response, storage, *args, **kwargs)

  def move(request, response, storage, *_):
    name, source, target = (request.params[k] for k in ("bucket_name", "object_id", "dest_object_id"))
    try:
      response.json(objects._copy(request.base_url, storage, name, source, name, target))  # pylint: disable=protected-access
    except NotFound:
      response.status = HTTPStatus.NOT_FOUND
      return
    objects._delete(storage, name, source)  # pylint: disable=protected-access

  objects.ls, objects.get, objects.download = ls, get, download
  from gcp_storage_emulator import server, settings

  move_route = (rf"^{settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
                r"(?P<dest_object_id>.*[^/]+)$", {"POST": move})
  server.HANDLERS = (move_route,) + tuple(server.HANDLERS)
  server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
  _patch_and_serve(int(sys.argv[1]), sys.argv[2])
