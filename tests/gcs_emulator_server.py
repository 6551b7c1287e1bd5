"""gcp-storage-emulator as the bucket tests start it: python tests/gcs_emulator_server.py start ...

One gap of the emulator is filled first. Cloud Storage answers a download with the object's
generation in the x-goog-generation header, and tensorstore (Orbax's array writer) reads it to
make its next write conditional; the emulator sends no such header, so tensorstore refuses the
read ("Malformed StorageGeneration"). The wrapper below adds it, from the object's record.
"""

import sys

from gcp_storage_emulator.handlers import objects


def _download_with_generation(request, response, storage, *args, **kwargs):
    _download(request, response, storage, *args, **kwargs)
    try:
        record = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # noqa: BLE001  (not found: the emulator has answered 404 already)
        return
    response["x-goog-generation"] = str(record.get("generation") or "1")
    response["x-goog-metageneration"] = str(record.get("metageneration") or "1")


_download, objects.download = objects.download, _download_with_generation

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main  # its routes bind objects.download now
    main(sys.argv[1:])
