"""gcp-storage-emulator as the bucket tests start it: python tests/support/gcs_emulator_server.py start ...

One gap of the emulator is filled first, and one fault can be switched on. Cloud Storage answers a download with the object's
generation in the x-goog-generation header, and tensorstore (Orbax's array writer) reads it to
make its next write conditional; the emulator sends no such header, so tensorstore refuses the
read ("Malformed StorageGeneration"). The wrapper below adds it, from the object's record.

The fault: with GCS_EMULATOR_HOLD_COMMITS set to a path, every upload of a commit marker
(`.../commit_success.txt`, what Orbax writes last in a save) is answered 503 while that path
exists, so a save begins, writes its arrays and cannot finish: a trainer killed then has been
killed during that save, whatever the timing.
"""

import os
import sys
from http import HTTPStatus

from gcp_storage_emulator import storage as storage_lib
from gcp_storage_emulator.handlers import objects

HOLD_COMMITS = os.environ.get("GCS_EMULATOR_HOLD_COMMITS")


class _Held(Exception):
    pass


def _download_with_generation(request, response, storage, *args, **kwargs):
    _download(request, response, storage, *args, **kwargs)
    try:
        record = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # noqa: BLE001  (not found: the emulator has answered 404 already)
        return
    response["x-goog-generation"] = str(record.get("generation") or "1")
    response["x-goog-metageneration"] = str(record.get("metageneration") or "1")


def _create_file_unless_held(self, bucket_name, file_name, *args, **kwargs):
    if HOLD_COMMITS and file_name.endswith("commit_success.txt") and os.path.exists(HOLD_COMMITS):
        raise _Held(file_name)
    return _create_file(self, bucket_name, file_name, *args, **kwargs)


def _answering_held(handler):
    def handle(request, response, storage, *args, **kwargs):
        try:
            return handler(request, response, storage, *args, **kwargs)
        except _Held:
            response.status = HTTPStatus.SERVICE_UNAVAILABLE
    return handle


_download, objects.download = objects.download, _download_with_generation
_create_file = storage_lib.Storage.create_file
storage_lib.Storage.create_file = _create_file_unless_held
objects.insert = _answering_held(objects.insert)
objects.upload_partial = _answering_held(objects.upload_partial)

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main  # its routes bind objects.download now
    main(sys.argv[1:])
